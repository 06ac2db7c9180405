"""GPU helper for test_gpu.py: does FlashInfer's own v2 store, as warm wrote it, serve the engine's
startup pass with no profiling and the same tactics as the rank file?

``python tests/gpu_probes/v2_replay.py PLAN_JSON RANK_FILE V2_ROOT`` prints one JSON line. Two passes over
the skeleton at the engine's token counts, in this order (the v2 store, once attached, stays):

1. rank file: ``load_configs`` + ``autotune(False)``: the tactics SGLang's rank file serves;
2. v2 store: ``autotune_v2(mode="tune", cache_root=V2_ROOT)`` - the mode an engine starts in -
   with FlashInfer's profiling counted: a store that covers the pass profiles nothing.

Every lookup is recorded through ``AutoTuner.search_cache`` (hit or miss, runner, tactic).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    plan_path, rank_file, v2_root = sys.argv[1:4]
    import torch
    from flashinfer.autotune_cache import autotune_v2
    from flashinfer.autotuner import AutoTuner, autotune

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from autotune_cache.tune.workers.lm_head import lm_head_stub
    from autotune_cache.tune.workers.skeleton import SkeletonModel

    plan = json.loads(Path(plan_path).read_text())
    spec, res = plan["spec"], plan["resolution"]
    ops = plan["workloads"][0]["ops"]
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    model = SkeletonModel(ops, hidden=spec["hidden_size"], vocab=spec["vocab_size"], tp=res["flags"]["tp"],
                          dp=res["attn_dp_size"], dtype=res["dtype"], device=dev)

    from autotune_cache.plan.tuning import dummy_tokens

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fi_counters import count_tuner

    counters = count_tuner()
    lookups = counters.lookups
    tuner = AutoTuner.get()
    for layer in model.layers:  # kernel modules loaded before any pass
        with autotune(False):
            layer(1)

    def run_pass() -> list[tuple]:
        lookups.clear()
        with lm_head_stub():
            for p in res["passes"]:
                model(lambda op, p=p: dummy_tokens(res, op, p), lm_tokens=p["batch"][1])
        torch.cuda.synchronize()
        return list(lookups)

    tuner.clear_cache()
    assert tuner.load_configs(rank_file), "FlashInfer rejected the rank file's metadata"
    with autotune(False):
        v1 = run_pass()
    tuner.clear_cache()
    counters.reset()
    with autotune_v2(mode="tune", cache_root=v2_root):
        v2 = run_pass()
    v2_profiled = counters.profiled
    v1_served = {(op, shapes): (runner, tactic) for op, shapes, hit, runner, tactic in v1 if hit}
    v2_served = {(op, shapes): (runner, tactic) for op, shapes, hit, runner, tactic in v2 if hit}
    # The engine's calls (v1) must be served by v2 with the same tactic; v2's tune mode also looks
    # up every other bucket of each op (to see what is left to tune): those must hit too.
    calls = sorted({(op, shapes) for op, shapes, *_ in v1})
    mismatches = [f"{op} {shapes}: rank file {v1_served.get((op, shapes))} vs v2 {v2_served.get((op, shapes))}"
                  for op, shapes in calls if v1_served.get((op, shapes)) != v2_served.get((op, shapes))]
    print(json.dumps({
        "calls": len(calls), "v1_lookups": len(v1), "v1_hits": sum(h for _, _, h, _, _ in v1),
        "lookups": len(v2), "v2_hits": sum(h for _, _, h, _, _ in v2), "v2_profiled": v2_profiled,
        "same_tactics": not mismatches, "mismatches": mismatches[:10],
        "served": [f"{op} {shapes}: {v2_served.get((op, shapes))}" for op, shapes in calls][:10],
    }), flush=True)


if __name__ == "__main__":
    main()
