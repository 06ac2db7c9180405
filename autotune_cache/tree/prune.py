"""Selecting entries (``ls``, ``prune``, ``rm``, ``export`` filters) and deleting them as
plan-then-execute, so ``--dry-run`` prints exactly the plan that would run.

Execution deletes each entry in one step (``txn.delete_entry``): under its lock, after checking
that it is still what the plan showed, the entry dir is renamed to a trash name and removed. An
entry that changed, is locked by a writer, or holds files that are not a cache's stays, and the
result says which and why. Leftovers of interrupted writes (staging and trash dirs whose owner
is gone, temp files older than an hour) are removed too.
"""

from __future__ import annotations

import os
import stat as stat_mod
import time
from dataclasses import dataclass, field
from pathlib import Path

from autotune_cache.errors import FiAutotuneError, UsageError, os_error_message
from autotune_cache.humanize import Duration, format_size, plural
from autotune_cache.engines.layouts import CacheLayout, get_layout
from autotune_cache.tree.scan import CacheEntry, CacheInfo, Finding, scan_entry
from autotune_cache.tree.status import EntryStatus
from autotune_cache.tree.txn import delete_entry, recover_journals, release_owner_lock, remove_leftover

#: A temp file younger than this may be an engine's save in flight (engines take no lock).
STALE_TEMP_AGE_S = 3600.0


@dataclass(frozen=True)
class EntryFilter:
    """The filters ``ls``, ``prune`` and ``export`` share; every given one must match."""

    model: str | None = None  # substring of the model path, case-insensitive
    flashinfer_versions: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()
    statuses: tuple[EntryStatus, ...] = ()
    older_than: Duration | None = None  # not modified for this long
    unused_for: Duration | None = None  # not read for this long (access time)
    other_versions_than: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.model or self.flashinfer_versions or self.archs or self.statuses or self.older_than
                    or self.unused_for or self.other_versions_than)

    def reasons(self, e: CacheEntry, now: float) -> tuple[str, ...] | None:
        """Why ``e`` matches (for the WHY column), or None when it does not."""
        why = []
        if self.model is not None:
            if e.model is None or self.model.lower() not in e.model.lower():
                return None
            why.append(f"model {e.model}")
        if self.flashinfer_versions:
            if e.flashinfer_version not in self.flashinfer_versions:
                return None
            why.append(f"flashinfer {e.flashinfer_version}")
        if self.other_versions_than is not None:
            if e.flashinfer_version is None or e.flashinfer_version == self.other_versions_than:
                return None  # a version we cannot read is never "another" one: no deleting on a guess
            why.append(f"flashinfer {e.flashinfer_version}, not the installed {self.other_versions_than}")
        if self.archs:
            if not get_layout(e.layout).sm_archs(e.arch) & set(self.archs):
                return None
            why.append(f"arch {e.arch}")
        if self.statuses:
            if e.status not in self.statuses:
                return None
            why.append(f"status {e.status}")
        if self.older_than is not None:
            if not e.last_modified or now - e.last_modified < self.older_than.seconds:
                return None
            why.append(f"not modified for {self.older_than}")
        if self.unused_for is not None:
            if e.last_used is None or now - e.last_used < self.unused_for.seconds:
                return None  # last use unknown (noatime): never selected on a guess
            why.append(f"not used for {self.unused_for}")
        return tuple(why)


def deployment_of(e: CacheEntry) -> tuple:
    """Entries that serve the same deployment: same layout, arch and key. The key hashes every
    field of the serving flags but the FlashInfer version, which is the directory above it."""
    return (e.layout, e.arch, e.key)


def beyond_latest(entries: tuple[CacheEntry, ...], n: int) -> dict[str, CacheEntry]:
    """Per deployment, the entries beyond the ``n`` best: complete ones first (an incomplete
    entry is never kept over a complete one), then the most recently modified. Maps each id
    beyond to the entry that ranks first in its group."""
    groups: dict[tuple, list[CacheEntry]] = {}
    for e in entries:
        if e.status != EntryStatus.UNREADABLE:
            groups.setdefault(deployment_of(e), []).append(e)
    out = {}
    for group in groups.values():
        group.sort(key=lambda e: (e.status != EntryStatus.COMPLETE, -e.last_modified, str(e.id)))
        for e in group[n:]:
            out[str(e.id)] = group[0]
    return out


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
    recovered: tuple[str, ...] = ()

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
            "recovered": list(self.recovered),
        }


