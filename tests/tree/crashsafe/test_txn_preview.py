"""A transaction that only previews (``import``/``pull --dry-run``) stages outside the tree and can never
commit: a dry run writes nothing in the tree, and no code path can turn its staging into a write. Its
scratch dir, in the temp dir, goes with it; one a killed dry run left, the next dry run removes once
its owner is provably gone - never a running one's, never another user's."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import filelock
import pytest

from autotune_cache.registry import default_layout
from autotune_cache.tree.crashsafe.recovery import NEWBORN_LOCK_S, STALE_TEMP_AGE_S, sweep_dead_previews
from autotune_cache.tree.crashsafe.txn import Transaction
from autotune_cache.tree.layouts.own_names import LOCKS_DIRNAME, PREVIEW_PREFIX
from autotune_cache.tree.writer import replace_policy
from devtools.synthetic import DEFAULT_METADATA, cache_file_bytes, fake_configs

from tests.conftest import CLI_ARGV, REPO, run_cli
from tests.standins.fault_cli import crash_at
from tests.tree.crashsafe.test_reliability import seeded_archive


def _stage(txn: Transaction, layout):
    eid = layout.make_id(("0.7.2.post1", "sm90", "0123456789abcdef"))
    txn.add_file(eid, "rank_tp0_pp0_dp0.json", cache_file_bytes(DEFAULT_METADATA, fake_configs(buckets=(1,))))
    return eid


def _previewing(tmp_path):
    """(layout, root, a preview-only transaction with one entry staged, its id, its scratch dir)."""
    layout, root = default_layout(), tmp_path / "tree"
    txn = Transaction(layout, root, preview_only=True)
    eid = _stage(txn, layout)
    return layout, root, txn, eid, txn._scratch


def test_a_preview_only_transaction_refuses_to_commit_and_leaves_no_scratch(tmp_path):
    layout, root, txn, eid, scratch = _previewing(tmp_path)
    assert not root.exists()  # not even the root was made
    assert scratch.is_dir() and not scratch.is_relative_to(root)
    staged = txn.staged[eid].stage
    assert staged.is_relative_to(scratch) and txn.staged[eid].target == layout.entry_dir(root, eid)
    with pytest.raises(RuntimeError, match="cannot commit"):
        txn.commit()
    assert not root.exists() and not scratch.exists()


def test_a_preview_decides_against_the_real_tree_and_cleans_up(tmp_path):
    layout, root, txn, eid, scratch = _previewing(tmp_path)
    result = txn.preview()
    assert [str(e) for e in result.committed] == [str(eid)] and not result.refused
    assert not root.exists() and not scratch.exists()
    writer = Transaction(layout, root)  # a real one stages beside its target, and commits
    _stage(writer, layout)
    assert writer._scratch is None and writer.commit().committed
    again = Transaction(layout, root, preview_only=True)
    _stage(again, layout)
    assert [str(e) for e in again.preview(replace_policy(layout, root, False)).unchanged] == [str(eid)]


def _scratch(top, name: str, *, lock: bool = True):
    """A scratch dir as a dry run makes it (its owner lock file under the layout's base), nobody
    holding the lock: what a killed dry run leaves, its lock made over a minute ago.
    ``lock=False``: killed before it made it."""
    scratch = top / _named(name)
    owners = default_layout().base(scratch) / LOCKS_DIRNAME / "owners"
    owners.mkdir(parents=True)
    scratch.chmod(0o700)
    if lock:
        (owners / "0123456789ab.lock").touch()
        _age(owners / "0123456789ab.lock", NEWBORN_LOCK_S + 5)
    return scratch


def _named(name: str) -> str:
    """A scratch dir's name as ``mkdtemp`` makes it: the prefix and 8 characters."""
    return PREVIEW_PREFIX + name.ljust(8, "_")


def _age(path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def _previews(top) -> list[str]:
    return sorted(p.name.removeprefix(PREVIEW_PREFIX).rstrip("_") for p in top.iterdir()
                  if p.name.startswith(PREVIEW_PREFIX))


def test_a_killed_dry_runs_scratch_is_removed_by_the_next_dry_run(tmp_path):
    """Killed (SIGKILL) while staging, a dry run cannot remove its scratch; the next dry run does."""
    archive, _ = seeded_archive(tmp_path, 1)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    args = ("import", str(archive), "--dry-run", "--cache-dir", str(tmp_path / "tree"))
    killed = run_cli(*args, env={"TMPDIR": str(tmp)}, launcher=crash_at("txn.staged_file"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (left,) = _previews(tmp)
    # its lock file is new: it could be a dry run that made it and is about to take it
    at_once = run_cli(*args, env={"TMPDIR": str(tmp)})
    assert at_once.returncode == 0 and _previews(tmp) == [left], at_once.stderr
    (lock,) = tmp.glob(f"{PREVIEW_PREFIX}*/**/{LOCKS_DIRNAME}/owners/*.lock")
    _age(lock, NEWBORN_LOCK_S + 5)  # a minute later
    again = run_cli(*args, env={"TMPDIR": str(tmp)})
    assert again.returncode == 0 and "would import" in again.stdout, again.stderr
    assert list(tmp.iterdir()) == [] and not (tmp_path / "tree").exists()


def test_a_running_dry_runs_scratch_is_kept(tmp_path):
    """A dry run waiting on its archive (stdin) holds its owner lock: another dry run, then a
    sweep, leave its scratch, however old its lock file; it removes it itself when it ends."""
    archive, _ = seeded_archive(tmp_path, 1)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    running = subprocess.Popen([*CLI_ARGV, "import", "-", "--dry-run", "--cache-dir", str(tmp_path / "tree")],
                               env=env, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (locks := list(tmp.glob(f"{PREVIEW_PREFIX}*/**/{LOCKS_DIRNAME}/owners/*.lock"))):
            assert running.poll() is None and time.monotonic() < deadline, running.stderr.read()
            time.sleep(0.05)
        _age(locks[0], NEWBORN_LOCK_S + 5)  # running for over a minute: only its lock tells
        (mine,) = _previews(tmp)
        other = run_cli("import", str(archive), "--dry-run", "--cache-dir", str(tmp_path / "tree"),
                        env={"TMPDIR": str(tmp)})
        assert other.returncode == 0, other.stderr
        assert sweep_dead_previews(tmp) == 0 and _previews(tmp) == [mine]
    finally:
        running.communicate(input="", timeout=60)  # an empty archive: refused, its scratch removed
    assert running.returncode != 0 and list(tmp.iterdir()) == []


def test_only_a_dead_owners_scratch_goes_and_a_lockless_one_after_an_hour(tmp_path):
    dead = _scratch(tmp_path, "dead")
    young = _scratch(tmp_path, "young", lock=False)
    old = _scratch(tmp_path, "old", lock=False)
    _age(old, STALE_TEMP_AGE_S + 60)
    held = _scratch(tmp_path, "held")
    (lock_file,) = held.rglob("*.lock")
    lock = filelock.FileLock(str(lock_file), timeout=0)
    lock.acquire()  # its owner runs
    elsewhere = _scratch(tmp_path / "elsewhere", "target")
    (tmp_path / _named("link")).symlink_to(elsewhere, target_is_directory=True)
    (tmp_path / _named("file")).write_text("not ours")
    # the same contents (a free lock, an hour old), but not as mkdtemp names or makes a scratch dir
    handmade = [_scratch(tmp_path, "shared"), _scratch(tmp_path, "x" * 12)]
    handmade[0].chmod(0o755)
    for d in handmade:
        _age(d, STALE_TEMP_AGE_S + 60)
    try:
        assert sweep_dead_previews(tmp_path) == 2
        assert _previews(tmp_path) == ["file", "held", "link", "shared", "x" * 12, "young"]
        assert dead.exists() is old.exists() is False and lock_file.exists()
        assert elsewhere.is_dir() and list(elsewhere.rglob("*.lock"))
    finally:
        lock.release()
    assert sweep_dead_previews(tmp_path) == 1
    assert _previews(tmp_path) == ["file", "link", "shared", "x" * 12, "young"]


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's directory needs root")
def test_another_users_dead_scratch_is_never_touched(tmp_path):
    theirs = _scratch(tmp_path, "theirs")
    _age(theirs, STALE_TEMP_AGE_S + 60)
    os.chown(theirs, 65534, 65534)
    assert sweep_dead_previews(tmp_path) == 0 and theirs.is_dir() and list(theirs.rglob("*.lock"))
