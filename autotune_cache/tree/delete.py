"""Deleting entries as plan-then-execute, so ``--dry-run`` prints exactly the plan that would run
(``prune`` selects with an ``EntryFilter``, ``rm`` by name).

Execution deletes each entry in one step (``delete_entry``): under its lock (never waiting: a
running writer wins), after checking that it is still what the plan showed, the entry dir is
renamed to a trash name (one rename: it leaves the tree whole) and removed. An entry that
changed, is locked by a writer, or holds files that are not a cache's stays, and the result
says which and why. Leftovers of interrupted writes (staging and trash dirs whose owner is
gone, temp files older than an hour) are removed too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat as stat_mod
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from autotune_cache.errors import EntryLocked, FiAutotuneError, UsageError, os_error_message
from autotune_cache.humanize import format_size, plural
from autotune_cache.tree.scanner.atime import TimeSpan, atime_doubt
from autotune_cache.tree.crashsafe.atomic import fsync_dir, remove_our_temps
from autotune_cache.tree.crashsafe.dirs import list_dir, remove_empty_parents, remove_tree
from autotune_cache.tree.scanner.entry_scan import scan_entry
from autotune_cache.tree.crashsafe.faults import crashpoint
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId
from autotune_cache.tree.layouts.own_names import OUR_PREFIX, trash_name
from autotune_cache.tree.crashsafe.locks import entry_lock, hold_owner_lock, release_owner_lock
from autotune_cache.tree.records import CacheEntry, CacheInfo, Finding
from autotune_cache.tree.crashsafe.recovery import (STALE_TEMP_AGE_S, deleted_by_dead, remove_leftover,
                                                   sweep_leftovers, write_delete_journal)
from autotune_cache.tree.select import EntryFilter, Reader, beyond_latest, evict_class, eviction_key, over_budget, reader_notes
from autotune_cache.tree.status import EntryStatus


@dataclass(frozen=True)
class DeleteOutcome:
    deleted: bool
    why: str | None = None  # when not deleted: why it was left
    error: str | None = None  # deleted from the tree, but its files could not all be removed
    trash: Path | None = None  # the emptied trash dir, removed once the whole plan has run


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
                return DeleteOutcome(False, not_ours(now))
            trash = entry.path.parent / trash_name(token, entry.path.name)
            try:
                os.rename(entry.path, trash)
            except OSError as e:
                return DeleteOutcome(False, f"cannot delete: {os_error_message(e)}")
            fsync_dir(entry.path.parent)
            crashpoint("prune.renamed")
    except EntryLocked:
        return DeleteOutcome(False, "locked by a running writer")
    return DeleteOutcome(True, error=empty_dir(trash), trash=trash)


def empty_dir(path: Path) -> str | None:
    """Remove what is inside ``path`` but not ``path`` itself: an emptied trash dir stays until
    the whole plan has run, as the record that its entry was deleted, not mistyped (``in_flight``)."""
    children, err = list_dir(path, sort=False)
    for child in children:
        p = Path(child.path)
        if child.is_dir(follow_symlinks=False):
            err = remove_tree(p) or err
        else:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
            except OSError as e:
                err = err or os_error_message(e, p)
    return err


@dataclass(frozen=True)
class Candidate:
    entry: CacheEntry
    reasons: tuple[str, ...]

    @property
    def freed(self) -> int:
        return self.entry.size_on_disk


@dataclass(frozen=True)
class DeleteResult:
    deleted: tuple[tuple[str, int], ...] = ()  # (entry id, bytes freed)
    skipped: tuple[tuple[str, str], ...] = ()  # (entry id or path, why it was left)
    errors: tuple[tuple[str, str], ...] = ()  # (path, error)
    leftovers_removed: int = 0
    leftovers_freed: int = 0

    @property
    def freed(self) -> int:
        return sum(n for _, n in self.deleted) + self.leftovers_freed

    def to_dict(self) -> dict:
        return {
            "deleted": [e for e, _ in self.deleted],
            "skipped": [{"entry": e, "reason": r} for e, r in self.skipped],
            "errors": [{"path": p, "error": r} for p, r in self.errors],
            "freed": self.freed,
            "leftovers_removed": self.leftovers_removed,
        }


@dataclass(frozen=True)
class DeletePlan:
    layout: CacheLayout
    root: Path
    candidates: tuple[Candidate, ...]
    leftovers: tuple[Finding, ...] = ()
    left_alone: tuple[tuple[str, str], ...] = ()  # (entry id, why) matched but cannot be deleted
    scan_fingerprint: object = field(default=None, repr=False, compare=False)
    #: Named entries an interrupted rm had already deleted (``in_flight``): not an error.
    already_deleted: tuple[str, ...] = ()
    #: Entries holding our own temp files (a killed ``convert``'s): removed under their lock.
    locked_temps: tuple[CacheEntry, ...] = ()
    #: What the plan could not go by, and what it went by instead (access times it did not trust).
    notes: tuple[str, ...] = ()
    #: ``--max-size``: the tree's size before and after, and what the plan had to touch or leave.
    budget: object = None

    @property
    def expected_freed_size(self) -> int:
        return sum(c.freed for c in self.candidates) + sum(t.size_on_disk for t in self.leftovers)

    @property
    def expected_freed_size_str(self) -> str:
        return format_size(self.expected_freed_size)

    @property
    def empty(self) -> bool:
        return not self.candidates and not self.leftovers and not self.locked_temps

    def to_dict(self) -> dict:
        return {
            "entries": [{**c.entry.to_dict(), "reasons": list(c.reasons)} for c in self.candidates],
            "leftovers": [t.to_dict() for t in self.leftovers],
            "left_alone": [{"entry": e, "reason": r} for e, r in self.left_alone],
            "already_deleted": list(self.already_deleted),
            "temps_in": [str(e.id) for e in self.locked_temps],
            "expected_freed_size": self.expected_freed_size,
            "notes": list(self.notes),
            "budget": self.budget.to_dict() if self.budget is not None else None,
        }

    def check_writable(self) -> None:
        check_writable(self.layout, self.root)

    def execute(self) -> DeleteResult:
        deleted, skipped, errors = [], list(self.left_alone), []
        base = self.layout.base(self.root)

        def rescan(e: CacheEntry) -> CacheEntry:
            return scan_entry(self.layout, e.path, e.id, self.scan_fingerprint)

        trashed, journal = [], None
        try:
            for cand in self.candidates:
                out = delete_entry(self.layout, self.root, cand.entry, rescan)
                if out.deleted:
                    deleted.append((str(cand.entry.id), cand.freed))
                    trashed.append((cand.entry.id, out.trash, cand.entry.path))
                    if out.error:
                        errors.append((str(cand.entry.path), f"removed from the tree, but {out.error}"))
                else:
                    skipped.append((str(cand.entry.id), out.why or "not deleted"))
            if trashed:  # every entry of the plan is gone: its trash may go, the journal remembering it
                journal = write_delete_journal(self.layout, self.root, hold_owner_lock(base), [t[:2] for t in trashed])
                crashpoint("prune.journaled")
                for _, trash, path in trashed:
                    remove_tree(trash)
                    remove_empty_parents(path, base)
                    crashpoint("prune.trash_removed")
            now = time.time()
            removed = freed = 0
            for e in self.locked_temps:
                n = _remove_temps_locked(self.layout, self.root, e)
                removed += n
                freed += sum(t.size_on_disk for t in e.temp_files if t.path.name.startswith(OUR_PREFIX)) if n else 0
            for t in self.leftovers:
                try:
                    st = os.lstat(t.path)
                except FileNotFoundError:
                    continue
                if t.kind == "journal":
                    continue  # a dead deleter's: ``sweep_leftovers`` below finishes it, and counts it
                if t.kind in ("stage", "trash"):
                    ok, err = remove_leftover(base, t.path)
                    if err:
                        errors.append((str(t.path), err))
                    if not ok:
                        continue
                elif stat_mod.S_ISREG(st.st_mode) and now - st.st_mtime >= STALE_TEMP_AGE_S:
                    try:
                        os.unlink(t.path)
                    except OSError as ex:
                        errors.append((str(t.path), os_error_message(ex)))
                        continue
                else:
                    continue  # touched since the plan: a live writer
                removed += 1
                freed += t.size_on_disk
            removed += sweep_leftovers(self.layout, self.root)  # what the plan did not list (rm's)
        finally:
            release_owner_lock(base)
        if journal is not None:  # last of all, after the owner lock: a kill before it leaves the whole proof
            with contextlib.suppress(OSError):
                os.unlink(journal)  # not synced: a crash that brings it back only costs the next writer a sweep
        return DeleteResult(tuple(deleted), tuple(skipped), tuple(errors), removed, freed)


def _remove_temps_locked(layout: CacheLayout, root: Path, e: CacheEntry) -> int:
    """Our temp files in one entry, removed under its lock (never waiting: a writer holding it
    is alive, and its temp files with it)."""
    try:
        with entry_lock(layout, root, e.id, timeout=0):
            return sum(remove_our_temps(d) for d in {t.path.parent for t in e.temp_files})
    except (EntryLocked, FiAutotuneError):
        return 0


def not_ours(e: CacheEntry) -> str:
    names = ", ".join(sorted(f.path.name for f in e.foreign)[:3])
    return f"holds files that are not part of a cache ({names}); remove them by hand"


def why_left(e: CacheEntry) -> str | None:
    """Why a delete leaves ``e`` whatever selects it, or None: unreadable (what it holds is not
    known), or holding someone else's files (``delete_entry`` refuses it at execution too). Said
    in the plan, so that the dry run and the question before a delete show what the run does."""
    if e.status == EntryStatus.UNREADABLE:
        return "unreadable: " + "; ".join(e.problems)
    if not e.only_ours:
        return not_ours(e)
    return None


def _left_alone(picked: list[CacheEntry]) -> tuple[tuple[str, str], ...]:
    return tuple((str(e.id), why) for e in picked if (why := why_left(e)) is not None)


def plan_prune(
    info: CacheInfo,
    flt: EntryFilter,
    *,
    keep_latest: int | None = None,
    reader: Reader | None = None,
    now: float | None = None,
    scan_fingerprint=None,
    max_size: int | None = None,
) -> DeletePlan:
    """Entries matching every criterion, plus leftovers of interrupted writes. ``reader``: the
    FlashInfer version and arch the engine of this environment reads (``select.Reader``), which
    the one eviction order (``select.evict_class``) keeps last, for ``--keep-latest``
    (``select.beyond_latest``) and ``max_size``: of the entries the rest selects, only as many as
    it takes, in that order, for the tree to fit (``select.over_budget``); both list their rows
    in that order."""
    if flt.empty and keep_latest is None and max_size is None:
        raise UsageError(
            "nothing selected: give at least one of --older-than, --unused-for, --flashinfer-version, "
            "--other-versions, --status, --keep-latest, --max-size, --larger-than, --smaller-than, --model, --arch"
        )
    if keep_latest is not None and keep_latest < 1:  # 0 would delete every entry, each "kept"
        raise UsageError(f"--keep-latest {keep_latest}: keep at least 1 entry per deployment "
                         "(to delete entries, select them: --flashinfer-version, --status, --older-than)")
    now = time.time() if now is None else now
    info, notes = _untrusted_atimes(info, max_size is not None, flt.unused_for is not None)
    reader, ranked = reader or Reader(), keep_latest is not None or max_size is not None
    beyond = beyond_latest(info.entries, keep_latest, reader) if keep_latest is not None else {}
    def selected(e: CacheEntry):
        reasons = flt.reasons(e, now)
        if reasons is None or keep_latest is None:
            return reasons
        first = beyond.get(str(e.id))
        why = () if max_size is not None else (evict_class(e, reader)[1],)
        return None if first is None else reasons + why + (f"beyond the latest {keep_latest} of its deployment "
                                                           f"(kept: {first.id})",)

    held_by = " and ".join(w for w, on in (("--keep-latest", keep_latest is not None), ("the filters", not flt.empty))
                           if on) or "unreadable entries or others' files (never deleted)"
    evict, budget = over_budget(info.entries, max_size, lambda e: why_left(e) is None
                                and selected(e) is not None, reader, held_by) if max_size is not None else (None, None)
    candidates, picked_left = [], []
    for e in sorted(info.entries, key=lambda e: eviction_key(e, reader)) if ranked else info.entries:
        reasons = selected(e)
        if reasons is None:
            continue
        if evict is not None:
            why = evict.get(str(e.id))
            if why is None:
                continue
            reasons += (why,)
        if why_left(e) is not None:
            picked_left.append(e)
            continue
        candidates.append(Candidate(e, reasons))
    leftovers = leftovers_of(info, now)
    chosen = {c.entry.id for c in candidates}
    ours = tuple(e for e in info.entries if e.id not in chosen
                 and any(t.path.name.startswith(OUR_PREFIX) and now - t.mtime < STALE_TEMP_AGE_S for t in e.temp_files))
    notes += reader_notes(info.entries, reader) if ranked else ()
    return DeletePlan(info.layout, info.root, tuple(candidates), leftovers, _left_alone(picked_left),
                      scan_fingerprint, locked_temps=ours, notes=notes, budget=budget)


def _untrusted_atimes(info: CacheInfo, by_size: bool, by_use: bool) -> tuple[CacheInfo, tuple[str, ...]]:
    """``info`` with last use unknown on every entry where the tree's access times say nothing
    about use (``atime.atime_doubt``: a noatime mount, or a copy's access times), and notes
    saying so and what ``--max-size`` / ``--unused-for`` go by instead. Unchanged otherwise."""
    span = TimeSpan()
    for e in info.entries:
        span.add(e.last_used, e.last_modified)
    doubt = atime_doubt(info.root, span) if (by_size or by_use) else None
    if doubt is None:
        return info, ()
    notes = [f"access times cannot be trusted: {doubt}"]
    if by_size:
        notes.append("--max-size evicts by last write instead, oldest first")
    if by_use:
        notes.append("--unused-for selects nothing (last use unknown): use --older-than (last write) instead")
    entries = tuple(dataclasses.replace(e, last_used=None) for e in info.entries)
    return dataclasses.replace(info, entries=entries), tuple(notes)


def plan_rm(info: CacheInfo, refs: tuple[str, ...], resumed: dict[EntryId, Finding] | None = None) -> DeletePlan:
    """The named entries (ids, unique bare keys or paths); unknown names fail before anything.
    ``resumed``: named entries a killed ``rm`` had already taken out of the tree (``in_flight``):
    reported as already deleted, their trash dirs removed."""
    entries = info.resolve(refs)
    candidates = [Candidate(e, ("named",)) for e in entries if why_left(e) is None]
    resumed = resumed or {}
    return DeletePlan(info.layout, info.root, tuple(candidates), tuple(resumed.values()), _left_alone(entries),
                      already_deleted=tuple(sorted(map(str, resumed))))


def leftovers_of(info: CacheInfo, now: float) -> tuple[Finding, ...]:
    """Staging and trash dirs (removed if their owner is gone, checked at execution) and temp
    files older than an hour; temp files inside a candidate go with it."""
    out = [f for f in info.findings if f.kind in ("stage", "trash")
           or (f.kind == "journal" and deleted_by_dead(info.layout, info.root, f.path))]
    out += [t for t in info.stale_temp if now - t.mtime >= STALE_TEMP_AGE_S]
    return tuple(out)


def describe_result(result: DeleteResult) -> str:
    parts = [f"Deleted {plural(len(result.deleted), 'entry', 'entries')}"]
    if result.leftovers_removed:
        parts.append(f"{plural(result.leftovers_removed, 'leftover')} of interrupted writes")
    text = ", ".join(parts) + f"; freed {format_size(result.freed)}."
    if result.skipped:
        text += f" Left {plural(len(result.skipped), 'entry', 'entries')} (see below)."
    return text


def check_writable(layout: CacheLayout, root: Path) -> None:
    """Fail early, with one line, on a tree we cannot write (before asking to confirm)."""
    base = layout.base(root)
    path = base if base.exists() else Path(root)
    try:
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        raise FiAutotuneError(f"{path} is on a read-only filesystem: nothing can be deleted there")
    if not os.access(path, os.W_OK):
        raise FiAutotuneError(f"{path} is not writable by this user: nothing can be deleted there")
