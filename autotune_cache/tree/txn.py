"""Writing and deleting whole entries - and whole archives - so that a kill at any point loses
nothing that was complete and leaves nothing half-done for long.

Writes (``warm``, ``import``, ``convert``) go through a ``Transaction``:

1. **Stage.** Each entry is assembled in a hidden staging dir beside its target
   (``.fi-autotune-stage-<owner>-<key>``), every file fsynced. Nothing is visible yet; a failure
   here (disk full, bad data) removes the staging dirs and the tree is untouched.
2. **Check under the locks.** The locks of every staged entry are taken in sorted order; each
   target is checked again (refusals such as "another GPU model's cache is there"). Any refusal
   aborts the whole transaction: nothing is written.
3. **Journal.** A commit record listing every (target, stage) pair and the inode of each is
   written and fsynced under ``.fi-autotune-journal/``. From here on the transaction is decided.
4. **Swap.** Each target is replaced in one step: ``renameat2(RENAME_EXCHANGE)`` where the
   filesystem has it, else two renames (target to trash, stage to target). Engines, which read
   without locks, see either the old entry or the new one, never a mix.
5. **Finish.** The journal is removed, then the replaced entries (now trash) are deleted.

A process killed in step 4 leaves its journal; the next fi-autotune command that can write the
tree finishes the swaps (roll forward), so an archive import ends all-or-nothing. A failure
in-process (an error, not a kill) during step 4 swaps back what was swapped.

Deletes (``prune``, ``rm``) rename the entry dir to a trash name in one step, then remove it.

Every staging, trash and journal name carries the token of the process that made it; that
process holds ``.fi-autotune-locks/owners/<token>.lock`` while it runs. Whoever can take that
lock knows the owner is gone and may finish or remove what it left, at once, without waiting
for an age to pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat as stat_mod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from autotune_cache.tree.atomic import (
    atomic_write_bytes,
    crashpoint,
    deferred_signals,
    ensure_tree_dirs,
    exchange_paths,
    file_lock,
    fsync_dir,
    retry_vanished_dir,
    try_lock,
    write_new_file,
)
from autotune_cache.errors import EntryLocked, FiAutotuneError, os_error_message
from autotune_cache.engines.layouts import CacheLayout, EntryId
from autotune_cache.tree.layout import LOCKS_DIRNAME, MANIFEST_NAME, OUR_PREFIX, STAGE_DIR_RE, TRASH_DIR_RE, stage_name, trash_name
from autotune_cache.tree.manifest import Manifest, RankRecord
from autotune_cache.autotuner.rankfile import validate_cache_obj

JOURNAL_FORMAT = 1


# --- the owner token --------------------------------------------------------------------------

_OWNER: dict = {"pid": None, "held": {}}


def _held() -> dict:
    """base -> (token, lock) held by this process (a fork starts with none)."""
    if _OWNER["pid"] != os.getpid():
        _OWNER.update(pid=os.getpid(), held={})
    return _OWNER["held"]


def _owner_lock_path(base: Path, token: str) -> Path:
    return base / LOCKS_DIRNAME / "owners" / f"{token}.lock"


def hold_owner_lock(base: Path, make_base: Callable[[], object] | None = None) -> str:
    """This process's token in ``base``, its lock taken (a fresh token each time: once
    released, a token's lock file may be taken by a cleaner that found it dead). ``make_base``
    (a writer's) makes ``base`` again if it vanished before the lock was held: a refused import
    removes the empty tree it made, and may do so just after this writer made it too."""
    import filelock

    held = _held()
    if base not in held:
        token = secrets.token_hex(6)
        path = _owner_lock_path(base, token)
        lock = filelock.FileLock(str(path), timeout=0)
        try:
            retry_vanished_dir(lambda: (make_base and make_base(), ensure_tree_dirs(base, (LOCKS_DIRNAME, "owners")),
                                        lock.acquire()))
        except filelock.Timeout:
            raise FiAutotuneError(f"the owner lock {path} is taken") from None
        except OSError as e:
            raise FiAutotuneError(f"cannot write to the cache tree: {os_error_message(e)}") from None
        held[base] = (token, lock)
    return held[base][0]


def release_owner_lock(base: Path) -> None:
    """Drop this process's owner lock in ``base`` once nothing of ours is left there (the file
    goes too: the token is never used again, so nobody can be waiting on it)."""
    token, lock = _held().pop(base, (None, None))
    if lock is not None:
        with contextlib.suppress(OSError):
            os.unlink(_owner_lock_path(base, token))
        lock.release()


@contextlib.contextmanager
def dead_owner(base: Path, token: str) -> Iterator[bool]:
    """Yields True (holding its lock) when the owner of ``token`` is gone, else False."""
    mine = _held().get(base)
    if mine is not None and mine[0] == token:
        yield False
        return
    path = _owner_lock_path(base, token)
    lock = try_lock(path)
    if lock is None:
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # nobody will use this token again
        lock.release()


def _ino(path: Path) -> int | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_ino if stat_mod.S_ISDIR(st.st_mode) else -1


def remove_tree(path: Path) -> str | None:
    """``rm -r`` of a staging or trash dir (symlinks inside are removed, never followed).
    Returns the error of what could not be removed, or None."""
    errors: list[str] = []

    def onerror(func, p, exc_info):  # noqa: ARG001
        if not isinstance(exc_info[1], FileNotFoundError):
            errors.append(os_error_message(exc_info[1], p))

    shutil.rmtree(path, onerror=onerror)
    return errors[0] if errors else None


def first_missing(deepest: str | Path) -> Path | None:
    """The highest directory on the way to ``deepest`` (an absolute path, ``..`` and symlinks
    resolved: ``os.path.realpath``) that does not exist yet (None: all do)."""
    deepest = Path(deepest)
    for p in [*reversed(deepest.parents), deepest]:
        if not os.path.lexists(p):
            return p
    return None


def remove_dir_chain(top: Path, deepest: Path) -> None:
    """rmdir ``deepest`` and its parents up to and including ``top``, while they are empty: only
    the directories a transaction made on its way down, never a file, never a directory another
    process has put anything in (the first non-empty one stops it)."""
    p = Path(deepest)
    while True:
        try:
            os.rmdir(p)
        except OSError:
            return
        if p == top or top not in p.parents:
            return
        p = p.parent


def remove_empty_parents(path: Path, stop: Path) -> None:
    """rmdir ``path``'s parents while empty, never ``stop`` or above."""
    p = Path(path).parent
    stop = Path(stop)
    while p != stop and stop in p.parents:
        try:
            os.rmdir(p)
        except OSError:
            return
        p = p.parent


