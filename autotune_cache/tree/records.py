"""The frozen records a scan yields: an entry (``CacheEntry``), a whole tree (``CacheInfo``),
and what does not belong (``Finding``). Plain data plus the questions commands ask of it
(ranks present, ``tp8 dp8a`` strings, finding an entry by id, key or path); reading the disk
is ``entry_scan``'s and ``walk``'s business."""

from __future__ import annotations

import os
import stat as stat_mod
from dataclasses import dataclass, field, fields
from pathlib import Path

from autotune_cache.autotuner.rankfile import RankFile
from autotune_cache.errors import FiAutotuneError
from autotune_cache.humanize import format_age, format_size
from autotune_cache.plan.topology import Topology
from autotune_cache.registry import get_layout
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId
from autotune_cache.tree.layouts.memo import memo_of
from autotune_cache.tree.lookup import wrong_tree_hint
from autotune_cache.tree.manifest import Manifest
from autotune_cache.tree.refs import named_by
from autotune_cache.tree.status import EntryStatus


@dataclass(frozen=True)
class Finding:
    """Something in the tree that is not a well-formed part of an entry."""

    path: Path
    kind: str  # foreign | symlink | special | unreadable | temp | stage | trash | journal
    message: str
    size_on_disk: int = 0
    mtime: float = 0.0

    def to_dict(self) -> dict:
        return {"path": str(self.path), "kind": self.kind, "message": self.message}


def finding_for(path: Path, st: os.stat_result, msg: str = "") -> Finding:
    """A ``Finding`` for a name that is not part of the layout, by what it is on disk."""
    if stat_mod.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        kind, msg = "symlink", msg or f"symlink to {target!r}, not followed"
    elif not (stat_mod.S_ISREG(st.st_mode) or stat_mod.S_ISDIR(st.st_mode)):
        kind, msg = "special", msg or "not a regular file or directory"
    else:
        kind, msg = "foreign", msg or "not part of the cache layout"
    size = st.st_size if stat_mod.S_ISREG(st.st_mode) else 0
    return Finding(path, kind, msg, size, st.st_mtime)



