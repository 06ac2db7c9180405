"""What a killed command leaves is removed by the next one that touches that place - and only
what is provably dead. Real processes killed with SIGKILL at an exact step
(tests/standins/fault_cli.py), real files, a real tmpfs for the full disk; nothing mocked."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import filelock

from autotune_cache.registry import default_layout
from autotune_cache.tree.layouts.own_names import LOCKS_DIRNAME, TRASH_DIR_RE, trash_name
from devtools.synthetic import default_fields, entry_path, write_fake_entry

from tests.standins.fault_cli import crash_at

from tests.conftest import run_cli, run_json

SG = default_layout()


def store_temps(store: Path) -> list[Path]:
    return sorted(p for p in store.rglob(".tmp-*") if LOCKS_DIRNAME not in p.parts)


def two_entries(root: Path) -> list[str]:
    return [str(write_fake_entry(root)),
            str(write_fake_entry(root, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1))]


# --- push to a file:// store ---------------------------------------------------------------------

def test_a_killed_push_leaves_temp_files_the_next_push_removes(tmp_path):
    """Killed with a temp file written (the marker, a bundle, then an index record under
    index/): the next push removes every one of them at once - their owner is dead - and
    publishes everything."""
    root = tmp_path / "tree"
    ids = two_entries(root)
    for nth, where in ((2, "bundles"), (3, "index")):
        store = tmp_path / f"store{nth}"
        url = f"file://{store}"
        killed = run_cli("push", url, "--cache-dir", str(root), launcher=crash_at(f"store.temp_written:{nth}"))
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        temps = store_temps(store)
        assert temps and any(where in t.parts for t in temps), temps
        again = run_cli("push", url, "--cache-dir", str(root), "--json")
        assert again.returncode == 0, again.stderr
        assert "temp file(s) of an interrupted push" in again.stderr
        assert store_temps(store) == []
        assert sorted(e["id"] for e in run_json("ls", url)["entries"]) == sorted(ids)


def test_a_live_pushers_temp_file_and_a_young_unowned_one_stay(tmp_path):
    """Only dead files go: a temp whose owner's lock is held (a push in flight) stays, and so
    does an older fi-autotune's temp (no owner in its name) younger than an hour; an hour-old one goes."""
    root, store = tmp_path / "tree", tmp_path / "store"
    two_entries(root)
    url = f"file://{store}"
    assert run_cli("push", url, "--cache-dir", str(root)).returncode == 0
    token = "ab" * 6
    lock_path = store / LOCKS_DIRNAME / "owners" / f"{token}.lock"
    live = store / "bundles" / f".tmp-{token}-{'cd' * 6}"
    young, old = store / "index" / f".tmp-{'ef' * 6}", store / "index" / f".tmp-{'01' * 6}"
    for p in (live, young, old):
        p.write_bytes(b"partial")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    held = filelock.FileLock(str(lock_path), timeout=0)
    held.acquire()
    try:
        assert run_cli("push", url, "--cache-dir", str(root)).returncode == 0
        assert live.exists() and young.exists() and not old.exists()
    finally:
        held.release()
    assert run_cli("push", url, "--cache-dir", str(root)).returncode == 0
    assert not live.exists() and young.exists()


def test_a_full_disk_push_leaves_no_temp_file(tmp_path, tmpfs):
    root = tmp_path / "tree"
    two_entries(root)
    disk = tmpfs("256k")
    store = disk / "store"
    assert run_cli("push", f"file://{store}", "--cache-dir", str(root)).returncode == 0
    (tmp_path / "other").mkdir()
    write_fake_entry(tmp_path / "other", fields=default_fields("org/big", tp=8, dp=8), arch="sm90", seed=7)
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:  # fill what is left
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    proc = run_cli("push", f"file://{store}", "--cache-dir", str(tmp_path / "other"))
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert store_temps(store) == []


# --- convert into FlashInfer's managed store -------------------------------------------------------

def v2_temps(v2root: Path) -> list[Path]:
    return sorted(p for p in v2root.rglob(".fi-autotune-*.tmp"))


