"""Does a tactic's time depend on where its buffers sit? (issue 47, careful behind the engine)

At 5 of 252 (op, bucket), careful's race (one process) put its pick 0.5-1.0% ahead of the engine's
and both exhaustive reference runs (two other processes) put it 0.5-0.9% behind (docs/quality.md,
"Against the engine's own pick"). Within one race, two CUDA graphs of the *same* assignment read up
to 1.7% apart (p95, calls under 30 us): more than their sampling noise would give, if each graph
(its own memory pool: its outputs and workspace at other addresses) or each process (the weights and
inputs at other addresses) has a speed of its own. This races the given tactics of one (op, bucket)
with each tactic captured ``--instances`` times (separate graphs, or separate cache files eagerly)
on ``--layers`` copies of the layer (the same values, fresh allocations behind a random pad), and
reports per instance its median and the bootstrap standard error of that median: a spread of
instance medians well beyond their errors is a placement effect, and a race that pools several
instances per candidate measures what the engine's one graph will meet on average.

    python benchmarks/race_instances.py --workload dense-fp8-tp8 --case o_proj@8:default,0 --instances 6

``--span N`` races the case at N token counts spread over the bucket's range instead of the bucket
alone: FlashInfer maps a call's token count up to the next hybrid bucket
(``map_to_hybrid_bucket_uncapped``), so one entry serves every count in (previous bucket, bucket],
and a cuBLAS tactic is an index into the algorithm list cuBLASLt gives for the exact count. Whether a
tactic that wins at the bucket still wins below it is what careful's floor is there for.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))  # siblings by name, as tactic_exhaustive imports exhaustive_report


def median_se(xs: list[float], draws: list[int] | None = None, iters: int = 500, seed: int = 0) -> float:
    """The bootstrap standard error of a candidate's time (``settle.center``: with input draws the
    mean of each draw's median), each draw's runs resampled apart."""
    from autotune_cache.tune.careful.settle import center, strata

    rng = random.Random(seed)
    parts = strata(xs, draws)
    ests = []
    for _ in range(iters):
        pool, tags = [], []
        for d, part in enumerate(parts):
            pool += rng.choices(part, k=len(part))
            tags += [d] * len(part)
        ests.append(center(pool, tags))
    return statistics.pstdev(ests)


def parse_case(text: str) -> tuple[str, int, list[str]]:
    """``op@bucket:t1,t2`` (``default`` for FlashInfer's fallback; a call of several slots - a MoE's
    gemm1 and gemm2, in that order - as ``19+83,21+83``) -> (op, bucket, tactics)."""
    head, _, tacs = text.partition(":")
    op, _, bucket = head.partition("@")
    tactics = tacs.split(",")
    if not op or not bucket.isdigit() or len(tactics) < 2 or not all(tactics):
        raise ValueError(f"--case {text!r}: expected op@bucket:tactic,tactic")
    return op, int(bucket), tactics


def span_counts(bucket: int, span: int) -> list[int]:
    """``span`` token counts from just above the previous hybrid bucket up to ``bucket``, evenly
    spaced, the bucket last: the counts whose calls read the bucket's cache entry (careful's own rule)."""
    from autotune_cache.autotuner.buckets import served_below
    from autotune_cache.tune.careful.quality import bucket_span

    if served_below("gemm", bucket) is None:
        raise ValueError(f"{bucket} is not a hybrid bucket")
    return bucket_span("gemm", bucket, span) or [bucket]


def spread_summary(meds: list[float], ses: list[float]) -> dict:
    """Instance medians of one tactic: their spread, and the spread sampling alone would give."""
    lo, hi = min(meds), max(meds)
    return {"medians_ms": [round(m, 6) for m in meds], "spread": round(hi / lo - 1, 5),
            "sd_of_medians_rel": round(statistics.pstdev(meds) / statistics.mean(meds), 5),
            "median_se_rel": round(statistics.mean(ses) / statistics.mean(meds), 5)}


def neighbours(op: dict, ops: list[dict], dev, op_layer):
    """The op's neighbours as a race context, by careful's rule and class (``context.race_contexts``,
    ``Neighbours``), each a fresh layer at seed 1 where careful reuses its tuned layers."""
    from autotune_cache.tune.careful.context import Neighbours, race_contexts

    near = race_contexts(ops, [list(range(len(ops)))]).get(ops.index(op), [])
    if not near:
        raise SystemExit(f"race_instances: --context: {op['id']} has no neighbour in the workload "
                         "(no other op counting tokens as it does, in the same phases)")
    return Neighbours([op_layer(ops[j], dev, seed=1) for j in near], [ops[j]["id"] for j in near],
                      [ops[j].get("max_tokens") for j in near])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="dense-fp8-tp8")
    ap.add_argument("--case", action="append", required=True, help="op@bucket:tactic,tactic (repeatable)")
    ap.add_argument("--instances", type=int, default=6, help="graphs (or cache files) per tactic per layer copy")
    ap.add_argument("--layers", type=int, default=2, help="layer copies (fresh allocations) per case")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--input-draws", type=int, default=1, help="token inputs rotating over this many draws (race.py)")
    ap.add_argument("--span", type=int, default=1,
                    help="race at this many token counts over the bucket's range (its entry serves them all)")
    ap.add_argument("--context", action="store_true",
                    help="the workload's other ops run untimed before every timed run, at its token count (race.py's "
                         "context: what a forward pass runs between two calls of one op)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    try:  # every case read before any GPU work: a typo in the third is not found after two races
        cases = [(text, *parse_case(text)) for text in args.case]
    except ValueError as e:
        ap.error(str(e))
    if min(args.instances, args.layers, args.rounds, args.input_draws, args.span) < 1:
        ap.error("--instances, --layers, --rounds, --input-draws and --span take 1 or more")
    try:
        counts = {case: span_counts(b, args.span) for case, _, b, _ in cases}
    except ValueError as e:
        ap.error(str(e))
    import tactic_exhaustive as te
    if args.workload not in te.WORKLOADS:
        ap.error(f"--workload {args.workload!r}: one of {', '.join(sorted(te.WORKLOADS))}")
    import torch
    from flashinfer.autotuner import autotune

    from autotune_cache.tune.careful.race import race
    from autotune_cache.tune.workers.skeleton import OpLayer

    plan, ops, dev, work = te.workload_ops(args.workload, "race-instances-")
    graph_max = plan.resolution.decode_batch * plan.resolution.attn_dp_size
    for case, _, b, _ in cases:  # before any race: the engine captures a graph at its own size only
        if len(counts[case]) > 1 and b <= graph_max:
            raise SystemExit(f"race_instances: {case}: --span is for eager buckets; {b} tokens run as a CUDA graph "
                             f"(up to {graph_max} tokens)")
    rng = random.Random(args.seed)
    rows = []
    for case, name, b, tactics in cases:
        op = next((o for o in ops if name in o["id"]), None)
        if op is None:
            raise SystemExit(f"race_instances: no op matching {name!r} in {[o['id'] for o in ops]}")
        context = neighbours(op, ops, dev, OpLayer) if args.context else None
        for tokens in counts[case]:  # the bucket alone unless --span
            per_tactic: dict[str, list[tuple[float, float]]] = {t: [] for t in tactics}
            gaps, copy_gaps = [], []
            for copy in range(args.layers):
                pad = torch.empty(rng.randrange(1, 64) << 20, dtype=torch.uint8, device=dev)  # shifts what follows
                layer = OpLayer(op, dev, seed=0)  # the same values every copy: only the placement differs
                with autotune(False):
                    layer(1)
                torch.cuda.synchronize()
                slots = te.enumerate_slots(torch, layer, b, work)
                slots.sort(key=lambda s: s["custom_op"])
                by = [{("default" if "(default)" in c["label"] else str(c["value"][1])): c for c in s["candidates"]}
                      for s in slots]
                assignment = {}
                for t in tactics:
                    parts = t.split("+")
                    if len(parts) != len(slots) or any(x not in by[k] for k, x in enumerate(parts)):
                        raise SystemExit(f"race_instances: {op['id']} @ {b}: {t!r} is not one tactic per slot of "
                                         f"{[s['custom_op'] for s in slots]}; they have {[sorted(x) for x in by]}")
                    assignment[t] = {by[k][x]["key"]: by[k][x]["value"] for k, x in enumerate(parts)}
                assignments = [assignment[t] for _ in range(args.instances) for t in tactics]
                t0 = time.perf_counter()
                r = race(layer, tokens, assignments, None, rounds=args.rounds, warmup=5, cold_l2=True, graph=tokens <= graph_max,
                         workdir=work, seed=args.seed * 1000 + copy, keep_samples=True, input_draws=args.input_draws,
                         context=context)
                samples, m = r["samples_ms"], r["medians_ms"]
                tags = r.get("samples_draw") or [None] * len(samples)
                ses = [median_se(xs, tg, seed=j) for j, (xs, tg) in enumerate(zip(samples, tags))]
                for j in range(len(samples)):
                    per_tactic[tactics[j % len(tactics)]].append((m[j], ses[j]))
                for k in range(args.instances):  # tactic 2 over tactic 1, instance k against instance k
                    gaps.append(m[k * len(tactics) + 1] / m[k * len(tactics)] - 1)
                means = [statistics.mean(m[k * len(tactics) + i] for k in range(args.instances)) for i in range(2)]
                copy_gaps.append(means[1] / means[0] - 1)
                row = {"case": case, "op": op["id"], "bucket": b, "tokens": tokens, "copy": copy, "graph": r["graph"],
                       "context": context.ids if context else [],
                       "seconds": round(time.perf_counter() - t0, 2),
                       "tactics": {t: spread_summary([m[k * len(tactics) + i] for k in range(args.instances)],
                                                     [ses[k * len(tactics) + i] for k in range(args.instances)])
                                   for i, t in enumerate(tactics)}}
                rows.append(row)
                print(json.dumps(row), flush=True)
                del layer, pad
                torch.cuda.empty_cache()
            pooled = {t: statistics.mean(x for x, _ in v) for t, v in per_tactic.items()}
            summary = {"case": case, "tokens": tokens, "summary": True,
                       "pooled_ms": {t: round(v, 6) for t, v in pooled.items()},
                       "pooled_gap": round(pooled[tactics[1]] / pooled[tactics[0]] - 1, 5),
                       "copy_gaps": [round(g, 5) for g in copy_gaps],
                       "instance_gaps": [round(g, 5) for g in gaps],
                       "instance_gap_sign_changes": sum(g > 0 for g in gaps) not in (0, len(gaps)),
                       "per_tactic": {t: spread_summary([x for x, _ in v], [s for _, s in v]) for t, v in per_tactic.items()}}
            rows.append(summary)
            print(json.dumps(summary), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"workload": args.workload, "gpu": torch.cuda.get_device_name(dev),
                                        "instances": args.instances, "layers": args.layers, "rounds": args.rounds,
                                        "input_draws": args.input_draws, "span": args.span, "context": args.context,
                                        "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
