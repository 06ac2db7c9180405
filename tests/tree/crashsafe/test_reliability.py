"""Crash safety, concurrency and hostile input with real processes, real files and real kills.

Faults are injected by killing a process - at random times, or at an exact step through
tests/standins/fault_cli.py (the process SIGKILLs itself there) - never by mocking ``os``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from autotune_cache.registry import default_layout
from autotune_cache.tree.crashsafe import faults
from autotune_cache.tree.layouts.own_names import MANIFEST_NAME, STAGE_DIR_RE, TEMP_FILE_RE, TRASH_DIR_RE
from autotune_cache.tree.manifest import Manifest
from autotune_cache.autotuner.rankfile import parse_cache_bytes
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.tree.status import EntryStatus
from autotune_cache.tree.store.export import open_stream
from devtools.synthetic import DEFAULT_METADATA, cache_file_bytes, default_fields, entry_path, fake_configs, write_fake_entry

from tests.standins.fault_cli import crash_at
from tests.conftest import REPO, run_cli, run_cli_unprivileged, run_json

SG = default_layout()


def worker(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "devtools.workers", *map(str, args)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_every_cache_file_parses(root: Path) -> int:
    """Every rank file and manifest an engine or ls may read is whole, valid JSON."""
    checked = 0
    for p in SG.base(root).rglob("*.json"):
        if TEMP_FILE_RE.match(p.name) or any(STAGE_DIR_RE.match(x) or TRASH_DIR_RE.match(x) for x in p.parts) \
                or ".fi-autotune-journal" in p.parts:
            continue  # hidden names are never read by engines; prune cleans them
        data = p.read_bytes()
        if p.name == MANIFEST_NAME:
            Manifest.from_bytes(data)
        else:
            parse_cache_bytes(data)
        checked += 1
    return checked


def leftovers(root: Path) -> list[Path]:
    base = SG.base(root)
    if not base.exists():
        return []
    return [p for p in base.rglob("*") if STAGE_DIR_RE.match(p.name) or TRASH_DIR_RE.match(p.name)
            or (p.parent.name == ".fi-autotune-journal")]


def seeded_archive(tmp_path: Path, n: int, name: str = "a.tgz", buckets=(1, 2, 4, 8)) -> tuple[Path, list[str]]:
    src = tmp_path / f"src-{name}"
    eids = [write_fake_entry(src, fields=default_fields(f"org/m{i}", tp=2, dp=2), arch="sm90", seed=i,
                             buckets=buckets) for i in range(n)]
    archive = tmp_path / name
    proc = run_cli("export", "-o", str(archive), "--cache-dir", str(src))
    assert proc.returncode == 0, proc.stderr
    return archive, [str(e) for e in eids]  # eids[i] is org/m{i}


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and mtime: what a reader must leave as it found it."""
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def finish_with_a_writer(root: Path) -> None:
    """Readers never write (issue 33): a reader run over what a kill left changes nothing; the next
    writer - here a prune that selects nothing - finishes it."""
    before = tree_state(root)
    listed(root)
    assert tree_state(root) == before, "ls wrote to the tree"
    proc = run_cli("prune", "--older-than", "36500d", "-y", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr


def listed(root: Path) -> dict[str, str]:
    proc = run_cli("ls", "--json", "--cache-dir", str(root)) if root.exists() else None
    if proc is None:
        return {}
    assert proc.returncode == 0, proc.stderr
    return {e["id"]: e["status"] for e in json.loads(proc.stdout)["entries"]}


def test_eight_processes_write_prune_import_concurrently(tmp_path):
    root = tmp_path / "tree"
    src = tmp_path / "src"
    assert worker("seed", src).wait() == 0
    archive = tmp_path / "a.tar.gz"
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(src)).returncode == 0
    rounds = 30
    procs = (
        [worker("writer", root, rounds, i) for i in range(3)]
        + [worker("pruner", root, rounds * 2, i) for i in range(2)]
        + [worker("importer", root, rounds, archive, i) for i in range(3)]
    )
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    assert assert_every_cache_file_parses(root) > 0
    info = scan_cache(root)
    # Three keys were written complete by every writer and importer; pruners only remove
    # incomplete/corrupt/diverged entries: all three must have survived, complete.
    assert len(info.entries) == 3
    assert {e.status.value for e in info.entries} == {"complete"}, [(e.id, e.problems) for e in info.entries]
    assert leftovers(root) == [] and info.stale_temp == ()


