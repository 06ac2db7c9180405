"""What ``ls`` makes of each entry and of the whole listing: the small summary a scan hands back
for an entry (computed where it was scanned, maybe in a child process, so only it crosses the
pipe), the footer's totals counted as entries go by, the sort orders, and what an empty or
misleading listing needs said (a version or model the filters left out, access times that are
not last use), and the ``Listing`` that holds all of it for one ``ls``. The CLI prints; this
module decides.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import RootChoice
from autotune_cache.tree.records import CacheEntry
from autotune_cache.tree.roots import Rooting, choose_trees, named_roots
from autotune_cache.tree.scanner.atime import TimeSpan, atime_doubt
from autotune_cache.tree.scanner.scan import iter_entries
from autotune_cache.tree.select import EntryFilter, judged_against, model_hint
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


def _first(entries: Iterator[dict], n: int) -> Iterator[dict]:
    """The first ``n`` entries; the rest consumed unseen (so the totals count them)."""
    for i, e in enumerate(entries):
        if i < n:
            yield e


@dataclass(frozen=True)
class ListingQuery:
    """What ``ls`` was asked, read once at the top: the filters, the environment staleness is
    judged against (``--env-from``, ``--check-env``), the order and how much of each entry."""

    flt: EntryFilter
    env_from: str | None = None
    check_env: bool = False
    sort: str = "id"
    reverse: bool = False
    limit: int | None = None
    full: bool = False  # each entry's whole record (``--json``), not only its row


class Listing:
    """One ``ls`` of the trees: which roots it reads (chosen here, as every reader's are: with no
    ``--cache-dir`` and no layout named, every configured layout whose root exists), the
    fingerprint staleness is judged against (``warnings`` says why there is none), then, from
    ``entries()``, each entry the query selects as its summary (``summary``), streamed in the
    walk's order where the order asked allows, the footer's totals counted as they go by. What the
    walk found that does not belong and what the listing needs said (``closing_notes``) are
    complete once the entries are consumed. Built from what the user asked, as
    ``huggingface_hub``'s cache scan is, so the CLI only prints."""

    def __init__(self, rooting: Rooting, layouts: tuple[str, ...], query: ListingQuery | None = None, *,
                 roots_only: bool = False):
        cache_dir, new_trees, say = rooting.cache_dir, rooting.new_trees, rooting.say
        self.query, self.fingerprint, self.warnings = query, None, ()
        self.roots: list[tuple[str, RootChoice]] = []  # ``ls --dir``'s answer: (layout name, root)
        self.trees: list[tuple[CacheLayout, RootChoice]] = []  # the trees the scan reads
        if roots_only:  # ``ls --dir``: where it would read, existing or not; nothing is read
            self.roots = named_roots(cache_dir, layouts, new_trees=new_trees, say=say)
        else:
            self.trees = choose_trees(cache_dir, layouts, every_existing=True, new_trees=new_trees, say=say)
            fp, warning = judged_against(query.flt, query.env_from, query.check_env)
            self.fingerprint, self.warnings = fp, (warning,) if warning else ()
        self.totals = Totals()
        self._scans: list = []

    def entries(self) -> Iterator[dict]:
        """Each entry the filters select, as ``summary`` (``full``: the whole record), in the
        query's order; one tree in the walk's order streams, any other order is sorted once all is
        scanned. With a limit the rest is still scanned: the footer counts the whole tree."""
        q = self.query
        pick = picker(q.flt, time.time(), q.full)
        self._scans = [iter_entries(root.path, pick, layout=layout, fingerprint=self.fingerprint)
                       for layout, root in self.trees]
        entries = self._scanned()
        if not (q.sort == "id" and not q.reverse and len(self.trees) == 1):
            entries = iter(sorted(entries, key=SORTS[q.sort], reverse=q.reverse))
        return entries if q.limit is None else _first(entries, q.limit)

    def _scanned(self) -> Iterator[dict]:
        for batches, _ in self._scans:
            for batch in batches:
                yield from (s for s in batch if self.totals.count(s))

    @property
    def where(self) -> str:
        return ", ".join(str(root.path) for _, root in self.trees)

    def findings(self) -> list:
        """What the walks found that does not belong (complete once the entries are consumed)."""
        return [f for _, seen in self._scans for f in seen]

    def atime_doubt(self) -> str | None:
        return tree_atime_doubt(self.totals, self.trees)

    def closing_notes(self) -> list[str]:
        """What an empty or misleading listing needs said, once the walk is done: the versions the
        tree holds when the ones asked matched nothing, the models ``--model`` (exact) missed, why
        the USED column is not last use."""
        flt, totals, notes = self.query.flt, self.totals, []
        if hint := version_hint(flt.flashinfer_versions, totals):
            notes.append(hint)
        if not totals.entries and (hint := model_hint(flt.model, totals.models_left_out)):
            notes.append(hint)
        if totals.entries and (doubt := self.atime_doubt()):  # no USED column, nothing to doubt
            notes.append(f"USED is not last use: {doubt}")
        return notes

    def head(self) -> dict:
        """``ls --json``'s fields before the entries."""
        return {"root": str(self.trees[0][1].path) if len(self.trees) == 1 else None,
                "roots": {layout.name: str(root.path) for layout, root in self.trees},
                "fingerprint": self.fingerprint.to_dict() if self.fingerprint else None}

    def tail(self) -> dict:
        """``ls --json``'s fields after the entries (asked once they are consumed)."""
        doubt = self.atime_doubt()
        return {"findings": [f.to_dict() for f in self.findings()] + self.totals.foreign,
                "totals": self.totals.to_dict(), "atime": {"trusted": doubt is None, "why": doubt}}