@dataclass(frozen=True)
class CacheEntry:
    """One entry: for SGLang, ``<root>/flashinfer/autotune/<version>/<arch>/<key>``."""

    id: EntryId
    path: Path
    flashinfer_version: str | None
    arch: str | None
    manifest: Manifest | None
    rank_files: tuple[RankFile, ...]
    topology: Topology | None
    status: EntryStatus
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # remarks that do not change the status ("gpu unknown here")
    engine_files: tuple[Path, ...] = ()
    temp_files: tuple[Finding, ...] = ()
    foreign: tuple[Finding, ...] = ()
    size_on_disk: int = 0
    last_modified: float = 0.0
    last_used: float | None = None  # newest access time of a data file; None: not recorded here
    state: tuple = field(default=(), repr=False, compare=False)  # stat snapshot: "changed since?"

    @classmethod
    def scanned(cls, **values) -> "CacheEntry":
        """``CacheEntry(**values)`` with every field given, set at once: the frozen ``__init__``
        sets each of the 17 fields through ``object.__setattr__``, ~5 us per entry, a tenth of
        ``ls``'s own work per entry on an engine-written tree. The same object (equality, hash
        and repr read the same attributes); a missing or unknown field is a TypeError."""
        if values.keys() != _ENTRY_FIELDS:
            raise TypeError(f"CacheEntry.scanned needs exactly its fields, not {sorted(values.keys() ^ _ENTRY_FIELDS)}")
        entry = object.__new__(cls)
        entry.__dict__.update(values)
        return entry

    @property
    def key(self) -> str:
        return self.id.name

    @property
    def layout(self) -> str:
        return self.id.layout

    @property
    def model(self) -> str | None:
        return self.manifest.model if self.manifest else None

    @property
    def expected_files(self) -> tuple[str, ...]:
        topology = self.manifest.topology if self.manifest else self.topology
        return memo_of(get_layout(self.id.layout)).expected(topology) if topology else ()

    @property
    def topology_inferred(self) -> bool:
        """The topology is a guess from the file names (no manifest): a lower bound, not a count."""
        return self.status == EntryStatus.UNVERIFIED

    def complete_for(self, expected) -> bool:
        """Complete for a reader that knows which rank files it needs (``warm``, ``check --targets``,
        a commit over it): an unverified entry holding every one of them is."""
        if self.status == EntryStatus.COMPLETE:
            return True
        names = {rf.name for rf in self.rank_files if rf.ok}
        return self.status == EntryStatus.UNVERIFIED and bool(expected) and all(n in names for n in expected)

    @property
    def present_expected(self) -> int:
        names = {rf.name for rf in self.rank_files if rf.error is None}
        return sum(map(names.__contains__, self.expected_files))

    @property
    def ranks_str(self) -> str:
        if self.topology_inferred:
            return f"{self.present_expected}/?"
        expected = self.expected_files
        return f"{self.present_expected}/{len(expected)}" if expected else "-"

    @property
    def num_configs(self) -> int:
        """Tuned keys: a rank file's (each holds them all), or, where each file is one key
        (FlashInfer's managed store), the count of readable entries."""
        counts = [rf.num_configs for rf in self.rank_files if rf.error is None]
        return get_layout(self.id.layout).entry_configs(counts)

    @property
    def ep(self) -> int | None:
        return self.manifest.key_fields.ep if self.manifest else None

    @property
    def parallel_str(self) -> str:
        return memo_of(get_layout(self.id.layout)).parallel(self.topology, self.ep, self.topology_inferred)

    def listing_cells(self) -> tuple[str, str, str, str]:
        """(GPU, PARALLEL, RANKS, CONFIGS): ``gpu_short``, ``parallel_str``, ``ranks_str`` and
        ``str(num_configs)`` from one layout lookup and one pass over the rank files. ``ls``
        asks it of every entry; asked one by one, each property looks the layout up again."""
        memo = memo_of(get_layout(self.id.layout))
        m = self.manifest
        inferred = self.status == EntryStatus.UNVERIFIED
        topology = m.topology if m else self.topology
        expected = memo.expected(topology) if topology else ()
        ok = [rf for rf in self.rank_files if rf.error is None]
        names = {rf.name for rf in ok}
        present = sum(map(names.__contains__, expected))
        ranks = f"{present}/?" if inferred else (f"{present}/{len(expected)}" if expected else "-")
        counts = [rf.num_configs for rf in ok]
        configs = memo.layout.entry_configs(counts)
        parallel = memo.parallel(self.topology, m.key_fields.ep if m else None, inferred)
        return self.gpu_short, parallel, ranks, str(configs)

    @property
    def metadata(self) -> dict:
        for rf in self.rank_files:
            if rf.error is None and rf.metadata:
                return rf.metadata
        return self.manifest.flashinfer_metadata if self.manifest else {}

    @property
    def gpu(self) -> str | None:
        value = self.metadata.get("gpu")
        return value if isinstance(value, str) and value not in ("unknown", "None") else None

    @property
    def gpu_short(self) -> str:
        g = self.gpu
        return g.removeprefix("NVIDIA ").replace(" ", "-") if g else "-"

    @property
    def size_on_disk_str(self) -> str:
        return format_size(self.size_on_disk)

    @property
    def last_modified_str(self) -> str:
        return format_age(self.last_modified)

    @property
    def last_used_str(self) -> str:
        return format_age(self.last_used)

    @property
    def only_ours(self) -> bool:
        """Nothing in the dir but engine data files, our manifest, temp files and engine side
        dirs: it may be replaced or removed as a whole without losing anyone else's file."""
        return not self.foreign

    def to_dict(self) -> dict:
        m = self.manifest
        t = self.topology
        return {
            "id": str(self.id),
            "layout": self.layout,
            "key": self.key,
            "path": str(self.path),
            "model": self.model,
            "flashinfer_version": self.flashinfer_version,
            "arch": self.arch,
            "gpu": self.gpu,
            "schema": m.schema if m else None,
            "key_fields": m.key_fields.to_dict() if m else None,
            "topology": t.to_dict() if t else None,
            "ranks_present": self.present_expected,
            "ranks_expected": None if self.topology_inferred else len(self.expected_files),
            "configs": self.num_configs,
            "size_on_disk": self.size_on_disk,
            "last_modified": self.last_modified,
            "last_used": self.last_used,
            "status": self.status.value,
            "problems": list(self.problems),
            "notes": list(self.notes),
            "has_manifest": m is not None,
            "rank_files": [
                {"name": rf.name, "size": rf.size_on_disk, "configs": rf.num_configs,
                 "sha256": rf.sha256, "error": rf.error}
                for rf in self.rank_files
            ],
            "foreign": [f.to_dict() for f in self.foreign],
        }


_ENTRY_FIELDS = frozenset(f.name for f in fields(CacheEntry))


@dataclass(frozen=True)
class CacheInfo:
    root: Path
    layout: CacheLayout
    entries: tuple[CacheEntry, ...]
    findings: tuple[Finding, ...]

    @property
    def size_on_disk(self) -> int:
        return sum(e.size_on_disk for e in self.entries)

    @property
    def size_on_disk_str(self) -> str:
        return format_size(self.size_on_disk)

    @property
    def stale_temp(self) -> tuple[Finding, ...]:
        """Temp files anywhere in the tree (entries' and loose ones)."""
        loose = tuple(f for f in self.findings if f.kind == "temp")
        return loose + tuple(t for e in self.entries for t in e.temp_files)

    def resolve(self, refs: "list[str] | tuple[str, ...]") -> list[CacheEntry]:
        """The entries named by ids (``<version>/<arch>/<key>``), unique bare keys, or entry dir
        paths, in the order given, each once. An unknown ref fails (exit 1), and so does a key or
        prefix that names several entries, listing their ids (``AmbiguousEntry``)."""
        out: list[CacheEntry] = []
        for ref in refs:
            for e in self.find(ref):
                if e not in out:
                    out.append(e)
        return out

    def find(self, ref: str) -> list[CacheEntry]:
        """The entries ``ref`` names: an id, a key or a unique key prefix (``named_by``, the
        rules a store's listing is read by too), or an entry's path. A key or prefix that names
        several is refused, listing them."""
        matches = named_by(ref, self.entries, (self.layout,))
        if matches:
            return matches
        p = Path(ref)
        if ("/" in ref or p.is_absolute()) and os.path.lexists(p):
            real = p.resolve()
            matches = [e for e in self.entries if e.path.resolve() == real]
            if matches:
                return matches
        raise FiAutotuneError(f"no cache entry {ref!r} under {self.root}",
                              hint=wrong_tree_hint(self.layout, ref) or "`fi-autotune ls -q` lists the ids")