def _swap_in(stage: Path, target: Path, trash: Path) -> None:
    """Put ``stage`` at ``target`` in one step; whatever was at ``target`` ends at ``trash``."""
    if not os.path.lexists(target):
        try:
            os.rename(stage, target)
            fsync_dir(target.parent)
            return
        except OSError:
            if not os.path.lexists(target):
                raise
            # an engine created the dir in between: replace it like any existing one
    if exchange_paths(stage, target):
        crashpoint("txn.exchanged")
        os.rename(stage, trash)  # ``stage`` holds the previous entry now
    else:
        os.rename(target, trash)
        crashpoint("txn.between_renames")
        os.rename(stage, target)
    fsync_dir(target.parent)
    _carry_engine_side(trash, target)


def _carry_engine_side(old: Path, new: Path) -> None:
    """The engine's own side dir (SGLang's runs/) belongs to the engine, not to the tuning we
    replace: move it into the new entry rather than deleting it."""
    runs_old, runs_new = old / "runs", new / "runs"
    if os.path.isdir(runs_old) and not os.path.islink(runs_old) and not os.path.lexists(runs_new):
        with contextlib.suppress(OSError):
            os.rename(runs_old, runs_new)


# --- the transaction --------------------------------------------------------------------------

@dataclass
class StagedEntry:
    eid: EntryId
    target: Path
    stage: Path
    records: dict[str, RankRecord] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    manifest: Manifest | None = None
    metadata: dict | None = None
    finished: bool = False


@dataclass(frozen=True)
class CommitResult:
    committed: tuple[EntryId, ...] = ()
    unchanged: tuple[EntryId, ...] = ()
    refused: tuple[tuple[EntryId, str], ...] = ()

    @property
    def ok(self) -> bool:
        return not self.refused


#: ``check(staged, target) -> None | "same" | reason``, called under the entry's lock.
Check = Callable[[StagedEntry, Path], "str | None"]