def test_a_killed_convert_leaves_temps_that_a_rerun_and_prune_remove(tmp_path):
    root, v2root = tmp_path / "tree", tmp_path / "v2"
    eid = str(write_fake_entry(root))
    args = ("convert", eid, "--layout", "flashinfer-v2", "--to", str(v2root), "--cache-dir", str(root))
    killed = run_cli(*args, launcher=crash_at("atomic.temp_written:3"))
    assert killed.returncode == -signal.SIGKILL
    assert [p.parent.name for p in v2_temps(v2root)] == ["entries"]
    assert run_cli(*args).returncode == 0
    assert v2_temps(v2root) == []

    # killed again, then prune (no filter matching any entry) takes the temp under the entry's lock
    env_dir = next((v2root / "v2").iterdir())
    for f in (env_dir / "entries").iterdir():
        f.unlink()
    killed = run_cli(*args, launcher=crash_at("atomic.temp_written:2"))
    assert killed.returncode == -signal.SIGKILL and v2_temps(v2root)
    pruned = run_json("prune", "--layout", "flashinfer-v2", "--cache-dir", str(v2root), "--model", "no-such-model",
                      "-y", env={"FLASHINFER_AUTOTUNE_CACHE_DIR": str(v2root)})
    assert pruned["result"]["leftovers_removed"] == 1 and pruned["result"]["deleted"] == []
    assert v2_temps(v2root) == [] and list((env_dir / "entries").iterdir())  # the entries stay


def test_prune_leaves_the_temps_of_an_entry_a_writer_holds(tmp_path):
    """A temp file in an entry whose lock is held is a live writer's: it stays."""
    root, v2root = tmp_path / "tree", tmp_path / "v2"
    eid = str(write_fake_entry(root))
    assert run_cli("convert", eid, "--layout", "flashinfer-v2", "--to", str(v2root), "--cache-dir", str(root)).returncode == 0
    env_dir = next((v2root / "v2").iterdir())
    temp = env_dir / "entries" / ".fi-autotune-x.json.0123456789ab.tmp"
    temp.write_bytes(b"{")
    engines = env_dir / "entries" / ".autotune_x.tmp"  # FlashInfer's own, written with no lock: only age says dead
    engines.write_bytes(b"{")
    lock = v2root / "v2" / LOCKS_DIRNAME / f"{env_dir.name}.lock"
    assert lock.parent.is_dir(), sorted(p.name for p in (v2root / "v2").iterdir())
    held = filelock.FileLock(str(lock), timeout=0)
    held.acquire()
    try:
        run_json("prune", "--layout", "flashinfer-v2", "--cache-dir", str(v2root), "--model", "none", "-y")
        assert temp.exists()
    finally:
        held.release()
    run_json("prune", "--layout", "flashinfer-v2", "--cache-dir", str(v2root), "--model", "none", "-y")
    assert not temp.exists() and engines.exists()


# --- rm killed midway ------------------------------------------------------------------------------

def test_a_rerun_of_a_killed_rm_finishes_the_job(tmp_path):
    root = tmp_path / "tree"
    a, b = two_entries(root)
    keep = str(write_fake_entry(root, fields=default_fields("org/keep", tp=2, dp=1), arch="sm90", seed=3))
    killed = run_cli("rm", "-y", a, b, "--cache-dir", str(root), launcher=crash_at("prune.renamed:1"))
    assert killed.returncode == -signal.SIGKILL
    assert any(TRASH_DIR_RE.match(p.name) for p in SG.base(root).rglob("*"))
    other = run_cli("rm", "-y", "0.7.2.post1/sm90/ffffffffffffffff", "--cache-dir", str(root))
    assert other.returncode == 1 and "no cache entry" in other.stderr  # in flight: A only
    again = run_cli("rm", "-y", a, b, "--cache-dir", str(root), "--json")
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert out["plan"]["already_deleted"] == [a] and out["result"]["deleted"] == [b]
    assert not any(TRASH_DIR_RE.match(p.name) for p in SG.base(root).rglob("*"))
    assert [e["id"] for e in run_json("ls", "--cache-dir", str(root))["entries"]] == [keep]
    gone = run_cli("rm", "-y", a, "--cache-dir", str(root))  # nothing in flight any more: an unknown id again
    assert gone.returncode == 1 and "no cache entry" in gone.stderr


def test_a_killed_rm_after_its_last_removal_is_still_finished(tmp_path):
    """The emptied trash dirs stay until the whole plan has run: a kill at the last entry still
    leaves the record of every one deleted before it."""
    root = tmp_path / "tree"
    a, b = two_entries(root)
    killed = run_cli("rm", "-y", a, b, "--cache-dir", str(root), launcher=crash_at("prune.renamed:2"))
    assert killed.returncode == -signal.SIGKILL
    again = run_cli("rm", "-y", a, b, "--cache-dir", str(root))
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("already deleted") == 2, again.stderr
    assert not SG.base(root).exists() or not any(TRASH_DIR_RE.match(p.name) for p in SG.base(root).rglob("*"))


