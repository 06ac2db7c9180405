"""Does a tactic order depend on the call's token inputs? (issue 34, Mixtral at 1024 tokens)

Careful's races and the exhaustive reference, in two processes, timed the same two (gemm1, gemm2)
pairs of Mixtral-8x7B TP2 at 1024 tokens with the same inputs and ranked them in opposite orders,
each clearly (3.5%). This races the given pairs of one bucket in one process, head to head, with
the layer's weights fixed and the token inputs (routing, activations) drawn from several seeds,
then with other weights: if the order follows the seed, the "best tactic" of a bucket is a
property of its inputs, and one draw cannot decide it.

    python benchmarks/race_inputs.py --workload mixtral-bf16 --bucket 1024 --pairs 32,79 33,79 --seeds 0,1,2,3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))  # siblings by name, as tactic_exhaustive imports exhaustive_report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="mixtral-bf16")
    ap.add_argument("--bucket", type=int, default=1024)
    ap.add_argument("--pairs", nargs="+", default=["32,79", "33,79"], help="gemm1,gemm2 tactics per candidate")
    ap.add_argument("--seeds", default="0,1,2,3", help="token-input seeds (the weights stay those of seed 0)")
    ap.add_argument("--weight-seeds", default="0,1", help="layer seeds (weights and inputs)")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--input-draws", type=int, default=1,
                    help="also race with the token inputs rotating over this many draws (race.py's input_draws)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import tactic_exhaustive as te
    import torch
    from flashinfer.autotuner import autotune

    from autotune_cache.tune.careful.race import race
    from autotune_cache.tune.workers.skeleton import OpLayer

    plan, ops, dev, work = te.workload_ops(args.workload, "race-inputs-")
    b = args.bucket
    graph = b <= plan.resolution.decode_batch * plan.resolution.attn_dp_size
    rows = []
    for ws in [int(s) for s in args.weight_seeds.split(",")]:
        layer = OpLayer(ops[0], dev, seed=ws)
        with autotune(False):
            layer(1)
        torch.cuda.synchronize()
        slots = sorted(te.enumerate_slots(torch, layer, b, work), key=lambda s: s["custom_op"])  # gemm1, gemm2
        by_tactic = [{c["value"][1]: c for c in s["candidates"]} for s in slots]
        assignments = []
        for pair in args.pairs:
            tactics = [int(t) for t in pair.split(",")]
            assignments.append({by_tactic[i][t]["key"]: by_tactic[i][t]["value"] for i, t in enumerate(tactics)})
        for s in [int(x) for x in args.seeds.split(",")] if ws == 0 else [ws]:
            layer.seed = s  # token inputs only: the weights were drawn at construction
            t0 = time.perf_counter()
            r = race(layer, b, assignments, None, rounds=args.rounds, warmup=5, cold_l2=True, graph=graph,
                     workdir=work, seed=17 + s)
            m = r["medians_ms"]
            best = min(m)
            row = {"weights_seed": ws, "inputs_seed": s, "graph": r["graph"],
                   "medians_ms": dict(zip(args.pairs, m)), "vs_best": {p: round(x / best - 1, 4) for p, x in zip(args.pairs, m)},
                   "relative_iqr": dict(zip(args.pairs, r["relative_iqr"])), "seconds": round(time.perf_counter() - t0, 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.input_draws > 1:  # the same pairs, the inputs rotating: does one order hold over every draw?
            for rep in range(3):
                layer.seed = ws
                r = race(layer, b, assignments, None, rounds=args.rounds, warmup=5, cold_l2=True, graph=graph,
                         workdir=work, seed=29 + rep, input_draws=args.input_draws)
                m = r["medians_ms"]
                row = {"weights_seed": ws, "inputs": f"{args.input_draws} draws rotating", "repeat": rep,
                       "medians_ms": dict(zip(args.pairs, m)),
                       "vs_best": {p: round(x / min(m) - 1, 4) for p, x in zip(args.pairs, m)},
                       # each run over its own draw's median: the timing noise, not the routings' spread
                       "relative_iqr": dict(zip(args.pairs, r["relative_iqr"]))}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"workload": args.workload, "bucket": b, "gpu": torch.cuda.get_device_name(dev),
                                        "pairs": args.pairs, "rounds": args.rounds, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
