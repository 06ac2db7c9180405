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
    if kind in h2h and h2h.get("best") and math.isfinite(h2h[kind]) and math.isfinite(h2h["best"]):
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


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.2%}"


def table(result: dict) -> str:
    s = result.get("summary") or summarize(result)
    lines = [f"{result.get('label', result.get('workload'))} - {result.get('gpu')}: {s['items']} (op, bucket), "
             f"{s['tactics']} (op, bucket, tactic) timed; ranking stable at {s['stable']} of {s['items']} "
             f"(P(top-1 stays top-1): median {_fmt(s['p_top1_median'])}, min {_fmt(s['p_top1_min'])}; "
             f"P(best within {TIE:.1%}): min {_fmt(s['p_within_tie_min'])})", "",
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