def test_a_live_deleters_trash_is_not_already_deleted(tmp_path):
    """A trash dir whose owner is alive (an rm in flight) proves nothing to another rm: the id is unknown."""
    root = tmp_path / "tree"
    a, _ = two_entries(root)
    path = entry_path(root, SG.parse_id(a))
    token = "12" * 6
    os.rename(path, path.parent / trash_name(token, path.name))
    lock = filelock.FileLock(str(SG.base(root) / LOCKS_DIRNAME / "owners" / f"{token}.lock"), timeout=0)
    lock.acquire()
    try:
        proc = run_cli("rm", "-y", a, "--cache-dir", str(root))
        assert proc.returncode == 1 and "no cache entry" in proc.stderr, proc.stderr
        assert (path.parent / trash_name(token, path.name)).is_dir()
    finally:
        lock.release()


def three_more(root: Path) -> list[str]:
    return [str(write_fake_entry(root, fields=default_fields(f"org/x{i}", tp=2, dp=1), arch="sm90", seed=10 + i))
            for i in range(3)]


def test_a_rm_killed_while_removing_its_trash_is_finished_by_a_rerun(tmp_path):
    """Issue 32: killed at the second trash removal, the first entry's trash is gone already -
    the delete journal still says that entry was deleted, so a re-run (after an ``ls``, which
    must not consume that proof) reports every one as already deleted, exit 0, and leaves nothing."""
    root = tmp_path / "tree"
    ids = two_entries(root) + three_more(root)
    keep = str(write_fake_entry(root, fields=default_fields("org/keep", tp=2, dp=1), arch="sm90", seed=3))
    killed = run_cli("rm", "-y", *ids, "--cache-dir", str(root), launcher=crash_at("prune.trash_removed:1"))
    assert killed.returncode == -signal.SIGKILL
    trash = [p for p in SG.base(root).rglob("*") if TRASH_DIR_RE.match(p.name)]
    assert len(trash) == 4, trash  # the first one went
    listed = run_json("ls", "--cache-dir", str(root))
    assert [e["id"] for e in listed["entries"]] == [keep]
    again = run_cli("rm", "-y", *ids, "--cache-dir", str(root), "--json")
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert sorted(out["plan"]["already_deleted"]) == sorted(ids) and out["result"]["deleted"] == []
    assert not [p for p in SG.base(root).rglob("*") if TRASH_DIR_RE.match(p.name) or p.suffix == ".json"
                and p.parent.name == ".fi-autotune-journal"]
    assert [e["id"] for e in run_json("ls", "--cache-dir", str(root))["entries"]] == [keep]
    gone = run_cli("rm", "-y", ids[0], "--cache-dir", str(root))  # the job is done: an unknown id again
    assert gone.returncode == 1 and "no cache entry" in gone.stderr


def test_a_rm_killed_after_its_journal_resumes_only_the_ids_it_took(tmp_path):
    """Killed with every entry in trash and the journal written: its ids are already deleted, a
    mistyped id beside them is still an error (exit 1, nothing deleted), and the rest runs."""
    root = tmp_path / "tree"
    a, b = two_entries(root)
    (c,) = three_more(root)[:1]
    killed = run_cli("rm", "-y", a, b, "--cache-dir", str(root), launcher=crash_at("prune.journaled"))
    assert killed.returncode == -signal.SIGKILL
    typo = run_cli("rm", "-y", a, "0.7.2.post1/sm90/ffffffffffffffff", "--cache-dir", str(root))
    assert typo.returncode == 1 and "no cache entry" in typo.stderr
    again = run_cli("rm", "-y", b, c, a, "--cache-dir", str(root), "--json")
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert sorted(out["plan"]["already_deleted"]) == sorted([a, b]) and out["result"]["deleted"] == [c]


def test_the_next_writer_sweeps_a_dead_deleters_trash_and_journal(tmp_path):
    """A tree writer (here: import of an archive) removes what a killed rm left anywhere in the
    tree - its trash and its journal - while a live deleter's trash stays."""
    root, other = tmp_path / "tree", tmp_path / "other"
    ids = two_entries(root)
    killed = run_cli("rm", "-y", *ids, "--cache-dir", str(root), launcher=crash_at("prune.trash_removed:1"))
    assert killed.returncode == -signal.SIGKILL
    live_token = "34" * 6
    live = SG.base(root) / "0.7.2.post1" / "sm90" / trash_name(live_token, "0123456789abcdef")
    live.mkdir(parents=True)
    lock = filelock.FileLock(str(SG.base(root) / LOCKS_DIRNAME / "owners" / f"{live_token}.lock"), timeout=0)
    lock.acquire()
    try:
        src = str(write_fake_entry(other, fields=default_fields("org/new", tp=2, dp=1), arch="sm90", seed=7))
        archive = tmp_path / "a.tar.gz"
        assert run_cli("export", src, "--cache-dir", str(other), "-o", str(archive)).returncode == 0
        assert run_cli("import", str(archive), "--cache-dir", str(root)).returncode == 0
        left = [p for p in SG.base(root).rglob("*") if TRASH_DIR_RE.match(p.name)]
        assert left == [live], left
        assert not list((SG.base(root) / ".fi-autotune-journal").glob("*.json"))
    finally:
        lock.release()