@pytest.mark.slow
def test_sigkilled_writer_never_leaves_an_unparseable_file(tmp_path):
    root = tmp_path / "tree"
    rng = random.Random(7)
    kills = 20
    for i in range(kills):
        p = worker("forever", root, 0, i)
        assert p.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 120
        while i == 0 and not scan_cache(root).entries and time.monotonic() < deadline:
            time.sleep(0.02)  # the first writer commits once, however loaded the machine: later kills hit a live tree
        time.sleep(rng.uniform(0.0, 0.25))
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert_every_cache_file_parses(root)
        # Each commit is one rename (or one journaled pair): never a partial rank set.
        assert all(e.status.value == "complete" for e in scan_cache(root).entries)
    info = scan_cache(root)
    assert info.entries, "the writer never got to write anything"
    # Leftovers of the kills belong to dead owners: the next prune removes them at once.
    proc = run_cli("prune", "--status", "corrupt", "-y", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert leftovers(root) == []
    assert [e.id for e in scan_cache(root).entries] == [e.id for e in info.entries]


def test_ctrl_c_during_commit_is_deferred_until_the_entry_is_whole(tmp_path):
    """SIGINT arriving mid-commit is held: the entry lands whole, then the process stops."""
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "import autotune_cache.tree.crashsafe.txn as t\n"
        "from devtools.synthetic import write_fake_entry\n"
        "orig = t.swap_in\n"
        "def interrupted(*a):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    return orig(*a)\n"
        "t.swap_in = interrupted\n"
        "write_fake_entry(Path(sys.argv[1]), seed=1)\n"
        "print('not reached')\n"
    )
    root = tmp_path / "tree"
    proc = subprocess.run([sys.executable, "-c", code, str(root)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr and "not reached" not in proc.stdout
    (e,) = scan_cache(root).entries
    assert e.status.value == "complete" and e.manifest is not None
    assert leftovers(root) == []


# --- archives: all or nothing ------------------------------------------------------------------

def _import(archive: Path, root: Path, *extra, **kw) -> subprocess.CompletedProcess:
    return run_cli("import", str(archive), "--cache-dir", str(root), *extra, **kw)


@pytest.mark.parametrize("point,exchange,expect", [
    ("txn.staged_file:7", True, "none"),  # mid-staging: nothing is visible
    ("txn.journaled", True, "all"),  # decided: the next command finishes it
    ("txn.swapped:1", True, "all"),
    ("txn.swapped:3", True, "all"),
    ("txn.exchanged:2", True, "all"),
    ("txn.between_renames:2", False, "all"),  # filesystems without RENAME_EXCHANGE
    ("txn.unjournaled", True, "all"),
])
def test_a_killed_import_ends_all_or_nothing(tmp_path, point, exchange, expect):
    archive, eids = seeded_archive(tmp_path, 5)
    root = tmp_path / "dest"
    # older versions of two of its entries are there already: the import replaces them
    first = SG.parse_id(eids[0])
    for i in (0, 1):
        write_fake_entry(root, fields=default_fields(f"org/m{i}", tp=2, dp=2), arch="sm90", seed=99, buckets=(1, 2))
    assert sorted(listed(root)) == sorted(eids[:2])
    killed = _import(archive, root, "--force", launcher=crash_at(point, no_exchange=not exchange))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    finish_with_a_writer(root)
    after = listed(root)
    assert set(after.values()) == {"complete"}
    if expect == "none":
        assert sorted(after) == sorted(eids[:2])
        old = json.loads((entry_path(root, first) / "rank_tp0_pp0_dp0.json").read_text())
        assert len([k for k in old if not k.startswith("_")]) == 6  # still the old one (2 buckets x 3 ops)
    else:
        assert sorted(after) == sorted(eids)
        new = json.loads((entry_path(root, first) / "rank_tp0_pp0_dp0.json").read_text())
        assert len([k for k in new if not k.startswith("_")]) == 12
    assert_every_cache_file_parses(root)
    # the rerun completes (or confirms) the rest and leaves nothing behind
    again = _import(archive, root, "--force")
    assert again.returncode == 0, again.stderr
    assert sorted(listed(root)) == sorted(eids) and leftovers(root) == []


@pytest.mark.slow
def test_import_killed_at_random_times_is_all_or_nothing(tmp_path):
    archive, eids = seeded_archive(tmp_path, 30)
    rng = random.Random(11)
    outcomes = {"none": 0, "all": 0}
    for i in range(12):
        root = tmp_path / f"dest{i}"
        p = subprocess.Popen([sys.executable, "-m", "fi_autotune_cli", "import", str(archive), "--cache-dir", str(root)],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, 0.9))
        p.send_signal(signal.SIGKILL)
        p.wait()
        if root.exists():
            finish_with_a_writer(root)
        after = listed(root) if root.exists() else {}
        assert sorted(after) in ([], sorted(eids)), (i, len(after))
        outcomes["all" if after else "none"] += 1
        if root.exists():
            assert _import(archive, root).returncode == 0
            assert sorted(listed(root)) == sorted(eids) and leftovers(root) == []
    assert sum(outcomes.values()) == 12


def test_a_full_disk_imports_nothing_and_says_where(tmp_path, tmpfs):
    archive, _ = seeded_archive(tmp_path, 60, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048))
    mnt = tmpfs("600k")  # the archive needs ~1.5 MB
    root = mnt / "cache"
    proc = _import(archive, root)
    assert proc.returncode == 1, proc.stderr
    assert "No space left on device" in proc.stderr and "nothing was written" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not scan_cache(root).entries and leftovers(root) == []


def test_a_refusal_found_under_the_lock_writes_nothing(tmp_path):
    """The refusal check runs under every entry's lock before any swap: one refused entry, nothing written."""
    archive, eids = seeded_archive(tmp_path, 4)
    root = tmp_path / "dest"
    third = SG.parse_id(eids[2])
    write_fake_entry(root, fields=default_fields("org/m2", tp=2, dp=2), arch="sm90", seed=77, buckets=(1, 2))
    before = {p.name: p.read_bytes() for p in entry_path(root, third).iterdir()}
    proc = _import(archive, root)
    assert proc.returncode == 1 and "nothing was imported" in proc.stderr and str(third) in proc.stderr
    assert list(listed(root)) == [str(third)]
    assert {p.name: p.read_bytes() for p in entry_path(root, third).iterdir()} == before
    assert leftovers(root) == []


def test_import_over_an_entry_holding_a_foreign_file_is_refused(tmp_path):
    archive, eids = seeded_archive(tmp_path, 1)
    root = tmp_path / "dest"
    eid = write_fake_entry(root, fields=default_fields("org/m0", tp=2, dp=2), arch="sm90", seed=5, buckets=(1, 2))
    notes = entry_path(root, eid) / "notes.txt"
    notes.write_text("mine")
    before = {p.name: p.read_bytes() for p in entry_path(root, eid).iterdir()}
    proc = _import(archive, root, "--force")
    assert proc.returncode == 1 and "holds files that are not part of a cache (notes.txt)" in proc.stderr
    assert {p.name: p.read_bytes() for p in entry_path(root, eid).iterdir()} == before


def test_the_swap_leaves_no_file_of_the_old_entry(tmp_path):
    """A replaced entry is replaced whole: a rank file the new one lacks does not survive, on
    both commit paths (RENAME_EXCHANGE and the journaled pair of renames)."""
    try:
        for exchange in (True, False):
            faults.install(exchange=exchange)  # what tests/standins/fault_cli.py --no-exchange does, in this process
            root = tmp_path / f"t{int(exchange)}"
            eid = write_fake_entry(root, fields=default_fields("m", tp=2, dp=1), arch="sm90", seed=1)
            stray = entry_path(root, eid) / "rank_tp2_pp0_dp0.json"
            stray.write_bytes((entry_path(root, eid) / "rank_tp0_pp0_dp0.json").read_bytes())
            write_fake_entry(root, fields=default_fields("m", tp=2, dp=1), arch="sm90", seed=2)
            assert sorted(p.name for p in entry_path(root, eid).iterdir()) == [
                MANIFEST_NAME, "rank_tp0_pp0_dp0.json", "rank_tp1_pp0_dp0.json"]
            assert leftovers(root) == []
    finally:
        faults.install()


