"""``diff A B``: which (op, bucket) lookups two caches answer differently."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from autotune_cache.tree.diff import CacheUnit, DiffReport, describe_value, diff_units
from autotune_cache.tree.diff_sides import read_cache_file, store_units, tree_units, unit_of_dir, unit_of_entry
from autotune_cache.errors import ExitCode, FiAutotuneError, UsageError
from autotune_cache.autotuner.fingerprint import FIELDS
from autotune_cache.registry import default_layout
from autotune_cache.tree.store.storerecord import is_store_url
from autotune_cache.tune.session.recorded import request_of

from ..output import Output
from ..params import json_option, timeout_option
from ..serving import build_plan
from ..scanning import scan_trees


def load_side(text: str, cache_dir: str | None, scratch: Path) -> tuple[str, list[CacheUnit], bool]:
    """(label, units, by_id): a store URL or a tree root (by_id: its entries, paired by id), or
    an entry id, an entry directory or one rank file (one unit)."""
    if not text.strip():
        raise UsageError("an empty argument names no cache")
    if is_store_url(text) and not Path(text).exists():
        return store_units(text, scratch)
    p = Path(text)
    if p.is_file():
        return text, [CacheUnit(text, {p.name: read_cache_file(p, text)}, is_file=True)], False
    if p.is_dir():
        unit = unit_of_dir(p)
        if unit is not None:
            return text, [unit], False
        units = tree_units(p)
        if not units:
            raise FiAutotuneError(f"{text}: neither an entry directory nor a cache tree with entries")
        return text, units, True
    if default_layout().parse_id(text) is None and (text.startswith(("/", "./", "../", "~")) or text.endswith(".json")):
        raise FiAutotuneError(f"{text}: no such file or directory")
    found = scan_trees(cache_dir, (), [text])
    if len(found) != 1:
        raise UsageError(f"{text!r} names {len(found)} entries; give one id")
    return text, [unit_of_entry(found[0][0])], False


@click.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Tree the entry ids are looked up in [default: the engine's].")
@click.option("--measure", is_flag=True,
              help="On this GPU, time each side's tactics for every (op, bucket) that differs (the entry's "
                   "recorded request gives the layers; needs torch, flashinfer and a GPU).")
@click.option("--runs", type=click.IntRange(5, 10000), default=50, show_default=True, help="--measure: timed rounds per side (a CUDA-graph bucket times each of its graphs every round).")
@click.option("--exit-code", is_flag=True,
              help="Exit 1 when the caches differ, 0 when not, 2 on any error (as `diff`, `git diff --exit-code`).")
@timeout_option
@click.option("--all", "show_all", is_flag=True, help="List every difference (default: the first 50 per comparison).")
@json_option
def diff_cmd(a, b, cache_dir, measure, runs, exit_code, show_all, as_json):
    """Compare two caches lookup by lookup: which (op, bucket) changed tactic, which were added
    or dropped.

    A and B are each an entry id (under --cache-dir), an entry directory, a rank file, a cache
    tree root, or a store URL (s3://, gs://, file://, https://). Trees and stores are compared
    entry by entry (paired by id); an entry id against a tree or store, against its entry of that id
    (`diff ID s3://bucket/caches`: the entry and its published copy); an entry or a file against
    another entry or file.
    """
    try:
        _diff(a, b, cache_dir, measure, runs, exit_code, show_all, as_json)
    except FiAutotuneError as e:
        if exit_code and not isinstance(e, UsageError):
            e.exit_code = ExitCode.USAGE  # 1 means "they differ" here; trouble is 2, as for diff(1)
        raise


def _diff(a, b, cache_dir, measure, runs, exit_code, show_all, as_json) -> None:
    out = Output(as_json)
    with tempfile.TemporaryDirectory(prefix="fi-autotune-diff-") as tmp:
        la, ua, by_a = load_side(a, cache_dir, Path(tmp))
        lb, ub, by_b = load_side(b, cache_dir, Path(tmp))
    if by_a != by_b:  # an entry id against a tree or store: against its entry of that id
        if by_a:
            la, ua = _same_entry(la, ua, ub[0], b)
        else:
            lb, ub = _same_entry(lb, ub, ua[0], a)
        by_a = False
    report = diff_units(la, lb, ua, ub, by_id=by_a)
    measured = []
    if measure and not report.identical:
        measured = _measure(report, ua + ub, runs)

    def human() -> None:
        _print(out, report, show_all)
        if measured:
            out.line("Measured on this GPU (median; B vs A: + means B is slower)")
            out.table(["ENTRY", "OP", "TOKENS", "A_MS", "B_MS", "B_VS_A", "MODE"],
                      [[r["entry"] or "-", str(r["op"]), str(r["tokens"]), _f(r.get("a_ms")), _f(r.get("b_ms")),
                        "-" if r.get("b_vs_a") is None else f"{r['b_vs_a']:+.1%}",
                        r.get("error") or ("graph" if r.get("graph") else "eager")] for r in measured])

    out.emit(human=human, data=lambda: {**report.to_dict(), **({"measured": measured} if measure else {})})
    if exit_code and not report.identical:
        raise click.exceptions.Exit(int(ExitCode.FAILURE))


def _same_entry(label: str, units: list[CacheUnit], one: CacheUnit, one_text: str) -> tuple[str, list[CacheUnit]]:
    """Of a tree's or store's ``units``, the entry of ``one``'s id (``diff ID s3://bucket/caches``: an
    entry against its published copy); an entry dir or a file has no id to pair by."""
    if Path(one_text).exists():
        raise UsageError("compare a tree or store with a tree, a store or an entry id (its entry of that id), and an "
                         "entry dir or file with an entry or file")
    match = [u for u in units if u.label == one.label]
    if not match:
        raise FiAutotuneError(f"{label} holds no entry {one.label} (it holds {len(units)})")
    return f"{label} {one.label}", match


def _f(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def _print(out: Output, report: DiffReport, show_all: bool) -> None:
    t = report.totals
    for note in report.notes:
        out.line(f"unreadable {note}")
    for label in report.only_a:
        out.line(f"only in A  {label}")
    for label in report.only_b:
        out.line(f"only in B  {label}")
    for entry, comp in report.comparisons:
        for k, (va, vb) in comp.metadata.items():
            where = " ".join(x for x in (entry, comp.label) if x)
            out.line(f"metadata   {where + ': ' if where else ''}{k}: {va} -> {vb}"
                     + ("  (FlashInfer loads neither side's file where the other was made)" if k in FIELDS else ""))
    rows = []
    for entry, comp in report.comparisons:
        changes = comp.changes if show_all else comp.changes[:50]
        rows += [[entry or "-", comp.label or "-", c.slot.custom_op, str(c.slot.tokens if c.slot.tokens is not None else "?"),
                  c.what, describe_value(c.a), describe_value(c.b)] for c in changes]
        if len(comp.changes) > len(changes):
            rows.append([entry or "-", comp.label or "-", "...", "", f"+{len(comp.changes) - len(changes)} more (--all)", "", ""])
    if rows:
        headers = ["ENTRY", "FILE", "CUSTOM_OP", "TOKENS", "CHANGE", "A", "B"]
        keep = [i for i, h in enumerate(headers) if h not in ("ENTRY", "FILE") or any(r[i] != "-" for r in rows)]
        out.table([headers[i] for i in keep], [[r[i] for i in keep] for r in rows])
    meta = sum(bool(c.metadata) for _, c in report.comparisons)
    lookups = t["same"] + t["changed"] + t["added"] + t["dropped"]
    verdict = "identical" if report.identical else "differ"
    out.line(f"{verdict}: {lookups} lookups compared, {t['same']} same, {t['changed']} changed, {t['added']} added "
             f"(only B), {t['dropped']} dropped (only A)"
             + (f"; {len(report.only_a)} only in A, {len(report.only_b)} only in B" if report.only_a or report.only_b else "")
             + (f"; _metadata differs in {meta}" if meta else "") + (f"; {len(report.notes)} unreadable" if report.notes else ""))


def _measure(report: DiffReport, units: list[CacheUnit], runs: int) -> list[dict]:
    with_manifest = next((u for u in units if u.manifest is not None and getattr(u.manifest, "request", None)), None)
    if with_manifest is None:  # said before the import below: seconds, for nothing to measure
        raise UsageError("--measure builds the layers from the request fi-autotune warm recorded: neither side has one")
    # diffmeasure imports torch (the skeleton): only ``diff --measure`` pays for it.
    try:
        from autotune_cache.tune.diffmeasure import measure
    except ImportError as e:
        raise UsageError(f"--measure needs torch and flashinfer in this Python ({e})") from None

    class _Entry:  # what request_of reads
        id, manifest = with_manifest.label, with_manifest.manifest

    plan = build_plan(request_of(_Entry), None)
    return measure(plan, report.comparisons, rounds=runs)
