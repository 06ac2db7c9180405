"""Choosing entries: the filters ``ls``, ``prune``, ``export``, ``push`` and ``pull`` share
(``EntryFilter``: every given criterion must match, and each match says why), and the one
eviction order ``prune --keep-latest``, ``prune --max-size`` and their mix go by
(``evict_class``): what no engine of this environment can read goes first (corrupt, diverged,
other FlashInfer versions, other archs, then stale), the installed version's complete entries
last; within a class ``--max-size`` goes by last use, ``--keep-latest`` keeps the newest."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Callable

from autotune_cache.autotuner.fingerprint import NO_GPU_STALENESS, Fingerprint, fingerprint_for_staleness
from autotune_cache.autotuner.installed import version_order
from autotune_cache.humanize import Duration, format_age, format_size
from autotune_cache.registry import get_layout
from autotune_cache.tree.records import CacheEntry
from autotune_cache.tree.status import EntryStatus


@dataclass(frozen=True)
class EntryFilter:
    """The filters ``ls``, ``prune`` and ``export`` share; every given one must match."""

    model: str | None = None  # the model path, exactly (as plan, check and pull take --model)
    model_glob: str | None = None  # a shell pattern over the model path, case-insensitive (--model-glob)
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
        return not (self.model or self.model_glob or self.flashinfer_versions or self.archs or self.statuses or self.older_than
                    or self.unused_for or self.other_versions_than or self.larger_than is not None
                    or self.smaller_than is not None)

    def reasons(self, e: CacheEntry, now: float) -> tuple[str, ...] | None:
        """Why ``e`` matches (for the WHY column), or None when it does not."""
        why = []
        if self.model is not None:
            if e.model != self.model:  # exact: GLM-5.1 is not GLM-5.1-FP8 (a delete must not take both)
                return None
            why.append(f"model {e.model}")
        if self.model_glob is not None:
            if e.model is None or not fnmatch.fnmatchcase(e.model.lower(), self.model_glob.lower()):
                return None
            why.append(f"model {e.model} ~ {self.model_glob}")
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


@dataclass(frozen=True)
class Reader:
    """What the engine of this environment reads: its FlashInfer version (the installed one, or
    ``--env-from``'s) and its GPU's arch (``--env-from``'s or ``--check-env``'s), each None where it
    cannot be known - then no entry is called another version's (or arch's) on a guess."""

    version: str | None = None
    arch: str | None = None
    version_from: str = "the installed one"  # or "--env-from's"

    def other_version(self, e: CacheEntry) -> bool:
        return self.version is not None and e.flashinfer_version is not None and e.flashinfer_version != self.version

    def other_arch(self, e: CacheEntry) -> bool:
        if self.arch is None or not e.arch:
            return False
        return not get_layout(e.layout).sm_archs(e.arch) & {self.arch, self.arch.rstrip("af")}


#: The eviction classes, first evicted first. Within READ: incomplete, unverified, complete.
CORRUPT, DIVERGED, OTHER_VERSION, OTHER_ARCH, STALE, READ = range(6)


def evict_class(e: CacheEntry, reader: Reader) -> tuple[int, str]:
    """(class, why) of ``e`` in the one eviction order: what no engine of this environment can
    read goes first, the installed version's complete entries last (``_status_rank`` orders
    within a class: complete after unverified after the rest)."""
    if e.status == EntryStatus.CORRUPT:
        return CORRUPT, "corrupt: no engine can load it"
    if e.status == EntryStatus.DIVERGED:
        return DIVERGED, "diverged: the engine deletes its rank files and tunes again"
    if reader.other_version(e):
        return OTHER_VERSION, (f"FlashInfer {e.flashinfer_version}: the engine reads only {reader.version}'s "
                               f"directory ({reader.version_from})")
    if reader.other_arch(e):
        return OTHER_ARCH, f"arch {e.arch}: the serving GPU is {reader.arch}"
    if e.status == EntryStatus.STALE:
        return STALE, "stale: the serving environment's FlashInfer ignores its files"
    version = (f"FlashInfer {e.flashinfer_version}, {reader.version_from}" if reader.version is not None
               else "the FlashInfer version in use unknown")
    if e.status == EntryStatus.COMPLETE:
        return READ, f"complete ({version}): the engine {'reads' if reader.version else 'may read'} it"
    if e.status == EntryStatus.UNVERIFIED:
        return READ, f"unverified ({version}): the engine may read it"
    return READ, f"{e.status} ({version}): its missing ranks tune at every start"


def reads_it(e: CacheEntry, reader: Reader) -> bool:
    """A complete entry the engine of this environment reads (or may: its version unknown)."""
    return e.status == EntryStatus.COMPLETE and evict_class(e, reader)[0] == READ


def _status_rank(e: CacheEntry) -> int:
    """Complete first, then unverified (it may be whole), then everything else."""
    return {EntryStatus.COMPLETE: 0, EntryStatus.UNVERIFIED: 1}.get(e.status, 2)


def beyond_latest(entries: tuple[CacheEntry, ...], n: int, reader: Reader | None = None) -> dict[str, CacheEntry]:
    """Per deployment, the entries beyond the ``n`` best (``n`` >= 1: keeping none is no
    "latest", and ``prune`` refuses 0). Best: the last in the eviction order (``evict_class``: the
    version the engine reads before every other, which it ignores - an entry under a version
    nobody runs, however complete, never displaces one the engine reads, even an engine-written
    unverified one); within a class complete before unverified before the rest; then the newest
    version; then the most recently modified (a ``touch`` must not outrank the version in use).
    Maps each id beyond to the entry that ranks first in its group."""
    reader = reader or Reader()
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
        group.sort(key=lambda e: evict_class(e, reader)[0], reverse=True)
        for e in group[n:]:
            out[str(e.id)] = group[0]
    return out


def last_touched(e: CacheEntry) -> tuple[float, bool]:
    """(when last used, known): the access time where the tree keeps one, else the last write
    (a lower bound: an entry read since then on a noatime mount looks older than it is)."""
    return (e.last_used, True) if e.last_used else (e.last_modified, False)


def eviction_key(e: CacheEntry, reader: Reader) -> tuple:
    """The one eviction order: class, then the rest before unverified before complete, then
    least recently used (entries whose last use is known before those known by their last write)."""
    return (evict_class(e, reader)[0], -_status_rank(e), not last_touched(e)[1], last_touched(e)[0], str(e.id))


@dataclass(frozen=True)
class Budget:
    """What a ``--max-size`` plan does to the tree's size, and what it had to touch or leave."""

    max_size: int
    tree_size: int
    after: int  # the tree's size once the plan has run
    evicts_read: tuple[str, ...] = ()  # complete entries the engine reads, evicted to fit
    left_read: int = 0  # bytes of complete entries the engine reads that stay
    held_by: str = ""  # what keeps the rest: "--keep-latest", "the filters", both

    @property
    def met(self) -> bool:
        return self.after <= self.max_size

    @property
    def message(self) -> str | None:
        budget = f"--max-size {format_size(self.max_size)}"
        if not self.met:
            read = (f"; {format_size(self.left_read)} of what stays is complete entries the engine reads"
                    if self.left_read else "")
            return (f"{budget} cannot be met: the tree stays {format_size(self.after)} after this plan "
                    f"({format_size(self.after - self.max_size)} over); the rest is kept by {self.held_by}{read}")
        if self.evicts_read:
            n = len(self.evicts_read)
            return (f"{budget} cannot be met without touching complete entries the engine reads: the plan evicts "
                    f"{n}, last ({', '.join(self.evicts_read)}); the engine tunes {'it' if n == 1 else 'them'} "
                    f"again at its next start")
        return None

    def to_dict(self) -> dict:
        return {"max_size": self.max_size, "tree_size": self.tree_size, "size_after": self.after, "met": self.met,
                "evicts_read": list(self.evicts_read), "message": self.message}


