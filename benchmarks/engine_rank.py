"""One process of the engine-style baselines in warm_vs_engine.py (not part of fi-autotune).

Modes:
  baseline   what SGLang does at startup today: this rank tunes the plan's full bucket set itself,
             in lockstep with the other ranks through set_autotune_process_group over gloo.
  cold       the engine's startup autotune pass with no cache (its own decode-batch buckets).
  warmstart  the same pass with a cache file loaded first (what a warmed container does).

Prints one JSON line with its timings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--mode", choices=("baseline", "cold", "warmstart"), required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--cache", help="rank file to load (warmstart)")
    ap.add_argument("--save", help="write what this rank tuned to this FlashInfer cache file (tactic_quality.py)")
    args = ap.parse_args()

    import torch
    from flashinfer.autotuner import AutoTuner, autotune, set_autotune_process_group

    from autotune_cache.tune.workers.lm_head import lm_head_stub
    from autotune_cache.tune.workers.skeleton import SkeletonModel
    from autotune_cache.plan.tuning import dummy_tokens
    from autotune_cache.tune.workers.worker import measure_floor

    t_import = time.perf_counter() - T0
    plan = json.loads(Path(args.plan).read_text())
    ops = plan["workloads"][0]["ops"]
    spec, res = plan["spec"], plan["resolution"]
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    model = SkeletonModel(ops, hidden=spec["hidden_size"], vocab=spec["vocab_size"], tp=res["flags"]["tp"],
                          dp=res["attn_dp_size"], dtype=res["dtype"], device=dev)
    for layer in model.layers:  # kernel modules load (already built on disk by the driver's pre-run)
        with autotune(False):
            layer(1)
    torch.cuda.synchronize()
    t_setup = time.perf_counter() - T0 - t_import
    floor = measure_floor(AutoTuner)
    tuner = AutoTuner.get()
    tuner.clear_cache()

    group = None
    if args.mode == "baseline" and args.world > 1:
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(args.port)
        dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
        group = dist.new_group(backend="gloo")
        dist.barrier(group)
    t1 = time.perf_counter()
    if args.mode == "baseline":
        set_autotune_process_group(group)
        try:
            for layer in model.layers:
                with autotune(True, tuning_buckets=tuple(layer.op["buckets"])), lm_head_stub():
                    model(lambda op, lop=layer.op: 1 if op is lop else None, lm_tokens=1)
        finally:
            set_autotune_process_group(None)
    else:
        if args.mode == "warmstart":
            assert tuner.load_configs(args.cache), "FlashInfer rejected the cache's metadata"
        with autotune(True), lm_head_stub():
            for p in res["passes"]:
                model(lambda op, p=p: dummy_tokens(res, op, p), lm_tokens=p["batch"][1])
    torch.cuda.synchronize()
    t_pass = time.perf_counter() - t1
    if args.save:
        tuner.save_configs(args.save)
    # The engine goes on serving from here: the baseline's time ends when its ranks have tuned,
    # not when these processes have torn down.
    t_done = time.time()
    print(json.dumps({"rank": args.rank, "mode": args.mode, "import_s": round(t_import, 3), "setup_s": round(t_setup, 3),
                      "pass_s": round(t_pass, 3), "floor_s": round(floor[0], 3), "tuned": len(tuner.profiling_cache),
                      "wall_s": round(time.perf_counter() - T0, 3), "t_done": t_done}), flush=True)
    if group is not None:
        import torch.distributed as dist

        dist.barrier(group)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