def _delete_journal(root: Path, token: str, ids: list[str], trash: list[str]) -> Path:
    jdir = SG.base(root) / ".fi-autotune-journal"
    jdir.mkdir(parents=True, exist_ok=True)
    path = jdir / f"{token}-0000aaaa.json"
    path.write_text(json.dumps({"format": 1, "kind": "delete", "owner": token,
                                "deleted": [{"id": SG.parse_id(i).parts, "trash": t} for i, t in zip(ids, trash)]}))
    return path


def test_a_live_deleters_journal_is_no_proof(tmp_path):
    """A delete journal whose owner still holds its lock (an rm in flight) proves nothing: an
    id it names that is not in the tree is unknown to another rm (exit 1, nothing deleted)."""
    root = tmp_path / "tree"
    a, b = two_entries(root)
    token = "56" * 6
    gone_id = "0.7.2.post1/sm90/" + "e" * 16
    _delete_journal(root, token, [gone_id], [f"0.7.2.post1/sm90/{trash_name(token, 'e' * 16)}"])
    lock = filelock.FileLock(str(SG.base(root) / LOCKS_DIRNAME / "owners" / f"{token}.lock"), timeout=0)
    lock.acquire()
    try:
        proc = run_cli("rm", "-y", gone_id, b, "--cache-dir", str(root))
        assert proc.returncode == 1 and "no cache entry" in proc.stderr, proc.stderr
        assert b in [e["id"] for e in run_json("ls", "--cache-dir", str(root))["entries"]]
    finally:
        lock.release()
    proc = run_cli("rm", "-y", gone_id, "--cache-dir", str(root))  # its owner is dead now: the proof holds
    assert proc.returncode == 0 and "already deleted" in proc.stderr, proc.stderr


def test_a_dead_deleters_journal_removes_nothing_outside_its_trash(tmp_path):
    """The journal's rows come from a file anyone could edit: a row naming an entry, a dir
    outside the tree or a ``..`` path is never removed by the sweep that finishes it."""
    root = tmp_path / "tree"
    a, b = two_entries(root)
    outside = tmp_path / f".fi-autotune-trash-{'78' * 6}-x"
    outside.mkdir()
    (outside / "keep").write_text("x")
    journal = _delete_journal(root, "78" * 6, [a, b, a], [a, f"../../../{outside.name}", str(outside)])
    c = three_more(root)[0]
    assert run_cli("rm", "-y", c, "--cache-dir", str(root)).returncode == 0  # a writer: it sweeps
    assert not journal.exists()
    assert (outside / "keep").exists()
    listed = [e["id"] for e in run_json("ls", "--cache-dir", str(root))["entries"]]
    assert a in listed and b in listed and c not in listed


# --- export killed midway ---------------------------------------------------------------------------

def test_a_killed_exports_temp_file_goes_with_the_next_export_a_running_ones_stays(tmp_path):
    """Issue 32 (found by the reliability benchmark): ``export -o out/x.tgz`` killed before its
    rename left ``out/.x.tgz.<hex>.tmp`` for ever. The writer holds an flock on its temp file:
    the next export to that name removes the temps whose lock is free (dead writers) and leaves
    one whose lock is held (a running export)."""
    import fcntl

    root, out = tmp_path / "tree", tmp_path / "out"
    out.mkdir()
    two_entries(root)
    killed = run_cli("export", "-o", str(out / "x.tgz"), "--cache-dir", str(root),
                     launcher=crash_at("export.written"))
    assert killed.returncode == -signal.SIGKILL
    (dead,) = out.glob(".x.tgz.*.tmp")
    live = out / ".x.tgz.0123abcd.tmp"
    live.write_bytes(b"partial")
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        again = run_cli("export", "-o", str(out / "x.tgz"), "--cache-dir", str(root))
        assert again.returncode == 0, again.stderr
        assert not dead.exists() and live.exists()
    finally:
        os.close(fd)
    assert sorted(p.name for p in out.iterdir()) == [".x.tgz.0123abcd.tmp", "x.tgz"]
    assert run_cli("export", "-o", str(out / "x.tgz"), "--cache-dir", str(root)).returncode == 0
    assert [p.name for p in out.iterdir()] == ["x.tgz"]


