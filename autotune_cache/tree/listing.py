"""What ``ls`` makes of each entry and of the whole listing: the small summary a scan hands back
for an entry (computed where it was scanned, maybe in a child process, so only it crosses the
pipe), the footer's totals counted as entries go by, the sort orders, and what an empty or
misleading listing needs said (a version or model the filters left out, access times that are
not last use). The CLI prints; this module decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune_cache.tree.records import CacheEntry
from autotune_cache.tree.scanner.atime import TimeSpan, atime_doubt
from autotune_cache.tree.status import EntryStatus

SORTS = {
    # part by part, as the tree is walked ("0.7.2" before "0.7.2.post1"): the streamed order
    "id": lambda e: e["id"].split("/"),
    "key": lambda e: (e["key"], e["id"].split("/")),
    "model": lambda e: ((e["model"] or "~").lower(), e["id"].split("/")),
    "size": lambda e: (-e["size_on_disk"], e["id"].split("/")),
    "modified": lambda e: (-e["last_modified"], e["id"].split("/")),
    "used": lambda e: (-(e["last_used"] or 0), e["id"].split("/")),
    "status": lambda e: (e["status"], e["id"].split("/")),
}


def summary(e: CacheEntry, full: bool) -> dict:
    """What ls needs of an entry, computed where it was scanned (maybe a child process), so only
    this small dict crosses the pipe. The row's cells are interned (``_CELLS``): the ones many
    rows share (sizes, ages, statuses) cross the pipe once per batch and are kept once."""
    ident, status, model = str(e.id), e.status.value, e.model
    d = e.to_dict() if full else {
        "id": ident, "key": e.key, "model": model, "status": status,
        "size_on_disk": e.size_on_disk, "last_modified": e.last_modified, "last_used": e.last_used,
        "rank_files": len(e.rank_files),
    }
    gpu, parallel, ranks, configs = e.listing_cells()
    cells = (e.layout, model or "-", gpu, parallel, ranks, configs, e.size_on_disk_str, e.last_modified_str,
             e.last_used_str, status)
    d["row"] = (ident, *(map(_CELLS.setdefault, cells, cells) if len(_CELLS) < MAX_CELLS else cells))
    d["notes"] = (list(e.problems) + list(e.notes) + [f"{f.kind}: {f.path.name}: {f.message}" for f in e.foreign])
    return d


#: Distinct cell strings kept for sharing (per process; one string object per distinct cell: a
#: table of 100,000 rows holds a few hundred strings besides the ids, and pickle sends each shared
#: one once per batch). Past the bound (at most 9 over it) a row's cells are its own strings.
MAX_CELLS = 65536
_CELLS: dict[str, str] = {}


@dataclass
class Totals:
    """The footer, counted as the entries go by (the entries themselves need not stay)."""

    entries: int = 0
    rank_files: int = 0
    size_on_disk: int = 0
    by_status: dict = field(default_factory=dict)
    in_tree: int = 0  # before the filters: an empty answer is not an empty tree
    foreign: list = field(default_factory=list)
    versions_left_out: set = field(default_factory=set)  # of the entries --flashinfer-version left out
    models_left_out: set = field(default_factory=set)  # models --model (exact) left out that contain it
    times: TimeSpan = field(default_factory=TimeSpan)  # of those listed: can their USED be trusted?

    def count(self, s: dict | None) -> bool:
        self.in_tree += 1
        if s is None or OTHER_VERSION in s or OTHER_MODEL in s:
            if s is not None and OTHER_VERSION in s:
                self.versions_left_out.add(s[OTHER_VERSION])
            if s is not None and OTHER_MODEL in s:
                self.models_left_out.add(s[OTHER_MODEL])
            return False
        self.entries += 1
        self.times.add(s["last_used"], s["last_modified"])
        self.rank_files += s["rank_files"] if isinstance(s["rank_files"], int) else len(s["rank_files"])
        self.size_on_disk += s["size_on_disk"]
        self.by_status[s["status"]] = self.by_status.get(s["status"], 0) + 1
        self.foreign += s.get("foreign", ())
        return True

    def to_dict(self) -> dict:
        order = EntryStatus.names()
        return {"entries": self.entries, "rank_files": self.rank_files, "size_on_disk": self.size_on_disk,
                "by_status": {k: self.by_status[k] for k in order if self.by_status.get(k)},
                "in_tree": self.in_tree}


#: What ``pick`` returns for an entry ``--flashinfer-version`` left out: its version, so an empty
#: answer can name the versions the tree does hold (``0.7.2`` asked, ``0.7.2.post1`` there).
OTHER_VERSION = "other_version"
#: ... and for an entry ``--model`` (exact) left out whose model contains it: that model.
OTHER_MODEL = "other_model"


def version_hint(asked: tuple[str, ...], totals: Totals) -> str | None:
    """"no entry under 0.7.2; the tree has 0.7.2.post1" when the versions asked for matched
    nothing: an empty listing must not read as "nothing cached for my FlashInfer"."""
    if not asked or totals.entries or not totals.versions_left_out:
        return None
    present = ", ".join(sorted(v for v in totals.versions_left_out if v))
    return f"no entry under {', '.join(asked)}; the tree has {present} (versions match exactly)"


def tree_atime_doubt(totals: Totals, targets) -> str | None:
    """Why the USED column of what was listed is not last use (a noatime mount, a copy's
    access times), or None: asked once the walk is done."""
    return next(filter(None, (atime_doubt(root.path, totals.times) for _, root in targets)), None)


def picker(flt, now: float, full: bool):
    """What the scan returns for each entry (maybe in a child process): its summary where the
    filters select it; where ``--flashinfer-version`` leaves it out, its version."""
    def pick(e: CacheEntry):
        if flt.reasons(e, now) is not None:
            return summary(e, full)
        if flt.flashinfer_versions and e.flashinfer_version not in flt.flashinfer_versions:
            return {OTHER_VERSION: e.flashinfer_version}
        if flt.model and e.model and e.model != flt.model and flt.model.lower() in e.model.lower():
            return {OTHER_MODEL: e.model}
        return None
    return pick