class Transaction:
    """Stage any number of entries, then commit all or none of them (see the module doc)."""

    def __init__(self, layout: CacheLayout, root: Path):
        self.layout = layout
        self.root = Path(root)
        self.base = layout.base(root)
        #: The highest directory this transaction made. What it made and left empty (a refused
        #: or unreadable archive) goes again, so a failed import into a root that did not exist
        #: leaves no empty tree behind; a directory holding anything stays. None: all existed.
        self._deepest = os.path.realpath(self.base / LOCKS_DIRNAME / "owners")  # as the kernel will resolve it
        self.created = first_missing(self._deepest)

        def make_base() -> None:
            self.root.mkdir(parents=True, exist_ok=True)  # the root itself may be a symlink: the user's choice
            ensure_tree_dirs(self.root, layout.base_parts())

        try:
            make_base()
        except OSError as e:
            raise FiAutotuneError(f"cannot write to the cache tree: {os_error_message(e)}") from None
        self.owner = hold_owner_lock(self.base, make_base)
        recover_journals(layout, root)
        self.staged: dict[EntryId, StagedEntry] = {}
        #: Manifests read with an archive, checked and written by ``archive.finish_staged``.
        self.manifest_bytes: dict[EntryId, bytes] = {}

    # staging -------------------------------------------------------------------------------
    def _entry(self, eid: EntryId) -> StagedEntry:
        s = self.staged.get(eid)
        if s is None:
            target = self.layout.entry_dir(self.root, eid)
            parent = ensure_tree_dirs(self.base, eid.parts[:-1])
            stage = parent / stage_name(self.owner, eid.name)
            try:
                os.mkdir(stage, 0o755)
            except FileExistsError:
                remove_tree(stage)  # our own, from an earlier attempt in this process
                os.mkdir(stage, 0o755)
            s = self.staged[eid] = StagedEntry(eid, target, stage)
        return s

    def add_file(self, eid: EntryId, name: str, data: bytes) -> None:
        """Stage one data file (validated as a FlashInfer cache by the caller or here)."""
        import hashlib

        s = self._entry(eid)
        if name in s.records:
            raise FiAutotuneError(f"{eid}: {name} given twice")
        meta, configs = validate_cache_obj(json.loads(data))
        try:
            st = write_new_file(s.stage / name, data)
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(s.stage / name)) from None
        crashpoint("txn.staged_file")
        digest = hashlib.sha256(data).hexdigest()
        s.records[name] = RankRecord(st.st_size, st.st_mtime_ns, digest, configs, st.st_ctime_ns)
        s.digests[name] = digest
        if s.metadata is None:
            s.metadata = meta

    def finish_entry(self, eid: EntryId, manifest: Manifest | None) -> StagedEntry:
        """Write the manifest (with the staged files' records) and fsync the staging dir."""
        s = self._entry(eid)
        if manifest is not None:
            s.manifest = manifest.with_rank_records(s.records)
            write_new_file(s.stage / MANIFEST_NAME, s.manifest.to_bytes())
        fsync_dir(s.stage)
        s.finished = True
        return s

    def discard(self) -> None:
        for s in self.staged.values():
            remove_tree(s.stage)
            remove_empty_parents(s.stage, self.base)
        self.staged.clear()
        release_owner_lock(self.base)
        if self.created is not None:
            remove_dir_chain(self.created, Path(self._deepest))

    # committing ----------------------------------------------------------------------------
    def commit(self, check: Check | None = None, lock_timeout: float = 120) -> CommitResult:
        """All staged entries or none. Refusals (``check``) abort before anything is written."""
        try:
            with contextlib.ExitStack() as locks, deferred_signals():
                for eid in sorted(self.staged):
                    locks.enter_context(entry_lock(self.layout, self.root, eid, lock_timeout))
                todo, unchanged, refused = [], [], []
                for eid in sorted(self.staged):
                    s = self.staged[eid]
                    if not s.finished:
                        self.finish_entry(eid, None)
                    why = _replaceable(self.layout, s.target)
                    if why is None and check is not None:
                        why = check(s, s.target)
                    if why == "same":
                        unchanged.append(s)
                    elif why is not None:
                        refused.append((eid, why))
                    else:
                        todo.append(s)
                if refused:
                    return CommitResult((), (), tuple(refused))
                for s in unchanged:
                    remove_tree(s.stage)
                if todo:
                    self._swap_all(todo)
                for s in todo + unchanged:
                    _remove_dead_siblings(self.base, s.target)
                return CommitResult(tuple(s.eid for s in todo), tuple(s.eid for s in unchanged), ())
        finally:
            self.discard()

    def _swap_all(self, todo: list[StagedEntry]) -> None:
        jdir = ensure_tree_dirs(self.base, (self.layout.journal_dir(self.root).name,))
        journal = jdir / f"{self.owner}-{secrets.token_hex(4)}.json"
        rows = []
        for s in todo:
            trash = s.target.parent / trash_name(self.owner, s.eid.name)
            rows.append({
                "id": list(s.eid.parts),
                "target": str(s.target.relative_to(self.base)),
                "stage": str(s.stage.relative_to(self.base)),
                "trash": str(trash.relative_to(self.base)),
                "old_ino": _ino(s.target),
                "stage_ino": _ino(s.stage),
            })
        atomic_write_bytes(journal, json.dumps({"format": JOURNAL_FORMAT, "owner": self.owner, "entries": rows}).encode())
        crashpoint("txn.journaled")
        try:
            for row, s in zip(rows, todo):
                _swap_in(s.stage, s.target, self.base / row["trash"])
                crashpoint("txn.swapped")
        except BaseException:
            # An error, not a kill (a kill leaves the journal for the next command to finish):
            # put back every entry this transaction replaced, then forget the journal.
            if all([_undo(self.base, row) for row in reversed(rows)]):
                _unlink(journal)
            raise
        _unlink(journal)
        crashpoint("txn.unjournaled")
        for row in rows:
            trash = self.base / row["trash"]
            if os.path.lexists(trash):
                remove_tree(trash)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fsync_dir(path.parent)


