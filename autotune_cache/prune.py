"""Deletion as plan-then-execute, so ``--dry-run`` prints exactly the plan that would run.

Execution re-reads each entry under its lock and skips it if anything changed since the plan
was made (a writer finished, an engine re-tuned): a plan never deletes what it did not show.
Only files that are ours to remove are touched: regular files with rank/manifest/temp names
and the engine's ``runs/`` files. Foreign files, symlinks and special files stay, and so
does any directory that still holds them.
"""

from __future__ import annotations

import os
import shutil
import stat as stat_mod
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import layout
from .atomic import key_lock
from .errors import EntryLocked, UsageError
from .humanize import format_size
from .scan import CacheEntry, CacheInfo, EntryStatus, Finding, scan_entry

#: A temp file or staging dir younger than this may belong to a writer that is still running.
STALE_TEMP_AGE_S = 3600.0


@dataclass(frozen=True)
class PruneCandidate:
    entry: CacheEntry
    reasons: tuple[str, ...]

    @property
    def files(self) -> list[Path]:
        e = self.entry
        paths = [rf.path for rf in e.rank_files] + list(e.engine_files)
        manifest = e.path / layout.MANIFEST_NAME
        paths.append(manifest)
        # A young temp file may be an engine's save in flight (engines take no lock).
        paths.extend(t.path for t in e.temp_files if time.time() - t.mtime >= STALE_TEMP_AGE_S)
        return paths

    @property
    def freed(self) -> int:
        # Foreign files stay, so they are not freed.
        return self.entry.size_on_disk - sum(f.size_on_disk for f in self.entry.foreign)


