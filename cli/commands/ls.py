"""``ls``: the cache tree (or a store) as a user sees it, streamed where it can be.

A tree can hold 100,000 entries: with ``-q`` and ``--json`` in the walk's order each entry is
written as it is scanned, so memory stays flat; the table holds only its rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import click

from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.humanize import format_size, plural
from autotune_cache.registry import default_layout, get_layout, layouts as known_layouts
from autotune_cache.tree.scanner.atime import TimeSpan, atime_doubt
from autotune_cache.tree.scanner.scan import CacheEntry, iter_entries
from autotune_cache.tree.status import EntryStatus
from autotune_cache.tree.store.store import Store
from autotune_cache.tree.store.storehouse import record_views, require_store_filters
from autotune_cache.tree.store.storesweep import survey

from ..output import Mode, Output
from ..params import (
    flatten, model_hint, resolve_root, size_filters, cache_dir_option, check_env_option, entry_filter, env_from_option, filter_options, json_option, layout_option,
    quiet_option, staleness_fingerprint, timeout_option, trees,
)

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

HEADERS = ["ID", "LAYOUT", "MODEL", "GPU", "PARALLEL", "RANKS", "CONFIGS", "SIZE", "MODIFIED", "USED", "STATUS"]

#: Columns dropped, in this order, until the table fits a narrower terminal (never ID or STATUS).
FIT_DROP = ("LAYOUT", "CONFIGS", "USED", "GPU", "MODIFIED", "MODEL", "PARALLEL", "RANKS", "SIZE")

#: A note shared by more entries than this is printed once, with the count.
NOTE_REPEAT = 3

LS_HELP = """List cache entries (one per key dir) with their status.