def over_budget(entries: tuple[CacheEntry, ...], budget: int, eligible: Callable[[CacheEntry], bool],
                reader: Reader | None = None, held_by: str = "the filters") -> tuple[dict[str, str], Budget]:
    """The eligible entries to evict, in the one eviction order (``eviction_key``), until the
    whole tree's size is at most ``budget`` bytes (ccache's and sccache's ``max_size``). Maps
    each id to why, in that order; and the ``Budget`` saying whether the tree then fits, and
    which complete entries the engine reads it had to touch."""
    reader = reader or Reader()
    total = sum(e.size_on_disk for e in entries)
    order = sorted((e for e in entries if eligible(e)),
                   key=lambda e: eviction_key(e, reader))
    out: dict[str, str] = {}
    touched = []
    for e in order:
        if total <= budget:
            break
        when, known = last_touched(e)
        out[str(e.id)] = (f"{evict_class(e, reader)[1]}; in its class, least recently used "
                          f"({'used' if known else 'last use unknown; written'} {format_age(when)}): the tree is "
                          f"{format_size(total)}, over --max-size {format_size(budget)}")
        total -= e.size_on_disk
        if reads_it(e, reader):
            touched.append(str(e.id))
    left = sum(e.size_on_disk for e in entries if str(e.id) not in out and reads_it(e, reader))
    return out, Budget(budget, sum(e.size_on_disk for e in entries), total, tuple(touched), left, held_by)


def reader_notes(entries: tuple[CacheEntry, ...], reader: Reader) -> tuple[str, ...]:
    """What the eviction order could not know, said where it matters (the tree holds more than
    one version, or arch): never a guess, an unknown."""
    notes = []
    if reader.version is None and len({e.flashinfer_version for e in entries} - {None}) > 1:
        notes.append("the FlashInfer version the engine runs is unknown (flashinfer-python is not installed here; "
                     "--env-from env.json names the serving image's): every version's entries are ordered alike")
    if reader.arch is None and len({e.arch for e in entries} - {None}) > 1:
        notes.append("the serving GPU's arch is unknown (--env-from env.json, from `fi-autotune env --json`, names it): "
                     "every arch's entries are ordered alike")
    return tuple(notes)


def model_hint(asked: str | None, models) -> str | None:
    """"--model matches exactly" when ``asked`` selected nothing but other models contain it (the
    old substring meaning): the pattern that would take them, never taken on a guess."""
    if not asked:
        return None
    near = sorted({m for m in models if m and m != asked and asked.lower() in m.lower()})
    if not near:
        return None
    shown = ", ".join(near[:3]) + (f" (+{len(near) - 3})" if len(near) > 3 else "")
    return f"--model matches the model path exactly; {shown} only contain{'s' if len(near) == 1 else ''} " \
           f"{asked!r}: --model-glob '*{asked}*' selects by pattern"


def judged_against(flt: EntryFilter, env_from: str | None, check_env: bool) -> tuple[Fingerprint | None, str | None]:
    """The fingerprint to judge staleness against, or None with the warning that says why.

    ``--env-from`` wins; ``--check-env`` or ``--status stale`` mean this host, which must have a
    GPU: a host without one is no serving environment, so nothing is called stale there.
    """
    wants_stale = EntryStatus.STALE in flt.statuses
    if not (env_from or check_env or wants_stale):
        return None, None
    fp = fingerprint_for_staleness(env_from, required=wants_stale)
    return fp, (NO_GPU_STALENESS if fp is None else None)