@dataclass(frozen=True)
class DeletePlan:
    layout: CacheLayout
    root: Path
    candidates: tuple[Candidate, ...]
    leftovers: tuple[Finding, ...] = ()
    left_alone: tuple[tuple[str, str], ...] = ()  # (entry id, why) matched but cannot be deleted
    scan_fingerprint: object = field(default=None, repr=False, compare=False)

    @property
    def expected_freed_size(self) -> int:
        return sum(c.freed for c in self.candidates) + sum(t.size_on_disk for t in self.leftovers)

    @property
    def expected_freed_size_str(self) -> str:
        return format_size(self.expected_freed_size)

    @property
    def empty(self) -> bool:
        return not self.candidates and not self.leftovers

    def to_dict(self) -> dict:
        return {
            "entries": [{**c.entry.to_dict(), "reasons": list(c.reasons)} for c in self.candidates],
            "leftovers": [t.to_dict() for t in self.leftovers],
            "left_alone": [{"entry": e, "reason": r} for e, r in self.left_alone],
            "expected_freed_size": self.expected_freed_size,
        }

    def execute(self) -> DeleteResult:
        deleted, skipped, errors = [], list(self.left_alone), []
        base = self.layout.base(self.root)
        recovered = tuple(recover_journals(self.layout, self.root))

        def rescan(e: CacheEntry) -> CacheEntry:
            return scan_entry(self.layout, e.path, e.id, self.scan_fingerprint)

        try:
            for cand in self.candidates:
                out = delete_entry(self.layout, self.root, cand.entry, rescan)
                if out.deleted:
                    deleted.append((str(cand.entry.id), cand.freed))
                    if out.error:
                        errors.append((str(cand.entry.path), f"removed from the tree, but {out.error}"))
                else:
                    skipped.append((str(cand.entry.id), out.why or "not deleted"))
            removed = freed = 0
            now = time.time()
            for t in self.leftovers:
                try:
                    st = os.lstat(t.path)
                except FileNotFoundError:
                    continue
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
        finally:
            release_owner_lock(base)
        return DeleteResult(tuple(deleted), tuple(skipped), tuple(errors), removed, freed, recovered)


def _left_alone(info: CacheInfo, picked: list[CacheEntry]) -> tuple[tuple[str, str], ...]:
    out = []
    for e in picked:
        if e.status == EntryStatus.UNREADABLE:
            out.append((str(e.id), "unreadable: " + "; ".join(e.problems)))
    return tuple(out)


def plan_prune(
    info: CacheInfo,
    flt: EntryFilter,
    *,
    keep_latest: int | None = None,
    now: float | None = None,
    scan_fingerprint=None,
) -> DeletePlan:
    """Entries matching every criterion, plus leftovers of interrupted writes."""
    if flt.empty and keep_latest is None:
        raise UsageError(
            "nothing selected: give at least one of --older-than, --unused-for, --flashinfer-version, "
            "--other-versions, --status, --keep-latest, --model, --arch"
        )
    if keep_latest is not None and keep_latest < 0:
        raise UsageError("--keep-latest must be >= 0")
    now = time.time() if now is None else now
    beyond = beyond_latest(info.entries, keep_latest) if keep_latest is not None else {}
    candidates, picked_unreadable = [], []
    for e in info.entries:
        reasons = flt.reasons(e, now)
        if reasons is None:
            continue
        if keep_latest is not None:
            first = beyond.get(str(e.id))
            if first is None:
                continue
            reasons += (f"beyond the latest {keep_latest} of its deployment (kept: {first.id})",)
        if e.status == EntryStatus.UNREADABLE:
            picked_unreadable.append(e)
            continue
        candidates.append(Candidate(e, reasons))
    leftovers = leftovers_of(info, now)
    return DeletePlan(info.layout, info.root, tuple(candidates), leftovers, _left_alone(info, picked_unreadable),
                      scan_fingerprint)


def plan_rm(info: CacheInfo, refs: tuple[str, ...]) -> DeletePlan:
    """The named entries (ids, unique bare keys or paths); unknown names fail before anything."""
    entries = info.resolve(refs)
    candidates = [Candidate(e, ("named",)) for e in entries if e.status != EntryStatus.UNREADABLE]
    unreadable = [e for e in entries if e.status == EntryStatus.UNREADABLE]
    return DeletePlan(info.layout, info.root, tuple(candidates), (), _left_alone(info, unreadable))


def leftovers_of(info: CacheInfo, now: float) -> tuple[Finding, ...]:
    """Staging and trash dirs (removed if their owner is gone, checked at execution) and temp
    files older than an hour; temp files inside a candidate go with it."""
    out = [f for f in info.findings if f.kind in ("stage", "trash")]
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
