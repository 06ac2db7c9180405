"""Choosing entries: the filters ``ls``, ``prune``, ``export``, ``push`` and ``pull`` share
(``EntryFilter``: every given criterion must match, and each match says why), and the
"keep the latest N of each deployment" ranking ``prune --keep-latest`` uses, and the least-
recently-used order ``prune --max-size`` evicts in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from autotune_cache.autotuner.installed import version_order
from autotune_cache.humanize import Duration, format_age, format_size
from autotune_cache.registry import get_layout
from autotune_cache.tree.records import CacheEntry
from autotune_cache.tree.status import EntryStatus


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
    larger_than: int | None = None  # bytes on disk, strictly more
    smaller_than: int | None = None  # bytes on disk, strictly less

    @property
    def empty(self) -> bool:
        return not (self.model or self.flashinfer_versions or self.archs or self.statuses or self.older_than
                    or self.unused_for or self.other_versions_than or self.larger_than is not None
                    or self.smaller_than is not None)

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
        if self.larger_than is not None:
            if e.size_on_disk <= self.larger_than:
                return None
            why.append(f"{format_size(e.size_on_disk)}, larger than {format_size(self.larger_than)}")
        if self.smaller_than is not None:
            if e.size_on_disk >= self.smaller_than:
                return None
            why.append(f"{format_size(e.size_on_disk)}, smaller than {format_size(self.smaller_than)}")
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


def _status_rank(e: CacheEntry) -> int:
    """Complete first, then unverified (it may be whole), then everything else."""
    return {EntryStatus.COMPLETE: 0, EntryStatus.UNVERIFIED: 1}.get(e.status, 2)


def beyond_latest(entries: tuple[CacheEntry, ...], n: int, prefer_version: str | None = None) -> dict[str, CacheEntry]:
    """Per deployment, the entries beyond the ``n`` best (``n`` >= 1: keeping none is no
    "latest", and ``prune`` refuses 0). Best: first the FlashInfer version that will read them
    (``prefer_version``: the installed one, or the serving image's from ``--env-from``), since
    the engine ignores every other version's directory - an entry under a version nobody runs,
    however complete, never displaces one the engine reads (an engine-written one is unverified);
    then complete before unverified before the rest; then the newest version; then the most
    recently modified (a ``touch`` must not outrank the version in use). Maps each id beyond to
    the entry that ranks first in its group."""
    groups: dict[tuple, list[CacheEntry]] = {}
    for e in entries:
        if e.status != EntryStatus.UNREADABLE:
            groups.setdefault(deployment_of(e), []).append(e)
    out = {}
    for group in groups.values():
        # Stable sorts, least significant first.
        group.sort(key=lambda e: str(e.id))
        group.sort(key=lambda e: e.last_modified, reverse=True)
        group.sort(key=lambda e: version_order(e.flashinfer_version), reverse=True)
        group.sort(key=_status_rank)
        group.sort(key=lambda e: prefer_version is None or e.flashinfer_version != prefer_version)
        for e in group[n:]:
            out[str(e.id)] = group[0]
    return out


def last_touched(e: CacheEntry) -> tuple[float, bool]:
    """(when last used, known): the access time where the tree keeps one, else the last write
    (a lower bound: an entry read since then on a noatime mount looks older than it is)."""
    return (e.last_used, True) if e.last_used else (e.last_modified, False)


def over_budget(entries: tuple[CacheEntry, ...], budget: int, eligible: Callable[[CacheEntry], bool]) -> dict[str, str]:
    """The eligible entries to evict, least recently used first, until the whole tree's size is
    at most ``budget`` bytes (ccache's and sccache's ``max_size``). Entries whose last use is
    known go before those known only by their last write. Maps each id to why."""
    total = sum(e.size_on_disk for e in entries)
    order = sorted((e for e in entries if eligible(e)),
                   key=lambda e: (not last_touched(e)[1], last_touched(e)[0], str(e.id)))
    out: dict[str, str] = {}
    for e in order:
        if total <= budget:
            break
        when, known = last_touched(e)
        out[str(e.id)] = (f"least recently used ({'used' if known else 'last use unknown; written'} "
                          f"{format_age(when)}): the tree is {format_size(total)}, over --max-size {format_size(budget)}")
        total -= e.size_on_disk
    return out
