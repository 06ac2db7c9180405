"""One GPU's share of tactic_quality.py's re-measurement (not part of fi-autotune).

For each (op, bucket) it is given, every distinct tactic assignment that any of the caches chose
races head to head (autotune_cache.tune.careful.race: interleaved in random order, CUDA-graph replays at
decode sizes, cold L2, median of ``--rounds`` timed runs), and each cache gets the time of its own
assignment. With ``--layer-bs`` it also times each whole cache on one op's layer at those batch
sizes (the MoE layer's decode latency). Prints nothing; writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--caches", nargs="+", required=True, help="FlashInfer cache files (rank files)")
    ap.add_argument("--items", default="", help="op:bucket,... to re-measure")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--layer-bs", default="", help="batch sizes for whole-cache layer latency")
    ap.add_argument("--layer-op", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch
    from flashinfer.autotuner import autotune

    from autotune_cache.tree.diff import op_slots, pick_slots
    from autotune_cache.tune.careful.race import race
    from autotune_cache.autotuner.rankfile import RESERVED_KEYS
    from autotune_cache.plan.request import TuneRequest
    from autotune_cache.tune.workers.skeleton import OpLayer
    from autotune_cache.tune.session.work import distinct_ops

    plan_json = json.loads(Path(args.plan).read_text())
    plan = TuneRequest.from_dict(plan_json["request"]).plan(Path(tempfile.mkdtemp()))
    ops, _ = distinct_ops(plan)
    caches = []
    for c in args.caches:
        obj = json.loads(Path(c).read_text())
        caches.append({k: v for k, v in obj.items() if k not in RESERVED_KEYS})
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    graph_max = plan.resolution.decode_batch * plan.resolution.attn_dp_size
    layers: dict[int, OpLayer] = {}

    def layer(i: int) -> OpLayer:
        if i not in layers:
            layers[i] = OpLayer(ops[i], dev, seed=i)
            with autotune(False):
                layers[i](1)
            torch.cuda.synchronize()
        return layers[i]

    out = {"items": [], "layer": [], "gpu": torch.cuda.get_device_name(dev)}
    work = Path(tempfile.mkdtemp(prefix="quality-"))
    for item in filter(None, args.items.split(",")):
        i, b = map(int, item.split(":"))
        slots = op_slots(ops[i], b)
        assignments, index, of_cache = [], {}, []
        for c in caches:
            a = pick_slots(c, slots)
            sig = json.dumps(sorted((k, v[:2]) for k, v in a.items()))
            if sig not in index:
                index[sig] = len(assignments)
                assignments.append(a)
            of_cache.append(index[sig])
        t0 = time.perf_counter()
        r = race(layer(i), b, assignments, None, rounds=args.rounds, warmup=5, cold_l2=True, graph=b <= graph_max,
                 workdir=work, seed=7919 * i + b)
        med = r["medians_ms"]
        print(f"{ops[i]['id']} @ {b}: {len(assignments)} candidates, {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        out["items"].append({"op": ops[i]["id"], "op_index": i, "bucket": b, "distinct": len(assignments),
                             "per_cache_ms": [med[j] if med[j] != float("inf") else None for j in of_cache],
                             "assignment_of_cache": of_cache, "graph": r["graph"], "relative_iqr": r["relative_iqr"],
                             "errors": r["errors"], "seconds": round(time.perf_counter() - t0, 3)})
    for bs in [int(x) for x in filter(None, args.layer_bs.split(","))]:
        i = args.layer_op
        r = race(layer(i), bs, caches, None, rounds=args.rounds, warmup=5, cold_l2=True, graph=True,
                 workdir=work, seed=104729 + bs)
        out["layer"].append({"op": ops[i]["id"], "bs": bs, "per_cache_ms": r["medians_ms"], "graph": r["graph"],
                             "relative_iqr": r["relative_iqr"], "errors": r["errors"]})
    Path(args.out).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