def _undo(base: Path, row: dict) -> bool:
    """Put the previous entry back at ``target`` (by inode: wherever the swap had got to).
    True when the target holds what it held before the transaction."""
    target, stage, trash = base / row["target"], base / row["stage"], base / row["trash"]
    old = row["old_ino"]
    try:
        t = _ino(target)
        if t != row["stage_ino"]:
            if t is None and old is not None and _ino(trash) == old:
                os.rename(trash, target)  # stopped between the two renames of the fallback
            return _ino(target) == old
        # The new entry is in place. Move it out of the way, then the old one back.
        new_out = target.parent / f"{trash.name}-new"
        os.rename(target, new_out)
        old_at = next((p for p in (stage, trash) if old is not None and _ino(p) == old), None)
        if old_at is not None:
            os.rename(old_at, target)
        remove_tree(new_out)
        fsync_dir(target.parent)
        return _ino(target) == old
    except OSError:
        return False


def _replaceable(layout: CacheLayout, target: Path) -> str | None:
    """Why ``target`` cannot be swapped away as a whole (files that are not a cache's), or None."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return None
    if stat_mod.S_ISLNK(st.st_mode):
        return f"{target} is a symlink: refusing to replace it"
    if not stat_mod.S_ISDIR(st.st_mode):
        return f"{target} exists and is not a directory"
    others = []
    try:
        with os.scandir(target) as it:
            for child in it:
                is_dir = child.is_dir(follow_symlinks=False)
                kind = layout.classify(child.name, is_dir)
                regular = child.is_file(follow_symlinks=False)
                if kind.value == "foreign" or (kind.value in ("data", "manifest", "temp") and not regular):
                    others.append(child.name)
    except OSError as e:
        return f"cannot read {target}: {e.strerror or e}"
    if others:
        names = ", ".join(sorted(others)[:3]) + (" ..." if len(others) > 3 else "")
        return f"{target} holds files that are not part of a cache ({names}): move them away first"
    return None


@contextlib.contextmanager
def entry_lock(layout: CacheLayout, root: Path, eid: EntryId, timeout: float = -1) -> Iterator[None]:
    """The writer lock of one entry. ``timeout=0`` fails at once with EntryLocked."""
    with file_lock(layout.base(root), layout.lock_path(root, eid), str(eid), timeout):
        yield


# --- recovery and cleanup ---------------------------------------------------------------------

def recover_journals(layout: CacheLayout, root: Path) -> list[str]:
    """Finish the swaps of every journal whose owner is gone; returns what it did, for notes.

    Cheap when there is nothing to do (one failed stat). Safe on a read-only tree (does nothing:
    a journal there is reported by ``ls`` as a finding).
    """
    base = layout.base(root)
    jdir = layout.journal_dir(root)
    try:
        listing = os.listdir(jdir)
    except OSError:
        return []
    names = sorted(n for n in listing if n.endswith(".json"))
    for tmp in (n for n in listing if n.endswith(".tmp") and n.startswith(OUR_PREFIX)):
        # a journal killed while being written: its transaction never started swapping
        with dead_owner(base, tmp[len(OUR_PREFIX):].split("-", 1)[0]) as dead:
            if dead:
                with contextlib.suppress(OSError):
                    os.unlink(jdir / tmp)
    done = []
    for name in names:
        token = name.split("-", 1)[0]
        with dead_owner(base, token) as dead:
            if not dead:
                continue
            path = jdir / name
            try:
                journal = json.loads(path.read_bytes())
                rows = journal["entries"]
            except (OSError, ValueError, KeyError, TypeError):
                _unlink(path)  # a half-written journal: its transaction never started swapping
                continue
            finished = _roll_forward(layout, root, base, rows)
            _unlink(path)
            for row in rows:
                trash = base / row["trash"]
                if os.path.lexists(trash):
                    remove_tree(trash)
            done.append(f"finished an interrupted write of {finished} of {len(rows)} entries")
    return done


def _roll_forward(layout: CacheLayout, root: Path, base: Path, rows: list) -> int:
    finished = 0
    for row in rows:
        try:
            eid = layout.make_id(tuple(row["id"]))
        except (ValueError, TypeError):
            continue
        target, stage, trash = base / row["target"], base / row["stage"], base / row["trash"]
        with entry_lock(layout, root, eid, timeout=120):
            now_target, now_stage = _ino(target), _ino(stage)
            if now_target == row["stage_ino"]:
                if now_stage is not None and now_stage == row["old_ino"]:
                    os.rename(stage, trash)  # exchanged; the old entry was still at the stage name
                finished += 1
            elif now_stage == row["stage_ino"] and now_target == row["old_ino"]:
                _swap_in(stage, target, trash)  # not swapped yet
                finished += 1
            elif now_stage == row["stage_ino"] and now_target is None and _ino(trash) == row["old_ino"]:
                os.rename(stage, target)  # between the two renames of the fallback
                fsync_dir(target.parent)
                finished += 1
            elif now_stage == row["stage_ino"]:
                remove_tree(stage)  # the target changed since (an engine wrote it): keep that
    return finished


def _remove_dead_siblings(base: Path, target: Path) -> None:
    """Staging and trash dirs of ``target``'s name left by owners that are gone."""
    parent = target.parent
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        m = STAGE_DIR_RE.match(name) or TRASH_DIR_RE.match(name)
        if m and m["name"] == target.name:
            with dead_owner(base, m["owner"]) as dead:
                if dead:
                    remove_tree(parent / name)


