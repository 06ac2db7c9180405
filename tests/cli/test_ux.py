"""Issue 23: a cache manager people trust at a glance - no deletes on a slip, honest statuses and
footers, Ctrl-C that exits 130. Real processes on real trees."""

from __future__ import annotations

import json
import os
import tarfile
import time

import pytest

from tests.synthetic import DEFAULT_METADATA, default_fields, entry_path, write_fake_entry

from ..conftest import run_cli, run_json

#: Every command that takes a duration (the shared filter options).
DURATION_COMMANDS = [["ls"], ["prune", "--dry-run"], ["export", "-o", "-"], ["push", "file:///nonexistent-store"]]


@pytest.mark.parametrize("cmd", DURATION_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("option", ["--older-than", "--unused-for"])
def test_a_bare_number_is_a_usage_error_suggesting_days(root, cmd, option):
    """`--older-than 30` read as 30 seconds would select every entry for deletion."""
    write_fake_entry(root)
    proc = run_cli(*cmd, option, "30", "--cache-dir", str(root))
    assert proc.returncode == 2, proc.stderr
    assert "no unit" in proc.stderr and "30d" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("text", ["2y", "1mo", "3 months"])
def test_an_unknown_unit_names_the_accepted_ones(root, text):
    write_fake_entry(root)
    proc = run_cli("prune", "--older-than", text, "--dry-run", "--cache-dir", str(root))
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "unknown duration unit" in line, line
    for unit in ("s (seconds)", "m (minutes)", "h (hours)", "d (days)", "w (weeks)"):
        assert unit in line


def test_durations_with_units_still_select(root):
    write_fake_entry(root)
    for text in ("30d", "12h", "90m", "45s", "2w", "1.5d"):
        proc = run_cli("ls", "-q", "--older-than", text, "--cache-dir", str(root))
        assert proc.returncode == 0, (text, proc.stderr)


# --- statuses on a guess ------------------------------------------------------------------------

def _engine_written_tp4_missing_last_rank(root):
    """What an engine leaves after a crash before rank 3 wrote its file: no manifest, tp0..2."""
    eid = write_fake_entry(root, fields=default_fields("m", tp=4, dp=1), arch="sm90", with_manifest=False)
    (entry_path(root, eid) / "rank_tp3_pp0_dp0.json").unlink()
    return eid


def test_an_inferred_topology_is_never_complete(root):
    eid = _engine_written_tp4_missing_last_rank(root)
    proc = run_cli("ls", "--cache-dir", str(root))
    row = next(line for line in proc.stdout.splitlines() if line.startswith(str(eid)))
    assert "unverified" in row and "complete" not in row, row
    assert "tp3+" in row and "3/?" in row, row
    e = run_json("ls", "--cache-dir", str(root))["entries"][0]
    assert (e["status"], e["ranks_present"], e["ranks_expected"]) == ("unverified", 3, None)
    assert run_cli("ls", "-q", "--status", "complete", "--cache-dir", str(root)).stdout == ""
    assert run_cli("ls", "-q", "--status", "unverified", "--cache-dir", str(root)).stdout.split() == [str(eid)]
    shown = run_cli("show", str(eid), "--cache-dir", str(root)).stdout
    assert "no manifest: the rank count is inferred" in shown


def test_push_and_export_do_not_publish_an_unverified_entry_as_complete(root, tmp_path):
    good = write_fake_entry(root)
    guess = _engine_written_tp4_missing_last_rank(root)
    store = f"file://{tmp_path / 'store'}"
    proc = run_cli("push", store, "--cache-dir", str(root))
    assert proc.returncode == 0 and f"skipping {guess}: unverified" in proc.stderr, proc.stderr
    assert run_cli("ls", "-q", store).stdout.split() == [str(good)]
    archive = tmp_path / "x.tgz"
    proc = run_cli("export", "-o", str(archive), "--cache-dir", str(root))
    assert proc.returncode == 0 and f"skipping {guess}: unverified" in proc.stderr, proc.stderr
    with tarfile.open(archive) as tar:
        assert not any(guess.name in m.name for m in tar.getmembers())
    # Asked for, it goes, with a warning that says what it is.
    proc = run_cli("push", store, str(guess), "--include-incomplete", "--cache-dir", str(root))
    assert proc.returncode == 0 and "unverified" in proc.stderr, proc.stderr


def test_an_unverified_entry_holding_every_rank_is_not_replaced_without_force(root, tmp_path):
    """A reader that knows the rank files (an import with a manifest) sees the engine-written entry
    is complete for it: a different one must not silently replace it."""
    src = tmp_path / "src"
    src.mkdir()
    eid = write_fake_entry(src, seed=1)
    archive = tmp_path / "x.tgz"
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(src)).returncode == 0
    assert write_fake_entry(root, seed=2, with_manifest=False) == eid
    before = {p.name: p.read_bytes() for p in entry_path(root, eid).iterdir()}
    proc = run_cli("import", str(archive), "--cache-dir", str(root))
    assert proc.returncode != 0 and "complete entry is already there" in proc.stderr, proc.stderr
    assert {p.name: p.read_bytes() for p in entry_path(root, eid).iterdir()} == before
    # One rank short: it is replaced (it was never complete).
    (entry_path(root, eid) / "rank_tp7_pp0_dp7.json").unlink()
    proc = run_cli("import", str(archive), "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert run_json("ls", "--cache-dir", str(root))["entries"][0]["status"] == "complete"


# --- --keep-latest prefers the version that will read the cache -----------------------------------

def _touch(root, eid, days_ago: float) -> None:
    t = time.time() - days_ago * 86400
    for p in entry_path(root, eid).iterdir():
        os.utime(p, (t, t))


def test_keep_latest_keeps_the_installed_version_over_a_later_touched_older_one(root):
    from importlib.metadata import version

    installed = version("flashinfer-python")
    fields = default_fields("A", tp=2, dp=1)
    here = write_fake_entry(root, fields=fields, flashinfer_version=installed)
    old = write_fake_entry(root, fields=fields, flashinfer_version="0.7.1")
    _touch(root, here, 10)
    _touch(root, old, 1)  # touched after the installed one (a copy, an rsync, a backup restore)
    # ... and over a newer release that is not the one installed (a pre-release tried once).
    fields_b = default_fields("B", tp=2, dp=1)
    here_b = write_fake_entry(root, fields=fields_b, flashinfer_version=installed)
    newer_b = write_fake_entry(root, fields=fields_b, flashinfer_version="9.0.0rc1")
    plan = run_json("prune", "--keep-latest", "1", "--dry-run", "--cache-dir", str(root))
    picked = {e["id"]: e["reasons"][-1] for e in plan["plan"]["entries"]}
    assert set(picked) == {str(old), str(newer_b)}
    assert f"kept: {here}" in picked[str(old)] and f"kept: {here_b}" in picked[str(newer_b)]


def test_keep_latest_prefers_the_env_from_version_then_the_newest(root, tmp_path):
    fields = default_fields("A", tp=2, dp=1)
    v069 = write_fake_entry(root, fields=fields, flashinfer_version="0.6.9")
    v071 = write_fake_entry(root, fields=fields, flashinfer_version="0.7.1")
    v070 = write_fake_entry(root, fields=fields, flashinfer_version="0.7.0")
    _touch(root, v071, 20)
    _touch(root, v070, 10)
    _touch(root, v069, 1)
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"fingerprint": {**DEFAULT_METADATA, "flashinfer_version": "0.7.0"}}))
    plan = run_json("prune", "--keep-latest", "1", "--env-from", str(env), "--dry-run", "--cache-dir", str(root))
    assert sorted(e["id"] for e in plan["plan"]["entries"]) == sorted([str(v069), str(v071)])
    # Without a version in use here (none of these is installed): the newest version, not the newest touch.
    plan = run_json("prune", "--keep-latest", "1", "--dry-run", "--cache-dir", str(root))
    assert sorted(e["id"] for e in plan["plan"]["entries"]) == sorted([str(v069), str(v070)])


def test_keep_latest_help_says_the_order():
    text = " ".join(run_cli("prune", "--help").stdout.split())
    assert "then the installed FlashInfer version (or --env-from's); then the newest version; then the most recently modified" in text
