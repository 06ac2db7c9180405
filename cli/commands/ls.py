"""``ls``: the cache tree (or a store) as a user sees it, streamed where it can be.

A tree can hold 100,000 entries: with ``-q`` and ``--json`` in the walk's order each entry is
written as it is scanned, so memory stays flat; the table holds only its rows.
"""

from __future__ import annotations

import time

import click

from autotune_cache.humanize import format_size, plural
from autotune_cache.registry import default_layout, get_layout, layouts as known_layouts
from autotune_cache.tree.listing import SORTS, Totals, picker, tree_atime_doubt, version_hint
from autotune_cache.tree.scanner.scan import iter_entries

from ..output import Mode, Output
from ..storeview import ls_store
from ..filters import model_hint, size_filters, entry_filter, filter_options, staleness_fingerprint
from ..params import flatten, cache_dir_option, check_env_option, env_from_option, json_option, layout_option, quiet_option, timeout_option
from ..roots import resolve_root, trees

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


def closing_notes(out: Output, flt, totals: Totals, targets) -> None:
    """What an empty or misleading listing needs said, on stderr once the walk is done."""
    if hint := version_hint(flt.flashinfer_versions, totals):
        out.note(hint)
    if not totals.entries and (hint := model_hint(flt.model, totals.models_left_out)):
        out.note(hint)
    if totals.entries and (doubt := tree_atime_doubt(totals, targets)):  # no USED column, nothing to doubt
        out.note(f"USED is not last use: {doubt}")


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
        return ls_store(out, store, flt, env_from)
    targets = trees(cache_dir, layouts, every_existing=True)
    fingerprint = staleness_fingerprint(env_from, check_env, flt, out)
    now = time.time()

    pick = picker(flt, now, as_json)

    def hint_versions() -> None:
        closing_notes(out, flt, totals, targets)

    def atime() -> str | None:  # once the walk is done: every listed entry has been counted
        return tree_atime_doubt(totals, targets)

    scans = [iter_entries(root.path, pick, layout=layout, fingerprint=fingerprint) for layout, root in targets]
    totals = Totals()

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
