"""The exhaustive reference's report: how far each pick kind (quick, careful, engine) lands from
the exhaustive best, per (op, bucket) and per token count (issue 34); read by
``tactic_exhaustive.py --report`` and its tests.

A *gap* is always a whole-call (layer) latency ratio: a slot's candidates are timed as the full call with
the other slots held fixed, so ``pick / best - 1`` is what the pick costs the layer at that token count.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune_cache.tune.careful.settle import TIE, median  # noqa: E402

#: careful-winners: careful racing its tunes' winners alone (``FI_AUTOTUNE_RACE_TOP_K=0``), as before issue 34.
KINDS = ("quick", "careful-winners", "careful", "engine")


def _gap(row: dict, kind: str) -> float | None:
    """A kind's layer-latency gap to the exhaustive best at one (op, bucket): from the head-to-head
    race of the picks when it ran, else from the exhaustive race itself."""
    pick = (row.get("picks") or {}).get(kind)
    if pick is None:
        return None
    h2h = row.get("head_to_head") or {}
    if _finite(h2h.get(kind)) and _finite(h2h.get("best")) and h2h["best"] > 0:
        return h2h[kind] / h2h["best"] - 1
    ms = pick.get("exhaustive_ms")
    best = row.get("best_ms")
    if ms is None or best is None or not math.isfinite(ms):
        return None
    return ms / best - 1


def summarize(result: dict, within: float = 0.01, limit: float = 0.03) -> dict:
    """Per pick kind over every (op, bucket): the share within ``within`` of the exhaustive best, the
    worst gap, the geometric-mean gap, how many exceed ``limit``; and the exhaustive race's confidence."""
    rows = result.get("items", [])
    kinds = {}
    for kind in KINDS:
        gaps = [g for g in (_gap(r, kind) for r in rows) if g is not None]
        if not gaps:
            continue
        # A pick faster than "best" in the head-to-head counts as 0: best is a measured reference.
        clipped = [max(g, 0.0) for g in gaps]
        worst_i = max(range(len(gaps)), key=lambda i: gaps[i])
        worst_row = [r for r in rows if _gap(r, kind) is not None][worst_i]
        kinds[kind] = {
            "items": len(gaps), "within": sum(g <= within + 1e-9 for g in gaps) / len(gaps),
            "worst_gap": gaps[worst_i], "worst_at": f"{worst_row['slot']} @ {worst_row['bucket']}",
            "over_limit": sum(g > limit + 1e-9 for g in gaps),
            "geomean_gap": math.exp(sum(math.log1p(g) for g in clipped) / len(clipped)) - 1,
            "same_as_best": sum(bool((r.get("picks") or {}).get(kind, {}).get("is_best")) for r in rows) / len(gaps),
        }
        kinds[kind]["meets_target"] = kinds[kind]["within"] >= 0.98 and kinds[kind]["worst_gap"] <= limit + 1e-9
    conf = [r["p_top1"] for r in rows if r.get("p_top1") is not None]
    tie = [r["p_within_tie"] for r in rows if r.get("p_within_tie") is not None]
    layer = []
    for row in result.get("layer", []):
        best = row.get("best_ms")
        if not best or not math.isfinite(best):
            continue
        layer.append({"tokens": row["tokens"], "best_ms": best, "graph": row.get("graph"),
                      **{k: row[k] / best - 1 for k in KINDS if row.get(k) is not None and math.isfinite(row[k])}})
    return {
        "items": len(rows), "tactics": sum(r.get("candidates", 0) for r in rows),
        "within": within, "limit": limit, "kinds": kinds,
        "stable": sum(bool(r.get("stable")) for r in rows),
        "p_top1_median": statistics.median(conf) if conf else None, "p_top1_min": min(conf) if conf else None,
        "p_within_tie_min": min(tie) if tie else None,
        "best_relative_iqr_median": median([r.get("best_relative_iqr") for r in rows]) if rows else None,
        "layer": layer,
    }


