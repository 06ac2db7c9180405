"""Issue 46: the library decides which cache root a command works on and plans under it - no
word printed there, no call back into the CLI. The notes come back as data (``tree/roots.py``)
or go to the output sink a ``Rooting`` names; the CLI says each once (tests/cli/test_issue45_ux.py
holds the words the user sees)."""

from __future__ import annotations

import json

import pytest

from autotune_cache.errors import RootMissing, UsageError
from autotune_cache.registry import default_layout
from autotune_cache.tree.roots import Rooting, check_root, choose_root, named_root
from autotune_cache.tune.session.fleetplan import FleetOrder, load_fleet, plan_order
from autotune_cache.tune.workers.gpus import NO_GPU, GpuInfo
from autotune_cache.tune.workers.machine import Machine

from devtools.synthetic import write_fake_entry


@pytest.fixture
def opt(tmp_path):
    """``opt/sglang-cache`` holds a tree; ``opt`` is the root one level too high."""
    top = tmp_path / "opt"
    tree = top / "sglang-cache"
    tree.mkdir(parents=True)
    write_fake_entry(tree)
    return top, tree


def test_a_root_above_a_tree_is_a_note_returned_not_printed(opt, capsys):
    top, tree = opt
    named = named_root(str(top), default_layout())
    assert named.choice.path == top and named.choice.source == "--cache-dir" and named.notes == ()
    notes = check_root(named.choice, default_layout(), given=True, must_exist=True)
    assert notes == (f"note: no cache tree at {top}; did you mean {tree}?",)
    assert capsys.readouterr() == ("", "")


def test_a_writer_above_a_tree_is_refused_unless_a_new_tree_is_meant(opt):
    top, tree = opt
    choice = named_root(str(top), default_layout()).choice
    with pytest.raises(UsageError, match=f"did you mean {tree}.*--new-tree"):
        check_root(choice, default_layout(), given=True, must_exist=False, writes=True)
    assert check_root(choice, default_layout(), given=True, must_exist=False, writes=True, new_tree=True) == ()
    # a root named as a new tree earlier in the process: nothing more is said of it
    assert check_root(choice, default_layout(), given=True, must_exist=False, new_trees={str(top)}) == ()


def test_the_tilde_warning_is_said_before_the_missing_root_is_raised(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SGLANG_CACHE_DIR", "~/no-such-cache")
    said: list[str] = []
    with pytest.raises(RootMissing, match="does not exist"):
        choose_root(None, must_exist=True, say=said.append)
    assert len(said) == 1 and said[0].startswith("warning: $SGLANG_CACHE_DIR is '~/no-such-cache'"), said


def _targets(tmp_path, **fields) -> str:
    path = tmp_path / "targets.json"
    path.write_text(json.dumps({"targets": [{"model": "nvidia/Llama-3.1-70B-Instruct-FP8", "tp": 8, **fields}]}))
    return str(path)


def test_a_fleet_is_planned_under_the_rooting_its_notes_to_its_sink(opt, tmp_path, capsys):
    top, tree = opt
    said: list[str] = []
    fleet = load_fleet(_targets(tmp_path, arch="sm90"), Rooting(str(top), say=said.append), None)
    assert fleet.errors == [] and len(fleet.members) == 1
    assert fleet.members[0].plan.key_dir.is_relative_to(top)
    assert said == [f"note: no cache tree at {top}; did you mean {tree}?"]
    assert capsys.readouterr() == ("", "")


def test_a_target_without_an_arch_takes_the_machines_and_none_is_its_own_error(tmp_path):
    targets = _targets(tmp_path)
    h200 = Machine(gpus=GpuInfo(1, "sm90", ("NVIDIA H200",)))
    items, fleet = plan_order(FleetOrder(Rooting(str(tmp_path / "root")), targets), None, h200)
    assert [i.plan.resolution.arch for i in items] == ["sm90"] and fleet is not None and fleet.errors == []
    no_gpu = Machine(gpus=NO_GPU)
    fleet = load_fleet(targets, Rooting(str(tmp_path / "root")), None, machine=no_gpu)
    assert fleet.members == [] and [e.message for e in fleet.errors] == [
        "no GPU found to take the target arch from: pass --arch sm90 or --arch sm100"]
