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

Staging, trash and journal names carry the owner token of the process that made them
(``locks``); the swaps are in ``swap``, the roll-forward after a kill in ``recovery``, deletes
in ``delete``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import stat as stat_mod
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from autotune_cache.autotuner.rankfile import validate_cache_obj
from autotune_cache.errors import FiAutotuneError, os_error_message
from autotune_cache.tree.crashsafe.atomic import atomic_write_bytes, deferred_signals, ensure_tree_dirs, fsync_dir, write_new_file
from autotune_cache.tree.crashsafe.dirs import first_missing, remove_dir_chain, remove_empty_parents, remove_tree
from autotune_cache.tree.crashsafe.faults import crashpoint
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId
from autotune_cache.tree.layouts.own_names import MANIFEST_NAME, PREVIEW_PREFIX, owner_locks_dir, stage_name, trash_name
from autotune_cache.tree.crashsafe.locks import entry_lock, hold_owner_lock, release_owner_lock
from autotune_cache.tree.manifest import Manifest, RankRecord
from autotune_cache.tree.crashsafe.recovery import (JOURNAL_FORMAT, recover_journals, remove_dead_siblings,
                                                   sweep_dead_previews, sweep_leftovers)
from autotune_cache.tree.crashsafe.swap import inode_of, swap_in, undo_swap, unlink_synced

__all__ = ["Check", "CommitResult", "StagedEntry", "Transaction"]


@dataclass
class StagedEntry:
    eid: EntryId
    target: Path
    stage: Path
    records: dict[str, RankRecord] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    manifest: Manifest | None = None
    metadata: dict | None = None
    #: The staged rank files' ``_metadata`` differ (one entry tuned in two environments?).
    mixed_metadata: bool = False
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

    def __init__(self, layout: CacheLayout, root: Path, *, preview_only: bool = False):
        """A writer first finishes what killed writers and deleters left in the tree (once per
        command). ``preview_only``: a transaction that will only ``preview`` (an ``import``/``pull``
        ``--dry-run``) decides on the tree as it is and writes nothing in it: it stages in a
        private scratch directory outside the tree, takes no lock there, creates no directory
        (not even a missing root), never rolls another writer's journal forward nor sweeps its
        leftovers - so a dry run answers over a tree its user cannot write, too. What killed dry
        runs left there goes first (``sweep_dead_previews``)."""
        self.layout = layout
        self.root = Path(root)
        self._scratch = None
        if preview_only:
            sweep_dead_previews()
            self._scratch = Path(tempfile.mkdtemp(prefix=PREVIEW_PREFIX))
        home = self._scratch or self.root  # where staging (and the owner lock) live
        self.base = layout.base(home)
        #: The highest directory this transaction made. What it made and left empty (a refused
        #: or unreadable archive) goes again, so a failed import into a root that did not exist
        #: leaves no empty tree behind; a directory holding anything stays. None: all existed.
        self._deepest = os.path.realpath(owner_locks_dir(self.base))  # as the kernel will resolve it
        self.created = first_missing(self._deepest)

        def make_base() -> None:
            home.mkdir(parents=True, exist_ok=True)  # the root itself may be a symlink: the user's choice
            ensure_tree_dirs(home, layout.base_parts())

        try:
            make_base()
        except OSError as e:
            raise FiAutotuneError(f"cannot write to the cache tree: {os_error_message(e)}") from None
        self.owner = hold_owner_lock(self.base, make_base)
        if not preview_only:
            recover_journals(layout, root)
            sweep_leftovers(layout, root)  # what killed writers and deleters left anywhere in the tree
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
        elif meta != s.metadata:
            s.mixed_metadata = True

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
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    # committing ----------------------------------------------------------------------------
    def commit(self, check: Check | None = None, lock_timeout: float = 120) -> CommitResult:
        """All staged entries or none. Refusals (``check``) abort before anything is written."""
        if self._scratch is not None:
            self.discard()
            raise RuntimeError("a preview-only transaction stages outside the tree: it cannot commit")
        try:
            with contextlib.ExitStack() as locks, deferred_signals():
                for eid in sorted(self.staged):
                    locks.enter_context(entry_lock(self.layout, self.root, eid, lock_timeout))
                todo, unchanged, refused = self._decide(check)
                if refused:
                    return CommitResult((), (), tuple(refused))
                for s in unchanged:
                    remove_tree(s.stage)
                if todo:
                    self._swap_all(todo)
                for s in todo + unchanged:
                    remove_dead_siblings(self.base, s.target)
                return CommitResult(tuple(s.eid for s in todo), tuple(s.eid for s in unchanged), ())
        finally:
            self.discard()

    def _decide(self, check: Check | None) -> tuple[list[StagedEntry], list[StagedEntry], list]:
        """(to swap in, unchanged, refused (id, why)): every decision ``commit`` acts on."""
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
        return todo, unchanged, refused

    def preview(self, check: Check | None = None) -> CommitResult:
        """What ``commit`` would do now, doing none of it: a ``--dry-run`` that decides as the
        run does (refusals included). No locks are taken: a preview must not wait on a writer
        nor leave lock files behind; the run decides again under them."""
        try:
            todo, unchanged, refused = self._decide(check)
            if refused:
                return CommitResult((), (), tuple(refused))
            return CommitResult(tuple(s.eid for s in todo), tuple(s.eid for s in unchanged), ())
        finally:
            self.discard()

    def drop(self, eid: EntryId) -> None:
        """Leave one staged entry out of the commit (``pull --only-compatible``)."""
        s = self.staged.pop(eid)
        remove_tree(s.stage)
        remove_empty_parents(s.stage, self.base)

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
                "old_ino": inode_of(s.target),
                "stage_ino": inode_of(s.stage),
            })
        atomic_write_bytes(journal, json.dumps({"format": JOURNAL_FORMAT, "owner": self.owner, "entries": rows}).encode())
        crashpoint("txn.journaled")
        try:
            for row, s in zip(rows, todo):
                swap_in(s.stage, s.target, self.base / row["trash"])
                crashpoint("txn.swapped")
        except BaseException:
            # An error, not a kill (a kill leaves the journal for the next command to finish):
            # put back every entry this transaction replaced, then forget the journal.
            if all([undo_swap(self.base, row) for row in reversed(rows)]):
                unlink_synced(journal)
            raise
        unlink_synced(journal)
        crashpoint("txn.unjournaled")
        for row in rows:
            trash = self.base / row["trash"]
            if os.path.lexists(trash):
                remove_tree(trash)


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