def test_staging_of_a_dead_import_is_removed_by_the_next_one(tmp_path):
    archive, eids = seeded_archive(tmp_path, 3)
    root = tmp_path / "dest"
    killed = _import(archive, root, launcher=crash_at("txn.staged_file:4"))
    assert killed.returncode == -signal.SIGKILL
    assert any(STAGE_DIR_RE.match(p.name) for p in leftovers(root))
    assert _import(archive, root).returncode == 0
    assert leftovers(root) == [] and sorted(listed(root)) == sorted(eids)


# --- deleting ----------------------------------------------------------------------------------

def test_a_killed_prune_never_leaves_a_half_deleted_entry(tmp_path):
    root = tmp_path / "tree"
    for i in range(3):
        write_fake_entry(root, fields=default_fields(f"m{i}", tp=4, dp=4), flashinfer_version="0.7.1", seed=i)
    killed = run_cli("prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", str(root),
                     launcher=crash_at("prune.renamed:2"))
    assert killed.returncode == -signal.SIGKILL
    after = listed(root)
    assert len(after) == 1 and set(after.values()) == {"complete"}  # two gone whole, one untouched
    assert any(TRASH_DIR_RE.match(p.name) for p in leftovers(root))
    out = run_json("prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", str(root))
    assert len(out["result"]["deleted"]) == 1 and out["result"]["leftovers_removed"] >= 1
    assert leftovers(root) == [] and listed(root) == {}


def test_prune_reports_what_it_could_not_delete(tmp_path):
    """Symlinks, FIFOs and foreign files stay - and so does the entry holding them, whole."""
    root = tmp_path / "tree"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.json").write_bytes(cache_file_bytes(DEFAULT_METADATA, fake_configs()))
    eid = write_fake_entry(root, flashinfer_version="0.7.1")
    d = entry_path(root, eid)
    (d / "rank_tp3_pp0_dp3.json").unlink()
    (d / "rank_tp3_pp0_dp3.json").symlink_to(outside / "target.json")
    (d / "rank_tp4_pp0_dp4.json").unlink()
    os.mkfifo(d / "rank_tp4_pp0_dp4.json")
    plain = write_fake_entry(root, fields=default_fields("x"), flashinfer_version="0.7.1")
    out = run_json("prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", str(root))
    assert out["result"]["deleted"] == [str(plain)]
    (skip,) = out["result"]["skipped"]
    assert skip["entry"] == str(eid) and "not part of a cache" in skip["reason"] and "rank_tp3_pp0_dp3.json" in skip["reason"]
    assert d.is_dir() and (d / "rank_tp0_pp0_dp0.json").is_file()  # nothing of it was deleted
    assert (outside / "target.json").exists()
    human = run_cli("prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", str(root))
    # the plan leaves it (as the run would): nothing to delete, and said why
    assert "Nothing to delete." in human.stdout and f"left {eid}: holds files" in human.stderr


def test_delete_entry_itself_refuses_an_entry_holding_foreign_files(root):
    """The plan leaves such an entry (``why_left``); the step that deletes refuses it too, on its
    own rescan under the entry's lock, whoever made the plan it was handed."""
    from autotune_cache.tree.delete import delete_entry
    from autotune_cache.tree.scanner.entry_scan import scan_entry
    from autotune_cache.tree.scanner.scan import scan_cache

    eid = write_fake_entry(root)
    (entry_path(root, eid) / "notes.txt").write_text("someone's notes")
    info = scan_cache(root)
    (e,) = info.entries
    out = delete_entry(info.layout, root, e, lambda x: scan_entry(info.layout, x.path, x.id))
    assert not out.deleted and "not part of a cache (notes.txt)" in out.why
    assert (entry_path(root, eid) / "notes.txt").exists() and list(listed(root)) == [str(eid)]