def _key(row: dict) -> tuple:
    return (row.get("op"), row["bucket"], row["slot"])


def _label(row: dict, kind: str) -> str | None:
    return ((row.get("picks") or {}).get(kind) or {}).get("label")


def _layer_gap(result: dict, row: dict, kind: str) -> float | None:
    """The kind's whole call at the row's token count against every slot at its exhaustive best."""
    for lr in result.get("layer", []):
        if lr.get("op") == row.get("op") and lr["tokens"] == row["bucket"]:
            best, mine = lr.get("best_ms"), lr.get(kind)
            if _finite(best) and best > 0 and _finite(mine):
                return mine / best - 1
    return None


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _whole_call_not_behind(p: dict, margin: float) -> bool:
    """A slot of a several-slot call behind the engine's slot, while in some run the kind's whole call
    is not ``margin`` behind the engine's whole call: the slots are halves of one choice."""
    pairs = [(a, b) for a, b in zip(p["layer"], p["engine_layer"]) if a is not None and b is not None]
    return bool(pairs) and len(pairs) == len(p["layer"]) and not all(a - b > margin + 1e-9 for a, b in pairs)


def _sweep_not_behind(row: dict, kind: str, margin: float) -> bool:
    """The reference's own sweep (every tactic, one race) puts ``kind``'s pick within ``margin`` of the
    engine's, or ahead, at this row - where its head-to-head may say otherwise."""
    picks = row.get("picks") or {}
    mine, eng = (picks.get(kind) or {}).get("exhaustive_ms"), (picks.get("engine") or {}).get("exhaustive_ms")
    return _finite(mine) and _finite(eng) and eng > 0 and mine / eng - 1 <= margin + 1e-9