def test_a_convert_killed_before_a_new_environment_is_in_place_shows_nothing_half_done(tmp_path):
    """Issue 32 (found by the reliability benchmark): killed before its manifest was in place, a
    convert into a fresh FlashInfer store left an env dir with an empty entries/ that ``ls``
    showed as corrupt. A new environment is now staged (manifest first) and renamed into place:
    killed before, ``ls`` lists nothing corrupt; the re-run completes it and removes the stage."""
    root, v2root = tmp_path / "tree", tmp_path / "v2"
    eid = str(write_fake_entry(root))
    args = ("convert", eid, "--layout", "flashinfer-v2", "--to", str(v2root), "--cache-dir", str(root))
    killed = run_cli(*args, launcher=crash_at("v2.staged"))
    assert killed.returncode == -signal.SIGKILL
    ls = ["ls", "--layout", "flashinfer-v2", "--cache-dir", str(v2root)]
    listed = run_json(*ls)
    assert listed["entries"] == [] and [f["kind"] for f in listed["findings"]] == ["stage"], listed
    assert run_cli(*args).returncode == 0
    listed = run_json(*ls)
    assert [e["status"] for e in listed["entries"]] == ["complete"] and listed["findings"] == [], listed


def whole_tree(root: Path) -> dict:
    """Every path under ``root`` with its size and mtime, lock files included."""
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_a_dry_run_over_a_killed_rm_knows_its_ids_and_leaves_every_file_even_without_its_lock_file(tmp_path):
    """A dry run asks whether a killed ``rm``'s owner is dead as a reader: it opens the owner's
    lock file read-only and never removes it; where that file is missing (a tree copied without
    its locks dir) the owner is dead, and no lock file or dir is made to find that out. Either
    way the ids it took are already deleted, and the tree - lock files included - is unchanged."""
    root = tmp_path / "tree"
    ids = two_entries(root) + three_more(root)[:1]
    killed = run_cli("rm", "-y", *ids, "--cache-dir", str(root), launcher=crash_at("prune.trash_removed:1"))
    assert killed.returncode == -signal.SIGKILL
    locks = SG.base(root) / LOCKS_DIRNAME
    for without_locks in (False, True):
        if without_locks:
            for p in sorted(locks.rglob("*"), reverse=True):
                p.rmdir() if p.is_dir() else p.unlink()
            locks.rmdir()
        before = whole_tree(root)
        dry = run_json("rm", *ids, "--dry-run", "--cache-dir", str(root))
        assert sorted(dry["plan"]["already_deleted"]) == sorted(ids), (without_locks, dry)
        run_json("prune", "--older-than", "36500d", "--dry-run", "--cache-dir", str(root))
        assert whole_tree(root) == before, without_locks
    again = run_json("rm", *ids, "-y", "--cache-dir", str(root))
    assert sorted(again["plan"]["already_deleted"]) == sorted(ids) and again["result"]["deleted"] == []
    assert not [p for p in SG.base(root).rglob("*") if TRASH_DIR_RE.match(p.name)]


def test_an_owner_lock_that_is_no_file_proves_no_owner_dead_to_a_dry_run(tmp_path):
    """Where a killed ``rm``'s owner lock is a directory or a link (a garbage tree), a reader
    cannot tell whether that owner runs: its trash proves nothing (the id is unknown, exit 1),
    as it does to the real ``rm``, and the dry run leaves the tree as it found it."""
    root = tmp_path / "tree"
    a, _ = two_entries(root)
    killed = run_cli("rm", "-y", a, "--cache-dir", str(root), launcher=crash_at("prune.renamed:1"))
    assert killed.returncode == -signal.SIGKILL
    (lock,) = (SG.base(root) / LOCKS_DIRNAME / "owners").glob("*.lock")
    for odd in ("dir", "link"):
        lock.unlink() if lock.is_symlink() else lock.rmdir() if lock.is_dir() else lock.unlink()
        lock.mkdir() if odd == "dir" else lock.symlink_to(tmp_path / "elsewhere.lock")
        before = whole_tree(root)
        for args in (["--dry-run"], ["-y"]):
            proc = run_cli("rm", a, *args, "--cache-dir", str(root))
            assert proc.returncode == 1 and "no cache entry" in proc.stderr, (odd, args, proc.stderr)
            assert whole_tree(root) == before, (odd, args)
        assert not (tmp_path / "elsewhere.lock").exists()