def test_ls_and_prune_survive_a_hostile_tree(tmp_path):
    root = tmp_path / "tree"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("do not touch")
    good = write_fake_entry(root, seed=1)
    bad = write_fake_entry(root, flashinfer_version="0.7.1", seed=2)
    bdir = entry_path(root, bad)
    (bdir / "rank_tp0_pp0_dp0.json").write_bytes((bdir / "rank_tp1_pp0_dp1.json").read_bytes()[:500])  # truncated
    (bdir / "rank_tp1_pp0_dp1.json").write_text(json.dumps({"hello": "world"}))  # JSON, not a cache
    (bdir / "rank_tp5_pp0_dp5.json").unlink()
    (bdir / "rank_tp5_pp0_dp5.json").mkdir()
    vdir = SG.base(root) / "0.7.1"
    (vdir / "README").write_text("foreign file at version level")
    (vdir / "sm90").symlink_to(outside, target_is_directory=True)
    (vdir / "sm100" / "not-a-key").mkdir()
    proc = run_cli("ls", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    for needle in ("symlink", "README", "not-a-key", "invalid JSON", "not a FlashInfer cache", "rank_tp5"):
        assert needle in proc.stderr, needle
    assert listed(root) == {str(good): "complete", str(bad): "corrupt"}
    out = run_json("prune", "--status", "corrupt", "-y", "--cache-dir", str(root))
    assert out["result"] is None and out["plan"]["left_alone"][0]["entry"] == str(bad)  # left by the plan
    assert (outside / "precious").read_text() == "do not touch" and (vdir / "README").exists()


# --- races ------------------------------------------------------------------------------------

def test_export_during_prune_never_crashes(tmp_path):
    root = tmp_path / "tree"
    rounds = 12
    crashes = []
    for r in range(rounds):
        for i in range(6):
            write_fake_entry(root, fields=default_fields(f"m{i}", tp=2, dp=1), flashinfer_version="0.7.1", seed=r)
        out = tmp_path / f"x{r}.tgz"
        exp = subprocess.Popen([sys.executable, "-m", "fi_autotune_cli", "export", "-o", str(out), "--cache-dir", str(root)],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        pr = run_cli("prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", str(root))
        e_out, e_err = exp.communicate(timeout=120)
        assert pr.returncode == 0, pr.stderr
        if exp.returncode not in (0, 1) or "Traceback" in e_err:
            crashes.append(e_err[-500:])
        if exp.returncode == 1:
            assert "nothing to export" in e_err, e_err  # everything vanished before it looked
        elif exp.returncode == 0:
            with tarfile.open(out) as tar:  # whatever it exported is whole
                for m in tar.getmembers():
                    data = tar.extractfile(m).read()
                    (Manifest.from_bytes if m.name.endswith(MANIFEST_NAME) else parse_cache_bytes)(data)
    assert crashes == []


# --- the tree's boundaries ----------------------------------------------------------------------

def test_import_never_writes_through_a_symlinked_dir(tmp_path):
    archive, _ = seeded_archive(tmp_path, 1)
    root = tmp_path / "dest"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (SG.base(root) / "0.7.2.post1").mkdir(parents=True)
    (SG.base(root) / "0.7.2.post1" / "sm90").symlink_to(outside, target_is_directory=True)
    proc = _import(archive, root)
    assert proc.returncode == 1 and "is a symlink inside the cache tree" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert list(outside.iterdir()) == []


def test_read_only_tree_reads_but_does_not_write(tmp_path, tmpfs):
    mnt = tmpfs("8m")
    eid = write_fake_entry(mnt)
    archive, _ = seeded_archive(tmp_path, 1)
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    assert listed(mnt) == {str(eid): "complete"}
    assert run_cli("show", str(eid), "--cache-dir", str(mnt)).returncode == 0
    out = tmp_path / "ro.tgz"
    proc = run_cli("export", "-o", str(out), "--cache-dir", str(mnt))
    assert proc.returncode == 0, proc.stderr
    for cmd in (["import", str(archive)], ["prune", "--status", "complete", "-y"], ["rm", str(eid), "-y"]):
        proc = run_cli(*cmd, "--cache-dir", str(mnt))
        assert proc.returncode == 1, (cmd, proc.stderr)
        assert "read-only" in proc.stderr.lower() and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_unreadable_entries_are_reported_and_skipped(root):
    a = write_fake_entry(root, flashinfer_version="0.7.1", fields=default_fields("a"))
    b = write_fake_entry(root, flashinfer_version="0.7.1", fields=default_fields("b"))
    c = write_fake_entry(root, flashinfer_version="0.7.1", fields=default_fields("c"))
    entry_path(root, b).chmod(0)
    try:
        ls = run_cli_unprivileged("ls", "--cache-dir", str(root))
        assert ls.returncode == 0 and "unreadable" in ls.stdout
        proc = run_cli_unprivileged("prune", "--flashinfer-version", "0.7.1", "-y", "--json", "--cache-dir", str(root))
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)["result"]
        assert sorted(result["deleted"]) == sorted([str(a), str(c)])
        assert result["skipped"][0]["entry"] == str(b) and "unreadable" in result["skipped"][0]["reason"]
    finally:
        entry_path(root, b).chmod(0o755)
    assert list(listed(root)) == [str(b)]


@pytest.mark.parametrize("which", ["a rank file", "the manifest"])
def test_a_file_this_user_may_not_read_makes_its_entry_unreadable_never_corrupt(root, which):
    """A rank file (or manifest) another user wrote 0600 - a server running as a service user, a
    cron prune as another - is not known to be bad: ``prune --status corrupt`` and a size budget
    (which evicts corrupt entries first) leave its entry, and say why."""
    kept = write_fake_entry(root, fields=default_fields("kept"))
    other = write_fake_entry(root, fields=default_fields("other"))
    names = sorted(p.name for p in entry_path(root, kept).iterdir())
    locked = entry_path(root, kept) / (names[-1] if which == "a rank file" else "fi-autotune.manifest.json")
    assert locked.name.startswith("rank_") or which == "the manifest"
    locked.chmod(0)
    try:
        ls = run_cli_unprivileged("ls", "--json", "--cache-dir", str(root))
        entries = {e["id"]: e for e in json.loads(ls.stdout)["entries"]}
        assert {i: e["status"] for i, e in entries.items()} == {str(kept): "unreadable", str(other): "complete"}
        assert any("Permission denied" in p for p in entries[str(kept)]["problems"]), entries[str(kept)]
        corrupt = run_cli_unprivileged("prune", "--status", "corrupt", "-y", "--json", "--cache-dir", str(root))
        assert corrupt.returncode == 0 and not (json.loads(corrupt.stdout)["result"] or {}).get("deleted"), corrupt.stdout
        budget = run_cli_unprivileged("prune", "--max-size", "1B", "-y", "--cache-dir", str(root))
        assert budget.returncode == 0 and "kept by unreadable entries or others' files (never deleted)" in budget.stdout, budget.stdout
    finally:
        locked.chmod(0o644)
    assert list(listed(root)) == [str(kept)]


def test_a_dry_run_on_a_tree_this_user_cannot_write_refuses_as_the_run_does(root):
    """``prune --dry-run`` said "Would free" where the run then refused: one line, exit 1, both."""
    eid = write_fake_entry(root)
    base = entry_path(root, eid).parents[2]
    base.chmod(0o555)
    try:
        for args in (("prune", "--older-than", "0s", "--dry-run"), ("prune", "--older-than", "0s", "-y"),
                     ("rm", str(eid), "--dry-run"), ("rm", str(eid), "-y")):
            proc = run_cli_unprivileged(*args, "--cache-dir", str(root))
            assert proc.returncode == 1 and "not writable by this user" in proc.stderr, (args, proc.stderr)
            assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == "", (args, proc.stdout)
    finally:
        base.chmod(0o755)
    assert list(listed(root)) == [str(eid)]


def test_an_entry_holding_someone_elses_file_is_left_by_the_plan_as_by_the_run(root):
    """The dry run listed it under "Would free" and the run then left it: the plan now leaves it
    and says why, so the dry run, the question before the delete and the run agree."""
    mine = write_fake_entry(root, fields=default_fields("mine"))
    notes = write_fake_entry(root, fields=default_fields("with-notes"))
    (entry_path(root, notes) / "notes.txt").write_text("someone's notes")
    dry = json.loads(run_cli("prune", "--older-than", "0s", "--dry-run", "--json", "--cache-dir", str(root)).stdout)
    assert [e["id"] for e in dry["plan"]["entries"]] == [str(mine)]
    (left,) = dry["plan"]["left_alone"]
    assert left["entry"] == str(notes) and "notes.txt" in left["reason"]
    real = json.loads(run_cli("prune", "--older-than", "0s", "-y", "--json", "--cache-dir", str(root)).stdout)
    assert real["result"]["deleted"] == [str(mine)] and list(listed(root)) == [str(notes)]
    named = run_cli("rm", str(notes), "-y", "--cache-dir", str(root))
    assert named.returncode == 1 and "notes.txt" in named.stderr and list(listed(root)) == [str(notes)]


def test_a_file_where_a_directory_belongs(tmp_path):
    archive, _ = seeded_archive(tmp_path, 1)
    root = tmp_path / "dest"
    (SG.base(root) / "0.7.2.post1").mkdir(parents=True)
    (SG.base(root) / "0.7.2.post1" / "sm90").write_text("not a dir")
    proc = _import(archive, root)
    assert proc.returncode == 1 and "exists and is not a directory" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_permission_denied_is_one_line(root, tmp_path):
    write_fake_entry(root)
    archive, _ = seeded_archive(tmp_path, 1)
    locked_dir = tmp_path / "locked"
    locked_dir.mkdir()
    locked_dir.chmod(0o500)
    try:
        exp = run_cli_unprivileged("export", "-o", str(locked_dir / "x.tgz"), "--cache-dir", str(root))
        assert exp.returncode == 1 and "Permission denied" in exp.stderr and len(exp.stderr.strip().splitlines()) == 1
        dest = locked_dir / "cache"
        imp = run_cli_unprivileged("import", str(archive), "--cache-dir", str(dest))
        assert imp.returncode == 1 and "Permission denied" in imp.stderr and len(imp.stderr.strip().splitlines()) == 1
    finally:
        locked_dir.chmod(0o755)


# --- export -o onto what is already there ------------------------------------------------------

def _plain_export(tmp_path: Path, root: Path) -> bytes:
    """The archive ``export`` writes to a new regular file: what every other output must receive."""
    plain = tmp_path / "plain.tgz"
    assert run_cli("export", "-o", str(plain), "--cache-dir", str(root)).returncode == 0
    return plain.read_bytes()


def _char_device(tmp_path: Path, name: str, minor: int) -> Path:
    """A memory char device of our own (``mknod c 1 minor``: 3 null, 7 full), never the host's /dev."""
    dev = tmp_path / name
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        os.close(os.open(dev, os.O_WRONLY))  # a nodev mount makes it but will not open it
    except OSError as e:
        pytest.skip(f"cannot make and open a char device here: {e}")
    return dev


def test_export_into_a_fifo_streams_the_whole_archive_and_the_fifo_stays(root, tmp_path):
    """Issue: ``-o FIFO`` renamed a temp file over the FIFO and its reader got nothing. It is written
    through, as ``>`` writes it: the reader gets the very bytes a file would hold."""
    write_fake_entry(root)
    fifo, keep = tmp_path / "fifo", tmp_path / "fifo-keep"
    os.mkfifo(fifo)
    os.link(fifo, keep)  # the same FIFO by a second name: a reader left waiting can be let go
    got: list[bytes] = []

    def read_all() -> None:
        with open(keep, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    proc = run_cli("export", "-o", str(fifo), "--cache-dir", str(root))
    reader.join(30)
    if reader.is_alive():  # nothing ever opened the FIFO to write: let the reader go
        os.close(os.open(keep, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(30)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert got == [_plain_export(tmp_path, root)]


def test_export_into_a_char_device_writes_through_it_and_it_stays(root, tmp_path):
    """Issue: ``export -o /dev/null`` as root replaced the host's /dev/null with a regular file."""
    write_fake_entry(root)
    null = _char_device(tmp_path, "null", 3)
    rdev = null.lstat().st_rdev
    proc = run_cli("export", "-o", str(null), "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISCHR(null.lstat().st_mode) and null.lstat().st_rdev == rdev
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".null.")] == []


def test_export_into_a_full_device_fails_as_stdout_does_and_it_stays(root, tmp_path):
    """A full device is the error ``-o -`` onto it gives: one line "No space left on device", exit 1."""
    write_fake_entry(root)
    full = _char_device(tmp_path, "full", 7)
    proc = run_cli("export", "-o", str(full), "--cache-dir", str(root))
    with open(full, "wb") as dev:
        to_stdout = subprocess.run([sys.executable, "-m", "fi_autotune_cli", "export", "-o", "-", "--cache-dir", str(root)],
                                   stdout=dev, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120)
    assert (proc.returncode, proc.stderr) == (to_stdout.returncode, to_stdout.stderr) == (1, proc.stderr)
    assert proc.stderr.strip().splitlines() == ["fi-autotune: error: No space left on device"]
    assert stat.S_ISCHR(full.lstat().st_mode)


def test_export_into_a_terminal_is_refused_as_stdout_is(root, tmp_path):
    """``-o /dev/pts/N`` is a terminal as a tty stdout is: refused (exit 2), nothing written to it."""
    write_fake_entry(root)
    controller, tty = os.openpty()
    try:
        proc = run_cli("export", "-o", os.ttyname(tty), "--cache-dir", str(root))
        os.set_blocking(controller, False)
        with contextlib.suppress(BlockingIOError):
            assert os.read(controller, 1 << 16) == b""
    finally:
        os.close(controller)
        os.close(tty)
    assert proc.returncode == 2 and "terminal" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_export_onto_a_socket_fails_in_one_line_and_the_socket_stays(root, tmp_path):
    """A socket cannot be opened as ``>`` opens a file: one line, exit 1, and the socket is left."""
    write_fake_entry(root)
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        proc = run_cli("export", "-o", str(path), "--cache-dir", str(root))
    assert proc.returncode == 1 and "cannot write" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert stat.S_ISSOCK(path.lstat().st_mode)


def test_export_through_a_symlink_writes_its_target_and_the_link_stays(root, tmp_path):
    """Issue: ``-o LINK`` replaced the link with a regular file. The archive is written, atomically,
    at the link's target (the old archive there replaced whole), and the link still points at it."""
    write_fake_entry(root)
    target, link = tmp_path / "out" / "latest.tgz", tmp_path / "latest.tgz"
    target.parent.mkdir()
    target.write_bytes(b"last week's archive")
    link.symlink_to(os.path.relpath(target, link.parent))
    proc = run_cli("export", "-o", str(link), "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and link.resolve() == target
    assert target.read_bytes() == _plain_export(tmp_path, root)
    with tarfile.open(target) as tar:
        assert any(m.name.endswith(MANIFEST_NAME) for m in tar.getmembers())
    assert sorted(p.name for p in target.parent.iterdir()) == ["latest.tgz"]


def test_export_never_follows_another_users_symlink_in_a_sticky_dir(root, tmp_path):
    """``/tmp/x.tgz -> /etc/passwd`` planted by another user: root's ``export -o /tmp/x.tgz`` must
    not replace the target (shell ``>`` is stopped there by the kernel's protected_symlinks, which
    a link resolved by us would bypass). One line, exit 2; the target and the link stay. The
    user's own link there, and another user's link in a directory that is not shared, are followed."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make another user's symlink")
    write_fake_entry(root)
    shared, precious = tmp_path / "shared", tmp_path / "precious.txt"
    shared.mkdir()
    shared.chmod(0o1777)
    precious.write_text("not an archive")
    planted = shared / "x.tgz"
    planted.symlink_to(precious)
    os.lchown(planted, 65534, 65534)
    proc = run_cli("export", "-o", str(planted), "--cache-dir", str(root))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "another user's symlink" in proc.stderr and precious.read_text() == "not an archive"
    assert planted.is_symlink()
    own = shared / "mine.tgz"
    own.symlink_to(tmp_path / "mine-target.tgz")
    assert run_cli("export", "-o", str(own), "--cache-dir", str(root)).returncode == 0
    assert (tmp_path / "mine-target.tgz").read_bytes() == _plain_export(tmp_path, root)
    shared.chmod(0o755)  # not shared: the rule does not apply
    assert run_cli("export", "-o", str(planted), "--cache-dir", str(root)).returncode == 0
    assert precious.read_bytes() == _plain_export(tmp_path, root) and planted.is_symlink()


def test_export_through_a_dangling_symlink_creates_its_target(root, tmp_path):
    """As ``>`` does: the link's target is created (atomically), the link left as it was."""
    write_fake_entry(root)
    link = tmp_path / "latest.tgz"
    link.symlink_to("made.tgz")
    proc = run_cli("export", "-o", str(link), "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and os.readlink(link) == "made.tgz"
    assert (tmp_path / "made.tgz").read_bytes() == _plain_export(tmp_path, root)


def test_open_stream_never_writes_into_a_regular_file(tmp_path):
    """A regular file put where a device was looked at (a race) is no stream: it gets the atomic write."""
    f = tmp_path / "a.tgz"
    f.write_bytes(b"kept")
    assert open_stream(f) is None
    assert f.read_bytes() == b"kept"


# --- hostile archives ---------------------------------------------------------------------------

def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _reg(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


GOOD = cache_file_bytes(DEFAULT_METADATA, fake_configs(buckets=(1, 2)))
PREFIX = "flashinfer/autotune/0.7.2.post1/sm90/0123456789abcdef/"


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, None


HOSTILE = [
    ("traversal", [_reg(PREFIX + "rank_tp0_pp0_dp0.json", GOOD), _reg("flashinfer/autotune/../../evil.json", GOOD)]),
    ("traversal-deep", [_reg(PREFIX + "../../../../../evil.json", GOOD)]),
    ("absolute", [_reg("/tmp/evil.json", GOOD)]),
    ("symlink", [_special(PREFIX + "rank_tp0_pp0_dp0.json", tarfile.SYMTYPE, "/etc/passwd")]),
    ("hardlink", [_reg(PREFIX + "rank_tp0_pp0_dp0.json", GOOD), _special(PREFIX + "rank_tp1_pp0_dp0.json", tarfile.LNKTYPE, PREFIX + "rank_tp0_pp0_dp0.json")]),
    ("device", [_special(PREFIX + "rank_tp0_pp0_dp0.json", tarfile.CHRTYPE)]),
    ("oversized", [_reg(PREFIX + "rank_tp0_pp0_dp0.json", b" " * (16 * 1024 * 1024 + 1))]),
    ("foreign-name", [_reg(PREFIX + "evil.sh", b"#!/bin/sh\n")]),
    ("not-json", [_reg(PREFIX + "rank_tp0_pp0_dp0.json", GOOD), _reg(PREFIX + "rank_tp1_pp0_dp0.json", b"{oops")]),
    ("not-a-cache", [_reg(PREFIX + "rank_tp0_pp0_dp0.json", b'{"a": 1}')]),
    ("bad-key-dir", [_reg("flashinfer/autotune/0.7.2.post1/sm90/NOTAKEY/rank_tp0_pp0_dp0.json", GOOD)]),
    ("nested", [_reg(PREFIX + "rank_tp0_pp0_dp0.json", b"[" * 50_000 + b"]" * 50_000)]),
    ("manifest-list", [_reg(PREFIX + "rank_tp0_pp0_dp0.json", GOOD),
                       _reg(PREFIX + MANIFEST_NAME, json.dumps({"tool": "fi-autotune", "format": 2, "rank_files": []}).encode())]),
    ("huge-rank-index", [_reg(PREFIX + "rank_tp99999999999_pp0_dp0.json", GOOD)]),
    ("bomb", [_reg(PREFIX + f"rank_tp{i}_pp0_dp0.json", GOOD[:-2] + b" " * (3 << 20) + GOOD[-2:]) for i in range(4)]),
]


@pytest.mark.parametrize("case,members", HOSTILE, ids=[c for c, _ in HOSTILE])
def test_hostile_archive_is_rejected_and_nothing_is_written(tmp_path, case, members):
    archive = _tar(tmp_path / f"{case}.tar.gz", members)
    dest = tmp_path / "dest"
    proc = run_cli("import", str(archive), "--cache-dir", str(dest))
    assert proc.returncode == 1, (case, proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not dest.exists() or not any(p.is_file() and "rank_" in p.name for p in dest.rglob("*"))
    assert leftovers(dest) == []
    assert not list(tmp_path.rglob("evil*"))


def test_bomb_is_refused_for_its_ratio(tmp_path):
    archive = _tar(tmp_path / "bomb.tgz", dict(HOSTILE)["bomb"])
    proc = run_cli("import", str(archive), "--cache-dir", str(tmp_path / "d"))
    assert proc.returncode == 1 and "decompresses more than 100x" in proc.stderr


def test_archive_with_forged_manifest_key_is_rejected(tmp_path):
    src = tmp_path / "src"
    eid = write_fake_entry(src)
    kdir = entry_path(src, eid)
    m = json.loads((kdir / MANIFEST_NAME).read_text())
    m["key_fields"]["model_path"] = "someone/else"
    members = [_reg(f"flashinfer/autotune/{eid}/{p.name}", p.read_bytes()) for p in kdir.glob("rank_*.json")]
    members.append(_reg(f"flashinfer/autotune/{eid}/{MANIFEST_NAME}", json.dumps(m).encode()))
    proc = run_cli("import", str(_tar(tmp_path / "f.tar.gz", members)), "--cache-dir", str(tmp_path / "dest"))
    assert proc.returncode == 1 and "key does not match" in proc.stderr
    assert not any((tmp_path / "dest").rglob("rank_*"))


def test_not_an_archive(tmp_path):
    f = tmp_path / "x.tar.gz"
    f.write_bytes(b"definitely not gzip")
    proc = run_cli("import", str(f), "--cache-dir", str(tmp_path / "d"))
    assert proc.returncode == 1 and "cannot read" in proc.stderr


def test_a_plain_tar_of_the_tree_imports_with_notes(tmp_path):
    """`tar czf x.tgz -C ROOT flashinfer` carries our locks and any temp files: left out with a note."""
    src = tmp_path / "src"
    eid = write_fake_entry(src)
    (entry_path(src, eid) / ".autotuner_abc.tmp").write_text("{")
    runs = entry_path(src, eid) / "runs"
    runs.mkdir()
    (runs / "rank_tp0_pp0_dp0.123.json").write_bytes(GOOD)
    archive = tmp_path / "plain.tgz"
    subprocess.run(["tar", "czf", str(archive), "-C", str(src), "flashinfer"], check=True)
    with tarfile.open(archive) as tar:
        assert any(".fi-autotune-locks" in n for n in tar.getnames())
    proc = run_cli("import", str(archive), "--cache-dir", str(tmp_path / "dest"))
    assert proc.returncode == 0, proc.stderr
    assert "skipped" in proc.stderr and ".fi-autotune-locks" in proc.stderr and "temporary file" in proc.stderr
    assert listed(tmp_path / "dest") == {str(eid): "complete"}


# --- guards that decide what may be removed --------------------------------------------------

STAGER = """
import sys, time
from pathlib import Path
from autotune_cache.registry import default_layout
from devtools.synthetic import DEFAULT_METADATA, cache_file_bytes, fake_configs
from autotune_cache.tree.crashsafe.txn import Transaction
layout = default_layout()
txn = Transaction(layout, Path(sys.argv[1]))
eid = layout.make_id(("0.7.2.post1", "sm90", "0123456789abcdef"))
txn.add_file(eid, "rank_tp0_pp0_dp0.json", cache_file_bytes(DEFAULT_METADATA, fake_configs(buckets=(1,))))
print("staged", flush=True)
time.sleep(120)
"""


def test_a_live_writers_staging_is_never_removed(tmp_path):
    """Staging belongs to its owner while the owner runs, however old it looks."""
    root = tmp_path / "tree"
    write_fake_entry(root, flashinfer_version="0.7.1")
    holder = subprocess.Popen([sys.executable, "-c", STAGER, str(root)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "staged"
        (stage,) = [p for p in leftovers(root) if STAGE_DIR_RE.match(p.name)]
        old = time.time() - 30 * 86400
        os.utime(stage, (old, old))
        out = run_json("prune", "--status", "corrupt", "-y", "--cache-dir", str(root))
        assert out["result"]["leftovers_removed"] == 0 and stage.exists()
        assert _import(seeded_archive(tmp_path, 1)[0], root).returncode == 0 and stage.exists()
    finally:
        holder.kill()
        holder.wait()
    out = run_json("prune", "--status", "corrupt", "-y", "--cache-dir", str(root))
    assert out["result"]["leftovers_removed"] == 1 and not stage.exists()


def test_prune_keeps_young_temp_files(root):
    """An engine's save in flight (FlashInfer's own temp file, no lock) is left until an hour old."""
    eid = write_fake_entry(root)
    young = entry_path(root, eid) / ".autotuner_young.tmp"
    old = entry_path(root, eid) / ".autotuner_old.tmp"
    young.write_text("{")
    old.write_text("{")
    t = time.time() - 7200
    os.utime(old, (t, t))
    plan = run_json("prune", "--status", "corrupt", "--dry-run", "--cache-dir", str(root))["plan"]
    assert [Path(f["path"]).name for f in plan["leftovers"]] == [old.name]
    out = run_json("prune", "--status", "corrupt", "-y", "--cache-dir", str(root))
    assert out["result"]["leftovers_removed"] == 1
    assert young.exists() and not old.exists()


def test_a_temp_file_touched_after_the_plan_stays(root):
    """Planned as old, written again before execution: a writer is alive, the file stays."""
    from autotune_cache.tree.delete import plan_prune
    from autotune_cache.tree.select import EntryFilter

    eid = write_fake_entry(root)
    tmp = entry_path(root, eid) / ".autotuner_busy.tmp"
    tmp.write_text("{")
    t = time.time() - 7200
    os.utime(tmp, (t, t))
    plan = plan_prune(scan_cache(root), EntryFilter(statuses=(EntryStatus.CORRUPT,)))
    assert [f.path for f in plan.leftovers] == [tmp]
    tmp.write_text("{}")  # the engine's save goes on
    assert plan.execute().leftovers_removed == 0 and tmp.exists()


def test_recovery_keeps_an_entry_rewritten_after_the_kill(tmp_path):
    """A journal says "replace A", but A was rewritten (by an engine) after the importer died:
    finishing the import must not clobber the newer files."""
    archive, eids = seeded_archive(tmp_path, 2)
    root = tmp_path / "dest"
    a = SG.parse_id(eids[0])
    write_fake_entry(root, fields=default_fields("org/m0", tp=2, dp=2), arch="sm90", seed=99, buckets=(1, 2))
    killed = _import(archive, root, "--force", launcher=crash_at("txn.journaled"))
    assert killed.returncode == -signal.SIGKILL
    target = entry_path(root, a)
    os.rename(target, tmp_path / "moved-away")
    engine = cache_file_bytes({**DEFAULT_METADATA, "gpu": "NVIDIA H200"}, fake_configs(buckets=(1,), seed=5))
    target.mkdir()
    for name in ("rank_tp0_pp0_dp0.json", "rank_tp1_pp0_dp1.json"):
        (target / name).write_bytes(engine)
    finish_with_a_writer(root)  # finishes the journal
    after = listed(root)
    assert sorted(after) == sorted(eids)
    assert (target / "rank_tp0_pp0_dp0.json").read_bytes() == engine
    assert leftovers(root) == []


def test_unused_for_selects_nothing_where_atime_is_not_kept(tmpfs):
    mnt = tmpfs("8m", "noatime")
    eid = write_fake_entry(mnt)
    t = time.time() - 90 * 86400
    for p in entry_path(mnt, eid).iterdir():
        os.utime(p, (t, t))
    out = run_json("prune", "--unused-for", "30d", "--dry-run", "--cache-dir", str(mnt))
    assert out["plan"]["entries"] == []
    assert run_json("prune", "--older-than", "30d", "--dry-run", "--cache-dir", str(mnt))["plan"]["entries"]


@pytest.mark.parametrize("writer", ["prune", "rm"])
def test_a_dry_run_leaves_a_killed_import_as_it_is_and_the_real_run_finishes_it(tmp_path, writer):
    """Readers never write (issue 33), and a dry run is a reader: ``show``, ``prune --dry-run`` and
    ``rm --dry-run`` over a killed import change nothing - the whole tree, the dead importer's
    owner-lock file in ``.fi-autotune-locks`` included (a reader's liveness check opens it
    read-only and never removes it, ``locks.dead_owner``); the same command without --dry-run
    finishes the import before it reads (once per command), and tidies that lock file."""
    archive, eids = seeded_archive(tmp_path, 3)
    root = tmp_path / "dest"
    write_fake_entry(root, fields=default_fields("org/m0", tp=2, dp=2), arch="sm90", seed=99, buckets=(1, 2))
    killed = run_cli("import", str(archive), "--force", "--cache-dir", str(root), launcher=crash_at("txn.journaled"))
    assert killed.returncode == -signal.SIGKILL
    state = lambda: tree_state(root)  # noqa: E731 - the whole tree, lock files included
    before = state()
    dead_locks = [k for k in before if "/.fi-autotune-locks/owners/" in k and k.endswith(".lock")]
    assert dead_locks, "the killed import left its owner lock file"
    assert any(p.parent.name == ".fi-autotune-journal" for p in leftovers(root))
    args = (["prune", "--older-than", "36500d"] if writer == "prune" else ["rm", eids[0]])
    for reader in (["show", eids[0]], [*args, "--dry-run"]):
        run_cli(*reader, "--cache-dir", str(root))
        assert state() == before, reader
    done = run_cli(*args, "-y", "--json", "--cache-dir", str(root))
    assert done.returncode == 0, done.stderr
    # what it finished is in --json as in the human notes (it was never there), deleting or not
    recovered = json.loads(done.stdout)["recovered"]
    assert len(recovered) == 1 and "finished an interrupted write" in recovered[0], done.stdout
    assert not any(p.parent.name == ".fi-autotune-journal" for p in leftovers(root))
    left = listed(root)
    assert sorted(left) == sorted(eids if writer == "prune" else eids[1:])
    assert set(left.values()) == {"complete"}
    assert not any(k in tree_state(root) for k in dead_locks), "the real run tidies the dead owner's lock file"


def test_an_import_dry_run_leaves_a_killed_import_unfinished(tmp_path):
    """``import --dry-run`` stages and decides as the import would, then discards: it does not
    roll a killed import's journal forward nor sweep what it left (the real import does). Every
    file and directory stays as it was, to its mtime - the journal, the dead importer's lock
    file, the data (its staging is outside the tree)."""
    archive, eids = seeded_archive(tmp_path, 3)
    root = tmp_path / "dest"
    write_fake_entry(root, fields=default_fields("org/m0", tp=2, dp=2), arch="sm90", seed=99, buckets=(1, 2))
    killed = run_cli("import", str(archive), "--force", "--cache-dir", str(root), launcher=crash_at("txn.journaled"))
    assert killed.returncode == -signal.SIGKILL

    def files() -> dict:
        return tree_state(root)  # every file and directory, with its mtime

    before = files()
    assert any(".fi-autotune-journal/" in k for k in before) and any("/owners/" in k for k in before)
    dry = run_cli("import", str(archive), "--force", "--dry-run", "--cache-dir", str(root))
    assert dry.returncode == 0, dry.stderr
    assert files() == before
    done = run_cli("import", str(archive), "--force", "--cache-dir", str(root))
    assert done.returncode == 0, done.stderr
    assert not any(p.parent.name == ".fi-autotune-journal" for p in leftovers(root))
    assert sorted(listed(root)) == sorted(eids)