def repeated(results: list[dict], within: float = 0.01, limit: float = 0.03, engine_margin: float = 0.005) -> dict:
    """What several reference runs of the same picks (``--resume DIR --remeasure``) say together.

    Why: at a 10-20 us cuBLAS GEMM two reference runs of one set of picks (separate processes, here on
    separate machines) disagree by 1-2% - Llama-3.1-70B FP8 TP8 on H200 read careful at 95.2% in one run and
    98.8% in the next, with 5 (op, bucket) over 1% in one run and none in both. So besides each run's
    strict share this reports:

    - ``within`` (with ties): an (op, bucket) is a *miss* only where every run that timed it puts it more
      than ``within`` from the best; where some run puts it within, it is a *tie*. This is the best case
      over the runs (more runs can only forgive more), so ``within_mean`` is reported beside it: a miss
      where the mean of the runs' gaps is over ``within``;
    - *interaction ties*: a call of several slots (a MoE's gemm1 and gemm2) times each slot with the
      others at the reference's best, which the kind may not have picked. A slot that misses while the
      kind's whole call at that token count is more than ``within`` *faster* than every slot at its best,
      in every run, is not a miss: careful chose the pair, and on Qwen3 EP2 at 1 token its pair runs the
      layer 6% faster than the reference's. (Faster by more than ``within``, not merely within it: the
      whole-call race reads identical picks up to 1.3 points apart.) The other way round,
      ``whole_call_misses`` lists the token counts where the kind's whole call is more than ``within``
      slower in every run - reported, not folded into the share, for that same noise;
    - ``slower_than_engine``: (op, bucket) where every run puts the kind more than ``engine_margin``
      behind the engine's own cold pick (not where the pick is the engine's, nor for a slot of a
      several-slot call whose whole call is not that far behind the engine's in some run); of those,
      ``engine_sweep_disagrees`` lists where every run's own sweep put the pick *not* that far behind:
      the reference contradicting itself (Llama FP8 TP8 qkv_proj @ 2: head-to-head +1.5% / +1.2%, sweep
      -0.5% / -0.2%), listed beside the count, not taken from it.
    Items a run lacks are judged by the runs that have them; ``unjudged`` counts those no run timed.
    """
    if len(results) < 2:
        raise ValueError("repeated needs two or more runs of the same picks")
    rows = [{_key(r): r for r in res.get("items", [])} for res in results]
    keys = list(dict.fromkeys(k for rr in rows for k in rr))
    if not any(all(k in rr for rr in rows) for k in keys):
        raise ValueError("no (op, bucket) is in every run: not runs of one workload's buckets")
    for k in keys:
        labels = {tuple(sorted((kind, p.get("label")) for kind, p in (rr[k].get("picks") or {}).items()))
                  for rr in rows if k in rr}
        if len(labels) > 1:
            raise ValueError(f"the runs hold different picks at {k[2]} @ {k[1]}: not runs of the same caches")
    slots: dict[tuple, set] = {}
    for k in keys:
        slots.setdefault((k[0], k[1]), set()).add(k[2])
    kinds = {}
    for kind in KINDS:
        per, unjudged, whole_call_misses = [], 0, []
        for k in keys:
            present = [(res, rr[k]) for res, rr in zip(results, rows) if k in rr]
            if _label(present[0][1], kind) is None:
                continue  # not a pick of these runs
            gaps = [g for g in (_gap(row, kind) for _, row in present) if g is not None]
            if not gaps:
                unjudged += 1
                continue
            many = len(slots[(k[0], k[1])]) > 1
            layer = [_layer_gap(res, row, kind) for res, row in present] if many else []
            engine_layer = [_layer_gap(res, row, "engine") for res, row in present] if many else []
            if many and layer and all(g is not None and g > within + 1e-9 for g in layer) \
                    and (k[0], k[1]) not in whole_call_misses:
                whole_call_misses.append((k[0], k[1]))
            per.append({"key": k, "gaps": gaps, "layer": layer, "engine_layer": engine_layer,
                        "sweep_not_behind": all(_sweep_not_behind(row, kind, engine_margin) for _, row in present),
                        "vs_engine": [(_gap(row, kind), _gap(row, "engine")) for _, row in present],
                        "same_as_engine": _label(present[0][1], kind) == _label(present[0][1], "engine")})
        if not per:
            continue
        over = [p for p in per if min(p["gaps"]) > within + 1e-9]
        interaction = [p for p in over if p["layer"] and all(g is not None and g < -within - 1e-9 for g in p["layer"])]
        misses = [p for p in over if p not in interaction]
        ties = [p for p in per if max(p["gaps"]) > within + 1e-9 and p not in over]
        mean_over = [p for p in per if statistics.fmean(p["gaps"]) > within + 1e-9 and p not in interaction]
        worst = max(per, key=lambda p: min(p["gaps"]))
        slower = []
        for p in per:
            pairs = [(g, e) for g, e in p["vs_engine"] if g is not None and e is not None]
            if kind != "engine" and not p["same_as_engine"] and pairs and \
                    all(g - e > engine_margin + 1e-9 for g, e in pairs) and not _whole_call_not_behind(p, engine_margin):
                slower.append(p)
        n = len(per)
        each = []
        for i in range(len(results)):
            timed = [g for g in (_gap(rows[i][p["key"]], kind) if p["key"] in rows[i] else None for p in per) if g is not None]
            each.append(sum(g <= within + 1e-9 for g in timed) / len(timed) if timed else None)
        name = lambda p: f"{p['key'][2]} @ {p['key'][1]}"  # noqa: E731
        kinds[kind] = {
            "items": n, "runs": len(results), "unjudged": unjudged, "within_each_run": each,
            "within": (n - len(misses)) / n, "within_mean": (n - len(mean_over)) / n,
            "misses": [name(p) for p in misses], "ties": len(ties), "interaction_ties": [name(p) for p in interaction],
            "whole_call_misses": [f"{op} @ {b}" if op and len({o for o, _ in slots}) > 1 else f"{b} tokens"
                                  for op, b in whole_call_misses],
            "worst_gap": min(worst["gaps"]), "worst_at": name(worst),
            "worst_single_run": max(max(p["gaps"]) for p in per),
            "over_limit": sum(min(p["gaps"]) > limit + 1e-9 for p in per),
            "slower_than_engine": [name(p) for p in slower],
            "engine_sweep_disagrees": [name(p) for p in slower if p["sweep_not_behind"]],
        }
        k_ = kinds[kind]
        k_["meets_target"] = k_["within"] >= 0.98 and k_["worst_gap"] <= limit + 1e-9
    return {"runs": len(results), "items": len(keys), "within": within, "limit": limit,
            "engine_margin": engine_margin, "kinds": kinds}


