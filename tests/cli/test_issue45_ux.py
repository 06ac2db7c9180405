"""Issue 45: confusing and left-over items of the tree commands - a --cache-dir one level too
high, --model matched exactly, dry-run JSON shaped as the run's, convert's destination said,
transfer progress in a terminal only, and left-over log lines. Real processes on real trees."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from devtools.synthetic import default_fields, entry_path, write_fake_entry

from ..conftest import CLI_ARGV, REPO, run_cli, run_json


def ids(root) -> list[str]:
    return sorted(run_cli("ls", "-q", "--cache-dir", str(root)).stdout.splitlines())


# --- 1. a --cache-dir one level too high ----------------------------------------------------------

@pytest.fixture
def opt(tmp_path):
    """``opt/sglang-cache`` holds a tree; ``opt`` is what a user gives by mistake."""
    opt = tmp_path / "opt"
    tree = opt / "sglang-cache"
    tree.mkdir(parents=True)
    eid = write_fake_entry(tree)
    return opt, tree, eid


@pytest.mark.parametrize("cmd", [["ls"], ["ls", "--json"], ["prune", "--dry-run", "--older-than", "1d"]],
                         ids=lambda c: " ".join(c))
def test_a_root_one_level_too_high_names_the_tree_below(opt, cmd):
    top, tree, _ = opt
    proc = run_cli(*cmd, "--cache-dir", str(top))
    assert proc.returncode == 0, proc.stderr
    assert f"no cache tree at {top}; did you mean {tree}?" in proc.stderr, proc.stderr


def test_a_root_two_levels_too_high_names_the_tree_too(tmp_path):
    tree = tmp_path / "opt" / "images" / "sglang-cache"
    tree.mkdir(parents=True)
    write_fake_entry(tree)
    proc = run_cli("ls", "--cache-dir", str(tmp_path / "opt"))
    assert proc.returncode == 0, proc.stderr
    assert f"did you mean {tree}?" in proc.stderr, proc.stderr


def test_the_right_root_has_no_note(opt):
    _, tree, eid = opt
    proc = run_cli("ls", "-q", "--cache-dir", str(tree))
    assert proc.returncode == 0 and proc.stdout.split() == [str(eid)], proc.stderr
    assert "did you mean" not in proc.stderr


def _archive(tree, tmp_path) -> Path:
    out = tmp_path / "a.tgz"
    proc = run_cli("export", "-o", str(out), "--cache-dir", str(tree))
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_import_into_a_root_above_a_tree_is_refused_naming_it(opt, tmp_path, dry_run):
    top, tree, _ = opt
    archive = _archive(tree, tmp_path)
    proc = run_cli("import", str(archive), "--cache-dir", str(top), *(["--dry-run"] if dry_run else []))
    assert proc.returncode == 2, proc.stderr
    assert f"did you mean {tree}?" in proc.stderr and "--new-tree" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (top / "flashinfer").exists()


def test_import_with_new_tree_writes_a_tree_there(opt, tmp_path):
    top, tree, eid = opt
    archive = _archive(tree, tmp_path)
    proc = run_cli("import", str(archive), "--cache-dir", str(top), "--new-tree")
    assert proc.returncode == 0, proc.stderr
    assert ids(top) == [str(eid)]


def test_pull_into_a_root_above_a_tree_is_refused_naming_it(opt, tmp_path):
    top, tree, eid = opt
    store = f"file://{tmp_path / 'store'}"
    assert run_cli("push", store, "--cache-dir", str(tree)).returncode == 0
    proc = run_cli("pull", store, "--cache-dir", str(top), "--any-env")
    assert proc.returncode == 2, proc.stderr
    assert f"did you mean {tree}?" in proc.stderr and "--new-tree" in proc.stderr, proc.stderr
    assert not (top / "flashinfer").exists()
    proc = run_cli("pull", store, "--cache-dir", str(top), "--any-env", "--new-tree")
    assert proc.returncode == 0, proc.stderr
    assert ids(top) == [str(eid)]


def test_import_into_an_empty_new_root_needs_no_flag(opt, tmp_path):
    _, tree, eid = opt
    archive = _archive(tree, tmp_path)
    fresh = tmp_path / "fresh"
    proc = run_cli("import", str(archive), "--cache-dir", str(fresh))
    assert proc.returncode == 0, proc.stderr
    assert ids(fresh) == [str(eid)]


def test_pull_by_serving_flags_with_new_tree_says_nothing_more(opt, tmp_path):
    top, tree, _ = opt
    store = f"file://{tmp_path / 'store'}"
    assert run_cli("push", store, "--cache-dir", str(tree)).returncode == 0
    proc = run_cli("pull", store, "--cache-dir", str(top), "--any-env", "--new-tree", "--dry-run",
                   "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--dp", "8", "--arch", "sm100")
    assert "did you mean" not in proc.stderr, proc.stderr
