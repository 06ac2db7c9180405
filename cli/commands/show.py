"""``show``: one entry's files, ops, selection and what its engine would make of it."""

from __future__ import annotations

import click

from autotune_cache.registry import get_layout
from autotune_cache.tune.careful.quality import selection_summary
from autotune_cache.tree.scanner.scan import CacheEntry

from ..output import Output
from ..scanning import scan_trees
from ..filters import entry_filter, staleness_fingerprint
from ..params import cache_dir_option, check_env_option, env_from_option, json_option, layout_option


def entry_view(e: CacheEntry, ops) -> dict:
    return {
        **e.to_dict(),
        "manifest": e.manifest.to_dict() if e.manifest else None,
        "metadata": e.metadata,
        "ops": [{"custom_op": o.custom_op, "configs": o.configs, "buckets": o.buckets, "runners": list(o.runners)} for o in ops],
    }


def _ops_of(e: CacheEntry):
    return get_layout(e.layout).entry_ops(e.rank_files) or []  # none: one key per file, listed by --json


@click.command("show")
@click.argument("refs", nargs=-1, required=True, metavar="ID...")
@cache_dir_option
@layout_option
@env_from_option
@check_env_option
@click.option("--buckets", is_flag=True, help="Also show how each (op, bucket)'s tactic was chosen.")
@json_option
def show_cmd(refs, cache_dir, layouts, env_from, check_env, buckets, as_json):
    """Show entries: manifest, rank files, tuned ops and their bucket counts, how tactics were
    chosen (quick or careful, margins over the runner-up and the default), metadata.

    ID is <flashinfer version>/<arch>/<key> as `ls` prints it, a key that names one entry,
    or the entry's directory.
    """
    out = Output(as_json)
    fingerprint = staleness_fingerprint(env_from, check_env, entry_filter(None, (), (), (), None, None), out)
    docs = [(e, _ops_of(e)) for e, _ in scan_trees(cache_dir, layouts, refs, fingerprint)]

    def human() -> None:
        for i, (e, ops) in enumerate(docs):
            if i:
                out.line()
            _show_one(out, e, ops, buckets)

    out.emit(human=human, data=lambda: [entry_view(e, ops) for e, ops in docs], ids=[str(e.id) for e, _ in docs])


def _pct(x) -> str:
    return "-" if not isinstance(x, (int, float)) else f"{x:+.1%}"


def _center(draws) -> str:
    """What a race's time per candidate was, as the manifest records it (input draws since issue 34)."""
    if isinstance(draws, int) and draws > 1:
        return f"the mean of its medians over {draws} input draws"
    return "median"


def _graphs(instances) -> str:
    """How many CUDA graphs of each candidate a graph race timed (recorded since issue 47; one before)."""
    return f", {instances} graphs of each candidate timed every round" if isinstance(instances, int) and instances > 1 else ""


def _span(counts) -> str:
    """Over how many token counts of its bucket's range an eager race timed each candidate (since issue 47)."""
    return f", eager ones over {counts} token counts of the bucket's range" if isinstance(counts, int) and counts > 1 else ""