def repeated_table(results: list[dict]) -> str:
    s = repeated(results)
    first = results[0]
    lines = [f"{first.get('label', first.get('workload'))}: {s['runs']} reference runs of the same picks, "
             f"{s['items']} (op, bucket); with ties, a miss is over {s['within']:.0%} in every run (the runs' best case; "
             "'mean' counts a miss where the runs' mean gap is over)",
             "", "| kind | within each run | within, mean of runs | within, with ties | ties | interaction ties | "
                 f"whole-call misses | worst (every run) | worst (one run) | > {s['limit']:.0%} | "
                 f"> {s['engine_margin']:.1%} behind engine | target met (with ties) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for kind in KINDS:
        k = s["kinds"].get(kind)
        if k:
            each = " / ".join("-" if w is None else f"{w:.1%}" for w in k["within_each_run"])
            lines.append(f"| {kind} | {each} | {k['within_mean']:.1%} | {k['within']:.1%} "
                         f"({k['items'] - len(k['misses'])}/{k['items']}) | {k['ties']} | {len(k['interaction_ties'])} | "
                         f"{len(k['whole_call_misses'])} | {k['worst_gap']:+.2%} ({k['worst_at']}) | "
                         f"{k['worst_single_run']:+.2%} | {k['over_limit']} | {len(k['slower_than_engine'])} | "
                         f"{'yes' if k['meets_target'] else 'no'} |")
    for kind in KINDS:
        k = s["kinds"].get(kind)
        if k and (k["misses"] or k["interaction_ties"] or k["whole_call_misses"] or k["slower_than_engine"] or k["unjudged"]):
            lines.append(f"- {kind}: misses {', '.join(k['misses']) or 'none'}; interaction ties "
                         f"{', '.join(k['interaction_ties']) or 'none'}; whole-call misses {', '.join(k['whole_call_misses']) or 'none'}; "
                         f"behind engine {', '.join(k['slower_than_engine']) or 'none'}"
                         + (f" (of which the runs' own sweeps put within {s['engine_margin']:.1%} of the engine: "
                            f"{', '.join(k['engine_sweep_disagrees'])})" if k["engine_sweep_disagrees"] else "")
                         + (f"; {k['unjudged']} timed by no run" if k["unjudged"] else ""))
    return "\n".join(lines)


def identical_spreads(result: dict) -> list[dict]:
    """A/A: in each whole-call race (``layer``), the kinds whose caches hold the same assignment as
    another's (or as every slot at its best) were timed as separate candidates - separate CUDA graphs, or
    separate cache files for eager calls - of one thing. Their spread (slowest / fastest - 1) is what one
    race reads between identical candidates: the finest difference it can be trusted with."""
    by_call: dict[tuple, list[dict]] = {}
    for it in result.get("items", []):
        by_call.setdefault((it.get("op"), it["bucket"]), []).append(it)
    out = []
    for lr in result.get("layer", []):
        items = by_call.get((lr.get("op"), lr["tokens"]))
        if not items or not _finite(lr.get("best_ms")):
            continue
        groups: dict[tuple, list[float]] = {}
        groups.setdefault(tuple(_plain(it.get("best_label")) for it in items), []).append(lr["best_ms"])
        for kind in KINDS:
            if _finite(lr.get(kind)):
                groups.setdefault(tuple(_plain(_label(it, kind)) for it in items), []).append(lr[kind])
        for ts in groups.values():
            if len(ts) > 1 and min(ts) > 0:
                out.append({"spread": max(ts) / min(ts) - 1, "graph": bool(lr.get("graph")), "call_ms": lr["best_ms"],
                            "candidates": len(ts)})
    return out


def _plain(label: str | None) -> str | None:
    return None if label is None else label.replace(" (default)", "")


#: Whole-call sizes the A/A table is split by (ms): the race's resolution depends on the call's length.
AA_SIZES = ((0.0, 0.03), (0.03, 0.1), (0.1, math.inf))


def aa_table(results: list[dict]) -> str:
    rows = [s for r in results for s in identical_spreads(r)]
    lines = [f"A/A: identical candidates in one whole-call race ({len(rows)} groups in {len(results)} result files); "
             "spread = slowest / fastest - 1",
             "| mode | whole call | groups | median | p90 | p95 | max |", "|---|---|---|---|---|---|---|"]
    for graph in (True, False):
        for lo, hi in AA_SIZES:
            x = sorted(s["spread"] for s in rows if s["graph"] == graph and lo <= s["call_ms"] < hi)
            if not x:
                continue
            q = lambda p: x[min(len(x) - 1, int(p * len(x)))]  # noqa: E731
            size = f"< {hi * 1000:.0f} us" if lo == 0 else (f"> {lo * 1000:.0f} us" if math.isinf(hi) else
                                                            f"{lo * 1000:.0f}-{hi * 1000:.0f} us")
            lines.append(f"| {'CUDA graph' if graph else 'eager'} | {size} | {len(x)} | {q(0.5):.2%} | {q(0.9):.2%} | "
                         f"{q(0.95):.2%} | {x[-1]:.2%} |")
    return "\n".join(lines)


def sweep_vs_h2h(result: dict) -> list[dict]:
    """Each pick that is not the head-to-head's best, its gap read twice in one run: in the sweep
    (every tactic in one race) and in the head-to-head (the picks and the best alone). What the two
    races disagree by is what a race's composition and its draw move a gap by (docs/quality.md,
    "Race composition"): at qkv_proj @ 768 a small race read tactic 1 2 points further ahead."""
    out = []
    for it in result.get("items", []):
        h = it.get("head_to_head") or {}
        swept = {_plain(r["label"]): r["median_ms"] for r in it.get("ranking", [])}
        best = _plain(h.get("best_label"))
        if not _finite(h.get("best")) or swept.get(best) is None:
            continue
        for kind, pick in (it.get("picks") or {}).items():
            label = _plain(pick.get("label"))
            if label == best or not _finite(h.get(kind)) or swept.get(label) is None:
                continue
            out.append({"h2h": h[kind] / h["best"] - 1, "sweep": swept[label] / swept[best] - 1,
                        "graph": bool(it.get("graph")), "call_ms": it.get("best_ms") or h["best"]})
    return out


def sweep_h2h_table(results: list[dict], within: float = 0.01) -> str:
    rows = [r for res in results for r in sweep_vs_h2h(res)]
    lines = [f"A pick's gap to the best in the head-to-head minus in the sweep ({len(rows)} picks in {len(results)} "
             f"result files); flips: over {within:.0%} in one race and within it in the other",
             "| mode | call | picks | median | p10 | p90 | over only in the head-to-head | over only in the sweep |",
             "|---|---|---|---|---|---|---|---|"]
    for graph in (True, False):
        for lo, hi in AA_SIZES:
            sel = [r for r in rows if r["graph"] == graph and lo <= r["call_ms"] < hi]
            if not sel:
                continue
            x = sorted(r["h2h"] - r["sweep"] for r in sel)
            q = lambda p: x[min(len(x) - 1, int(p * len(x)))]  # noqa: E731
            size = f"< {hi * 1000:.0f} us" if lo == 0 else (f"> {lo * 1000:.0f} us" if math.isinf(hi) else
                                                            f"{lo * 1000:.0f}-{hi * 1000:.0f} us")
            only_h2h = sum(r["h2h"] > within >= r["sweep"] for r in sel)
            only_sweep = sum(r["sweep"] > within >= r["h2h"] for r in sel)
            lines.append(f"| {'CUDA graph' if graph else 'eager'} | {size} | {len(sel)} | {q(0.5) * 100:+.2f} pt | "
                         f"{q(0.1) * 100:+.2f} pt | {q(0.9) * 100:+.2f} pt | {only_h2h} | {only_sweep} |")
    return "\n".join(lines)


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.2%}"