\b
Columns:
  ID        <flashinfer version>/<arch>/<key> (SGLang); <layout>:<...> for the other layouts: what show,
            rm, export and verify take
  LAYOUT    whose tree: sglang, flashinfer-v2 (FlashInfer's managed store; CONFIGS: its entries)
  MODEL     the served model path (from fi-autotune's manifest; '-' for engine-written entries)
  GPU       the GPU the files were tuned on (H100 and H200 are both sm90 and share one path)
  PARALLEL  tp8 dp8a ep1 = tensor parallel 8, data parallel 8 with dp-attention (dp2r: 2 replicas),
            expert parallel 1; pp2 when pipelined; ep? = not recorded (no manifest)
  RANKS     rank files present / expected
  MODIFIED  last write; USED: last read by an engine (access time; 'unknown' on noatime mounts)
  STATUS    complete, unverified (no manifest: written by the engine itself; its rank count is
            only inferred from the files present), incomplete (ranks missing), diverged (rank files
            of one TP group differ: SGLang deletes and re-tunes), corrupt, stale (the fingerprint's
            FlashInfer would ignore it), unreadable

\b
With -q or --json and the default order (--sort id), entries are written as they are scanned:
memory stays flat however large the tree. Notes that many entries share are printed once.
"""


def _summary(e: CacheEntry, full: bool) -> dict:
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
class _Totals:
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


def version_hint(asked: tuple[str, ...], totals: _Totals) -> str | None:
    """"no entry under 0.7.2; the tree has 0.7.2.post1" when the versions asked for matched
    nothing: an empty listing must not read as "nothing cached for my FlashInfer"."""
    if not asked or totals.entries or not totals.versions_left_out:
        return None
    present = ", ".join(sorted(v for v in totals.versions_left_out if v))
    return f"no entry under {', '.join(asked)}; the tree has {present} (versions match exactly)"


def tree_atime_doubt(totals: _Totals, targets) -> str | None:
    """Why the USED column of what was listed is not last use (a noatime mount, a copy's
    access times), or None: asked once the walk is done."""
    return next(filter(None, (atime_doubt(root.path, totals.times) for _, root in targets)), None)


def closing_notes(out: Output, flt, totals: _Totals, targets) -> None:
    """What an empty or misleading listing needs said, on stderr once the walk is done."""
    if hint := version_hint(flt.flashinfer_versions, totals):
        out.note(hint)
    if not totals.entries and (hint := model_hint(flt.model, totals.models_left_out)):
        out.note(hint)
    if totals.entries and (doubt := tree_atime_doubt(totals, targets)):  # no USED column, nothing to doubt
        out.note(f"USED is not last use: {doubt}")


def _picker(flt, now: float, full: bool):
    """What the scan returns for each entry (maybe in a child process): its summary where the
    filters select it; where ``--flashinfer-version`` leaves it out, its version."""
    def pick(e: CacheEntry):
        if flt.reasons(e, now) is not None:
            return _summary(e, full)
        if flt.flashinfer_versions and e.flashinfer_version not in flt.flashinfer_versions:
            return {OTHER_VERSION: e.flashinfer_version}
        if flt.model and e.model and e.model != flt.model and flt.model.lower() in e.model.lower():
            return {OTHER_MODEL: e.model}
        return None
    return pick


def _first(entries, n: int):
    """The first ``n`` entries; the rest consumed unseen (so the totals count them)."""
    for i, e in enumerate(entries):
        if i < n:
            yield e


def print_notes(out: Output, notes: dict[str, list[str]]) -> None:
    """Each note once: ``<id>: <note>`` for a few entries, one counted line for many (10,000
    engine-written entries share one note; 10,000 lines of it would bury everything else)."""
    for text, ids in notes.items():
        if len(ids) <= NOTE_REPEAT:
            for i in ids:
                out.note(f"{i}: {text}")
        else:
            out.note(f"{len(ids)} entries ({ids[0]}, ...): {text}")


@click.command("ls", help=LS_HELP)
@click.argument("store", required=False, metavar="[STORE_URL]")
@cache_dir_option
@layout_option
@filter_options
@size_filters
@click.option("--sort", type=click.Choice(sorted(SORTS)), default="id", show_default=True,
              help="Order: id (version, arch, key: the order entries stream in), key, model, status; size, "
                   "modified, used: largest or newest first.")
@click.option("--reverse", is_flag=True, help="The --sort order reversed (oldest, smallest first; ids descending).")
@click.option("--limit", type=click.IntRange(min=1), default=None, metavar="N",
              help="The first N entries of the order (the footer still counts the whole tree).")
@click.option("--dir", "show_dir", is_flag=True,
              help="Print the cache root(s) ls would read (as `pip cache dir`, `uv cache dir`), existing or not.")
@env_from_option
@check_env_option
@timeout_option
@json_option
@quiet_option
def ls_cmd(store, cache_dir, layouts, model, model_glob, versions, arch, status, older_than, unused_for, larger_than, smaller_than,
           sort, reverse, limit, show_dir, env_from, check_env, as_json, quiet):
    out = Output(as_json, quiet)
    if show_dir:
        return _print_roots(out, cache_dir, layouts)
    flt = entry_filter(model, versions, arch, status, older_than, unused_for, larger_than=larger_than,
                       smaller_than=smaller_than, model_glob=model_glob)
    if store is not None:
        return _ls_store(out, store, flt, env_from)
    targets = trees(cache_dir, layouts, every_existing=True)
    fingerprint = staleness_fingerprint(env_from, check_env, flt, out)
    now = time.time()

    pick = _picker(flt, now, as_json)

    def hint_versions() -> None:
        closing_notes(out, flt, totals, targets)

    def atime() -> str | None:  # once the walk is done: every listed entry has been counted
        return tree_atime_doubt(totals, targets)

    scans = [iter_entries(root.path, pick, layout=layout, fingerprint=fingerprint) for layout, root in targets]
    totals = _Totals()

    def scanned():
        for batches, _ in scans:
            for batch in batches:
                yield from (s for s in batch if totals.count(s))

    # One tree in the walk's (= id) order streams (the table keeps only its rows); else sorted.
    if sort == "id" and not reverse and len(targets) == 1:
        entries = scanned()
    else:
        entries = iter(sorted(scanned(), key=SORTS[sort], reverse=reverse))
    if limit is not None:  # the rest is still scanned: the footer counts the whole tree
        entries = _first(entries, limit)
    where = ", ".join(str(root.path) for _, root in targets)

    def human(entries) -> None:
        rows, notes = [], {}
        for e in entries:  # 100,000 rows are held until the table's widths are known: cells shared
            rows.append(e["row"])
            for text in e["notes"]:
                notes.setdefault(text, []).append(e["id"])
        if rows:
            out.table(HEADERS, rows, fit=FIT_DROP)
        t = totals.to_dict()
        if len(rows) < t["entries"]:
            out.line(f"(the first {len(rows)} shown: --limit)")
        by_status = ", ".join(f"{n} {s}" for s, n in t["by_status"].items())
        if t["in_tree"] > t["entries"]:  # the filters left some out: say so, never "nothing cached"
            by_status = (by_status + "; " if by_status else "no entry matches the filters; ") + \
                f"{t['in_tree']} in the tree"
        by_status = by_status or "nothing cached"
        out.line(f"\n{plural(t['entries'], 'entry', 'entries')}, {plural(t['rank_files'], 'rank file')}, "
                 f"{format_size(t['size_on_disk'])} in {where} ({by_status})")
        print_notes(out, notes)
        for f in (f for _, seen in scans for f in seen):  # complete now that the walk is done
            out.note(f"{f.kind}: {f.path}: {f.message}")
        hint_versions()

    def bare(entries):
        for e in entries:
            del e["row"], e["notes"]
            yield e

    out.emit_stream(
        human=lambda: human(entries), items_key="entries", items=bare(entries),
        head={"root": str(targets[0][1].path) if len(targets) == 1 else None,
              "roots": {layout.name: str(root.path) for layout, root in targets},
              "fingerprint": fingerprint.to_dict() if fingerprint else None},
        tail=lambda: {"findings": [f.to_dict() for _, seen in scans for f in seen] + totals.foreign,
                      "totals": totals.to_dict(), "atime": {"trusted": atime() is None, "why": atime()}},
    )
    if out.mode is not Mode.HUMAN:  # the human view says it under its footer
        hint_versions()


def _print_roots(out: Output, cache_dir, layouts) -> None:
    """Each layout's root, where it comes from, and whether it exists: nothing is read."""
    names = flatten(layouts) or ([default_layout().name] if cache_dir is not None else
                                 [n for n, lay in known_layouts().items() if lay.configured()])
    roots = [(n, resolve_root(cache_dir, must_exist=False, layout=get_layout(n))) for n in names]
    def human() -> None:
        for n, r in roots:
            out.line(f"{r.path}" + ("" if len(roots) == 1 else f"  ({n})"))

    out.emit(human=human, ids=[str(r.path) for _, r in roots],
             data={"roots": [{"layout": n, "path": str(r.path), "source": r.source, "exists": r.path.is_dir()}
                             for n, r in roots]})


STORE_HEADERS = ["ID", "MODEL", "GPU", "PARALLEL", "RANKS", "SIZE", "PUSHED", "SHA256", "STATUS"]


def _ls_store(out: Output, url: str, flt, env_from: str | None) -> None:
    """``ls URL``: the entries published in a store (from its index records), filtered as the
    tree's are (``--older-than``: by push time), each with a status as ``ls`` gives one."""
    require_store_filters(flt)
    store = Store(url)
    records = store.records()
    for line in store.unreadable:  # one bad record is named, the others list
        out.warn(line)
    now = time.time()
    fp = Fingerprint.load(env_from) if env_from else None
    views = sorted((v for v in record_views(records, fp) if flt.reasons(v, now) is not None), key=lambda v: str(v.id))
    remains = survey(store, records)  # counted, never swept: ls only reads

    def human() -> None:
        def parallel(r) -> str:
            t = r.topology or {}
            if not t:
                return "-"
            dp = f" dp{t['dp']}{'a' if t.get('dp_attention') else 'r'}" if t.get("dp", 1) > 1 else ""
            return f"tp{t['tp']}{dp} ep{r.ep if r.ep is not None else '?'}"

        if views:
            out.table(STORE_HEADERS, [[str(v.id), v.model or "-", v.gpu_short, parallel(v.record), str(v.record.rank_files),
                                       v.size_on_disk_str, v.record.pushed or "-", v.record.sha256[:12], v.status.value]
                                      for v in views])
        by_status = ", ".join(f"{n} {s}" for s in EntryStatus.names()
                              if (n := sum(1 for v in views if v.status.value == s)))
        out.line(f"\n{plural(len(views), 'entry', 'entries')} in {store}" + (f" ({by_status})" if by_status else ""))
        if remains.orphans:
            out.line(f"{plural(len(remains.orphans), 'bundle')} no index record names ({format_size(sum(o.size for o in remains.orphans))}, "
                     f"left by an interrupted push or delete): {remains.sweepable(now)} go with the next push, rm or prune")

    out.emit(human=human, ids=[str(v.id) for v in views],
             data=lambda: {"store": str(store), "entries": [{**v.to_dict(), "stale": v.status == EntryStatus.STALE}
                                                            for v in views],
                           "unreadable": list(store.unreadable), "remains": remains.to_dict(now)})