@dataclass(frozen=True)
class PruneResult:
    deleted: tuple[str, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()  # (entry id or path, why)
    errors: tuple[tuple[str, str], ...] = ()
    freed: int = 0
    temp_removed: int = 0

    def to_dict(self) -> dict:
        return {
            "deleted": list(self.deleted),
            "skipped": [{"entry": e, "reason": r} for e, r in self.skipped],
            "errors": [{"path": p, "error": r} for p, r in self.errors],
            "freed": self.freed,
            "temp_removed": self.temp_removed,
        }


@dataclass(frozen=True)
class PrunePlan:
    root: Path
    candidates: tuple[PruneCandidate, ...]
    stale_temp: tuple[Finding, ...] = ()
    check_env: object = field(default=None, repr=False, compare=False)

    @property
    def expected_freed_size(self) -> int:
        return sum(c.freed for c in self.candidates) + sum(t.size_on_disk for t in self.stale_temp)

    @property
    def expected_freed_size_str(self) -> str:
        return format_size(self.expected_freed_size)

    @property
    def empty(self) -> bool:
        return not self.candidates and not self.stale_temp

    def to_dict(self) -> dict:
        return {
            "entries": [
                {**c.entry.to_dict(), "reasons": list(c.reasons)} for c in self.candidates
            ],
            "stale_temp": [t.to_dict() for t in self.stale_temp],
            "expected_freed_size": self.expected_freed_size,
        }

    def execute(self) -> PruneResult:
        deleted, skipped, errors = [], [], []
        freed = 0
        for cand in self.candidates:
            e = cand.entry
            try:
                with key_lock(self.root, e.flashinfer_version, e.arch, e.key, timeout=0):
                    now = scan_entry(e.path, e.flashinfer_version, e.arch, self.check_env)
                    if now.fingerprint != e.fingerprint:
                        skipped.append((e.id, "changed since the plan was made"))
                        continue
                    errs = _delete_entry_files(cand)
                    _remove_empty_dirs(e.path, self.root)
            except EntryLocked:
                skipped.append((e.id, "locked by a running writer"))
                continue
            errors.extend(errs)
            if not errs:
                deleted.append(e.id)
                freed += cand.freed
        temp_removed = 0
        for t in self.stale_temp:
            try:
                st = os.lstat(t.path)
                if time.time() - st.st_mtime < STALE_TEMP_AGE_S:
                    continue  # touched since the plan: a live writer
                if t.kind == "stage" and stat_mod.S_ISDIR(st.st_mode):
                    shutil.rmtree(t.path)
                elif stat_mod.S_ISREG(st.st_mode):
                    os.unlink(t.path)
                else:
                    continue
                temp_removed += 1
                freed += t.size_on_disk
            except FileNotFoundError:
                continue
            except OSError as ex:
                errors.append((str(t.path), ex.strerror or str(ex)))
        return PruneResult(tuple(deleted), tuple(skipped), tuple(errors), freed, temp_removed)


def _delete_entry_files(cand: PruneCandidate) -> list[tuple[str, str]]:
    errors = []
    for path in cand.files:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat_mod.S_ISREG(st.st_mode):
            continue  # a symlink or special file named like ours is not ours
        try:
            os.unlink(path)
        except OSError as ex:
            errors.append((str(path), ex.strerror or str(ex)))
    runs = cand.entry.path / layout.ENGINE_RUNS_DIRNAME
    for dirpath, _, _ in sorted(os.walk(runs), key=lambda t: -len(t[0])):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass
    return errors


def _remove_empty_dirs(key_dir: Path, root: Path) -> None:
    """rmdir the key dir, then its arch and version dirs, while empty; never above the tree."""
    stop = layout.autotune_dir(root).resolve()
    path = key_dir
    for _ in range(3):
        if path.resolve() == stop:
            return
        try:
            os.rmdir(path)
        except OSError:
            return
        path = path.parent


def plan_prune(
    info: CacheInfo,
    *,
    older_than_s: float | None = None,
    flashinfer_versions: tuple[str, ...] = (),
    other_versions_than: str | None = None,
    statuses: tuple[str, ...] = (),
    keep_latest: int | None = None,
    now: float | None = None,
    check_env=None,
) -> PrunePlan:
    """Select entries matching every given criterion. Stale temp files always go."""
    if not (older_than_s is not None or flashinfer_versions or other_versions_than or statuses or keep_latest is not None):
        raise UsageError(
            "nothing selected: give at least one of --older-than, --flashinfer-version, "
            "--other-versions, --status, --keep-latest"
        )
    if keep_latest is not None and keep_latest < 0:
        raise UsageError("--keep-latest must be >= 0")
    unknown = set(statuses) - set(EntryStatus.ALL)
    if unknown:
        raise UsageError(f"unknown status {sorted(unknown)[0]!r}; known: {', '.join(EntryStatus.ALL)}")
    now = time.time() if now is None else now

    beyond_latest: set[str] = set()
    if keep_latest is not None:
        by_model: dict[str, list[CacheEntry]] = {}
        for e in info.entries:
            if e.model is not None:  # engine-written entries: model unknown, never grouped
                by_model.setdefault(e.model, []).append(e)
        for group in by_model.values():
            group.sort(key=lambda e: e.last_modified, reverse=True)
            beyond_latest.update(e.id for e in group[keep_latest:])

    candidates = []
    for e in info.entries:
        reasons = []
        if older_than_s is not None:
            if now - e.last_modified < older_than_s:
                continue
            reasons.append(f"older than {int(older_than_s)}s")
        if flashinfer_versions:
            if e.flashinfer_version not in flashinfer_versions:
                continue
            reasons.append(f"flashinfer {e.flashinfer_version}")
        if other_versions_than is not None:
            if e.flashinfer_version == other_versions_than:
                continue
            reasons.append(f"flashinfer {e.flashinfer_version} != {other_versions_than}")
        if statuses:
            if e.status not in statuses:
                continue
            reasons.append(f"status {e.status}")
        if keep_latest is not None:
            if e.id not in beyond_latest:
                continue
            reasons.append(f"beyond the latest {keep_latest} of {e.model}")
        candidates.append(PruneCandidate(e, tuple(reasons)))

    stale = tuple(t for t in info.stale_temp if now - t.mtime >= STALE_TEMP_AGE_S)
    # Temp files inside a candidate are removed with it; do not count them twice.
    inside = {t.path for c in candidates for t in c.entry.temp_files}
    stale = tuple(t for t in stale if t.path not in inside)
    return PrunePlan(info.root, tuple(candidates), stale, check_env)