def _show_selection(out: Output, m, buckets: bool) -> None:
    """How each tactic was chosen, from what warm recorded (``extra.selection``)."""
    if m is None:
        out.line("Selection unknown (no fi-autotune manifest: tuned by an engine, or converted)")
        return
    sel = m.extra.get("selection") if isinstance(m.extra.get("selection"), dict) else {}
    settings = sel.get("settings") if isinstance(sel.get("settings"), dict) else {}
    mode = settings.get("mode") or m.stats.get("quality")
    if mode != "careful":
        out.line("Selection " + ("quick: one FlashInfer tune per (op, bucket), as the engine does at startup; no margins"
                                 " measured" if mode == "quick" else "not recorded (written before fi-autotune recorded it)")
                 + ("; nothing per bucket to show (warm --quality careful records it)" if buckets else ""))
        return
    graph = settings.get("graph_max_tokens")
    screen = settings.get("screen_rounds")
    keep = settings.get("keep")
    runs = (f"a {screen}-run screen, then {settings.get('race_rounds')}-{settings.get('max_rounds')} runs for those "
            f"within {_pct(keep)[1:] if isinstance(keep, (int, float)) else 'a few %'} of the fastest until it is settled"
            if screen else f"{settings.get('race_rounds')} runs each")
    out.line(f"Selection careful: {settings.get('tunes')} tunes per (op, bucket), their tactics raced against the default "
             f"({runs}, {_center(settings.get('input_draws'))}; CUDA graphs up to {graph} tokens"
             f"{_graphs(settings.get('graph_instances'))}{_span(settings.get('span'))}; "
             f"{'cold' if settings.get('cold_l2') else 'hot'} L2); default kept unless "
             f"{_pct(settings.get('threshold'))[1:]} faster")
    ops = sel.get("ops") if isinstance(sel.get("ops"), dict) else {}
    rows = []
    for op, per_bucket in sorted(ops.items()):
        s = selection_summary({op: per_bucket})
        rows.append([op, str(s["buckets"]), str(s["tuned_written"]), str(s["default_kept_by_floor"]),
                     str(s["default_fastest"]), str(s["tunes_unanimous"]), _pct(s["median_margin_over_default"]),
                     _pct(s["median_margin_over_runner_up"])])
    out.table(["OP", "BUCKETS", "TUNED", "DEFAULT<FLOOR", "DEFAULT_FASTEST", "UNANIMOUS", "VS_DEFAULT", "VS_RUNNER_UP"], rows)
    out.line("  TUNED: a tuned tactic written; DEFAULT<FLOOR: the default kept, no tactic beat it by the threshold; "
             "UNANIMOUS: every tune chose the same; VS_*: median margin of what was written")
    if not buckets:
        return
    out.line("Per bucket (TUNES: how many of the tunes chose what was written)")
    rows = []
    for op, per_bucket in sorted(ops.items()):
        for b, r in sorted(per_bucket.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
            if not isinstance(r, dict):
                continue
            rows.append([op, str(b), str(r.get("winner")), f"{r.get('tunes_agreeing')}/{r.get('tunes')}",
                         str(len(r.get("candidates") or [])), _pct(r.get("margin_default")),
                         _pct(r.get("margin_runner_up")), r.get("reason", "")])
    out.table(["OP", "BUCKET", "WRITTEN", "TUNES", "CANDIDATES", "VS_DEFAULT", "VS_RUNNER_UP", "NOTE"], rows)


def _show_one(out: Output, e: CacheEntry, ops, buckets: bool = False) -> None:
    out.line(f"Entry     {e.id}")
    out.line(f"Path      {e.path}")
    out.line(f"Status    {e.status}" + (f" ({'; '.join(e.problems)})" if e.problems else ""))
    for note in e.notes:
        out.line(f"Note      {note}")
    out.line(f"GPU       {e.gpu or 'unknown'}")
    m = e.manifest
    if m:
        out.line(f"Model     {m.model}")
        out.line(f"Schema    {m.schema}")
        out.line(f"Key str   {m.key_string}")
        for k, v in m.key_fields.to_dict().items():
            out.line(f"  {k:<20}{v}")
        out.line(f"Topology  {m.topology.describe}")
        out.line(f"Tool      fi-autotune {m.tool_version}, created {m.created}, updated {m.updated}")
        if m.stats:
            out.line("Stats     " + ", ".join(f"{k}={v}" for k, v in m.stats.items() if k != "selection"))
    else:
        out.line("Manifest  none (written by an engine, not by fi-autotune)")
        if e.topology:
            out.line(f"Topology  {get_layout(e.layout).describe_topology(e.topology)} (inferred from the rank file names)")
    out.line(f"Size      {e.size_on_disk_str}, modified {e.last_modified_str}, last used {e.last_used_str}")
    out.line("Rank files")
    expected = set(e.expected_files)
    present = {rf.name for rf in e.rank_files}
    rows = [[rf.name, rf.size_on_disk_str, str(rf.num_configs), (rf.sha256 or "-")[:12], rf.error or "ok"] for rf in e.rank_files]
    rows += [[name, "-", "-", "-", "missing"] for name in sorted(expected - present)]
    out.table(["FILE", "SIZE", "CONFIGS", "SHA256", "STATE"], rows)
    out.line("Tuned ops")
    if ops:
        out.table(["CUSTOM_OP", "CONFIGS", "BUCKETS", "RUNNERS"],
                  [[o.custom_op, str(o.configs), str(o.buckets), ",".join(o.runners)] for o in ops])
    else:
        out.line("  (none readable)")
    _show_selection(out, m, buckets)
    out.line("FlashInfer metadata")
    for k, v in sorted(e.metadata.items()):
        out.line(f"  {k:<24}{v}")
    for f in e.foreign:
        out.line(f"Foreign   {f.path.name}: {f.kind}: {f.message}")
