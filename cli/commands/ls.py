"""``ls``: the cache tree (or a store) as a user sees it, streamed where it can be.

A tree can hold 100,000 entries: with ``-q`` and ``--json`` in the walk's order each entry is
written as it is scanned, so memory stays flat; the table holds only its rows.
"""

from __future__ import annotations

import click

from autotune_cache.humanize import format_size, plural
from autotune_cache.tree.listing import SORTS, Listing, ListingQuery
from autotune_cache.tree.store.storehouse import StoreListing

from ..output import Mode, Output
from ..storeview import ls_store
from ..filters import size_filters, entry_filter, filter_options
from ..params import flatten, cache_dir_option, check_env_option, env_from_option, json_option, layout_option, quiet_option, timeout_option
from ..roots import rooting

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
    roots, names = rooting(cache_dir), flatten(layouts)
    if show_dir:
        where = Listing(roots, names, roots_only=True)
        return _print_roots(out, where)
    flt = entry_filter(model, versions, arch, status, older_than, unused_for, larger_than=larger_than,
                       smaller_than=smaller_than, model_glob=model_glob)
    if store is not None:
        published = StoreListing(store, flt, env_from)
        return ls_store(out, published)
    query = ListingQuery(flt, env_from, check_env, sort, reverse, limit, full=as_json)
    listing = Listing(roots, names, query)
    for warning in listing.warnings:
        out.warn(warning)
    entries = listing.entries()
    totals = listing.totals

    def closing_notes() -> None:
        for note in listing.closing_notes():
            out.note(note)

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
                 f"{format_size(t['size_on_disk'])} in {listing.where} ({by_status})")
        print_notes(out, notes)
        for f in listing.findings():  # complete now that the walk is done
            out.note(f"{f.kind}: {f.path}: {f.message}")
        closing_notes()

    def bare(entries):
        for e in entries:
            del e["row"], e["notes"]
            yield e

    out.emit_stream(human=lambda: human(entries), items_key="entries", items=bare(entries),
                    head=listing.head(), tail=listing.tail)
    if out.mode is not Mode.HUMAN:  # the human view says it under its footer
        closing_notes()


def _print_roots(out: Output, listing: Listing) -> None:
    """Each layout's root, where it comes from, and whether it exists: nothing is read."""
    roots = listing.roots

    def human() -> None:
        for n, r in roots:
            out.line(f"{r.path}" + ("" if len(roots) == 1 else f"  ({n})"))

    out.emit(human=human, ids=[str(r.path) for _, r in roots],
             data={"roots": [{"layout": n, "path": str(r.path), "source": r.source, "exists": r.path.is_dir()}
                             for n, r in roots]})