def _spanned(result: dict) -> str:
    """How eager (op, bucket) were timed: over the token counts their entry serves (``--span``), or at
    the bucket's own count (every run before the span existed): two runs judge different things."""
    spans = [len(i["span"]) for i in result.get("items") or [] if i.get("span")]
    if not spans:
        return "; every (op, bucket) timed at its bucket's own token count"
    return f"; {len(spans)} eager (op, bucket) timed over {max(spans)} token counts of the range each entry serves"


def table(result: dict) -> str:
    s = result.get("summary") or summarize(result)
    lines = [f"{result.get('label', result.get('workload'))} - {result.get('gpu')}: {s['items']} (op, bucket), "
             f"{s['tactics']} (op, bucket, tactic) timed; ranking stable at {s['stable']} of {s['items']} "
             f"(P(top-1 stays top-1): median {_fmt(s['p_top1_median'])}, min {_fmt(s['p_top1_min'])}; "
             f"P(best within {TIE:.1%}): min {_fmt(s['p_within_tie_min'])}){_spanned(result)}", "",
             f"| kind | (op, bucket) within {s['within']:.0%} of best | worst gap | worst at | > {s['limit']:.0%} | "
             "geomean gap | same tactic as best | target met |",
             "|---|---|---|---|---|---|---|---|"]
    for kind in KINDS:
        k = s["kinds"].get(kind)
        if k:
            lines.append(f"| {kind} | {k['within']:.1%} ({k['items']}) | {k['worst_gap']:+.2%} | {k['worst_at']} | "
                         f"{k['over_limit']} | {k['geomean_gap']:+.2%} | {k['same_as_best']:.1%} | "
                         f"{'yes' if k['meets_target'] else 'no'} |")
    if s["layer"]:
        lines += ["", "Layer latency per token count (every slot from the kind's cache; vs every slot at its exhaustive best)",
                  "| tokens | best us | " + " | ".join(KINDS) + " |", "|---|---|" + "---|" * len(KINDS)]
        for row in s["layer"]:
            lines.append(f"| {row['tokens']}{'' if row.get('graph') else ' (eager)'} | {row['best_ms'] * 1000:.1f} | "
                         + " | ".join(_pct(row.get(k)) for k in KINDS) + " |")
    lines += ["", "Per (op, bucket): candidates, best, P(top-1), runner-up gap, and each kind's gap",
              "| slot | bucket | tactics | best | best us | rel IQR | P(top-1) | runner-up | " + " | ".join(KINDS) + " |",
              "|---|---|---|---|---|---|---|---|" + "---|" * len(KINDS)]
    for r in result.get("items", []):
        lines.append(f"| {r['slot']} | {r['bucket']} | {r.get('candidates')} | {r.get('best_label')} | "
                     f"{_us(r.get('best_ms'))} | {_fmt(r.get('best_relative_iqr'), '.1%')} | {_fmt(r.get('p_top1'))} | "
                     f"{_pct(r.get('runner_up_gap'))} | " + " | ".join(_pct(_gap(r, k)) for k in KINDS) + " |")
    return "\n".join(lines)


def _fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _us(ms) -> str:
    return "-" if ms is None or not math.isfinite(ms) else f"{ms * 1000:.1f}"