def remove_leftover(base: Path, path: Path) -> tuple[bool, str | None]:
    """Remove a staging or trash dir found by a scan if its owner is gone: (removed, error)."""
    m = STAGE_DIR_RE.match(path.name) or TRASH_DIR_RE.match(path.name)
    if not m:
        return False, None
    with dead_owner(base, m["owner"]) as dead:
        if not dead:
            return False, None
        err = remove_tree(path)
        return err is None, err


# --- deleting ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeleteOutcome:
    deleted: bool
    why: str | None = None  # when not deleted: why it was left
    error: str | None = None  # deleted from the tree, but its files could not all be removed


def delete_entry(layout: CacheLayout, root: Path, entry, rescan: Callable) -> DeleteOutcome:
    """Delete one entry in one step, if it is still what the plan showed.

    Under the entry's lock (never waiting: a running writer wins), the entry is scanned again
    (``rescan(entry) -> CacheEntry``); if anything changed since the plan, or it holds files
    that are not a cache's, it stays. Else its dir is renamed to a trash name (one rename: it
    leaves the tree whole) and then removed.
    """
    base = layout.base(root)
    token = hold_owner_lock(base)
    try:
        with entry_lock(layout, root, entry.id, timeout=0):
            now = rescan(entry)
            if now.state != entry.state:
                return DeleteOutcome(False, "changed since the plan was made")
            if not now.only_ours:
                names = ", ".join(sorted(f.path.name for f in now.foreign)[:3])
                return DeleteOutcome(False, f"holds files that are not part of a cache ({names}); remove them by hand")
            trash = entry.path.parent / trash_name(token, entry.path.name)
            try:
                os.rename(entry.path, trash)
            except OSError as e:
                return DeleteOutcome(False, f"cannot delete: {os_error_message(e)}")
            fsync_dir(entry.path.parent)
            crashpoint("prune.renamed")
    except EntryLocked:
        return DeleteOutcome(False, "locked by a running writer")
    err = remove_tree(trash)
    remove_empty_parents(entry.path, base)
    return DeleteOutcome(True, error=err)
