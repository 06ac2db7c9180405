"""GPU helper for test_gpu.py: does a vLLM entry that warm wrote serve vLLM 0.33's own call?

``python tests/gpu_probes/vllm_replay.py GOLDEN_CASE KEY_DIR MAX_NUM_BATCHED_TOKENS [OTHER_RANK_FILE]`` prints one
JSON line. The call is the one vLLM's ``FlashInferExperts.apply`` made (tests/data, recorded from
vLLM 0.33.0 on CPU), rebuilt on the GPU with data; FlashInfer is the only engine code here.

1. vLLM's hit test (``kernel_warmup._all_ranks_have_matching_cache``): every rank file has the
   same ``_metadata`` and the same number of fields - else vLLM tunes again.
2. ``AutoTuner.load_configs`` on rank 0's file, as vLLM does (False: FlashInfer rejects it).
3. vLLM's startup tuning pass - what it runs on a miss - over the loaded file:
   ``autotune(tuning_buckets=get_hybrid_num_tokens_buckets(N), round_up=True)`` at N tokens,
   FlashInfer's profiling counted: a file with every key profiles nothing.
4. Serving: the call at token counts across the range outside any autotune context; every
   lookup (``AutoTuner.search_cache``) must hit.
With OTHER_RANK_FILE (the SGLang file of the same run), step 3 again over that file: the control
that shows the keys differ (it profiles).

``python tests/gpu_probes/vllm_replay.py --v2 GOLDEN_CASE ROOT MAX_NUM_BATCHED_TOKENS``: a single-rank vLLM,
which reads FlashInfer's managed store instead (``use_flashinfer_autotune_v2``). Its startup pass
exactly as ``kernel_warmup.flashinfer_autotune`` enters it - ``torch.inference_mode()`` and
``autotune_v2(mode="tune", cache_root=ROOT)``, inside it ``autotune(tuning_buckets=
get_hybrid_num_tokens_buckets(N), round_up=True)`` - with profiling counted and the store's entry
files counted before and after (a covering store profiles and publishes nothing); then serving,
as in step 4. Given an empty ROOT it is the control (it profiles, and publishes what it tuned).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def fingerprint(path: Path):
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return json.dumps(obj.get("_metadata"), sort_keys=True), len([k for k in obj if k != "_metadata"])


SERVED_AT = [1, 3, 8, 27, 100, 256, 300, 1000, 2047, 2500, 4000, 5000, 8192, 12000]


def main() -> None:
    v2 = sys.argv[1] == "--v2"
    argv = sys.argv[2:] if v2 else sys.argv[1:]
    case_json, key_dir, n = argv[0], Path(argv[1]), int(argv[2])
    other = Path(argv[3]) if len(argv) > 3 else None
    import torch
    from flashinfer.autotuner import AutoTuner, autotune
    from flashinfer.fused_moe import cutlass_fused_moe
    from flashinfer.fused_moe.core import ActivationType
    from flashinfer.fused_moe.utils import get_hybrid_num_tokens_buckets

    call = json.loads(case_json)["call"]
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    experts = call["fc1_expert_weights"][0][0]
    top_k = call["token_selected_experts"][0][1]

    def tensor(spec, fill: str, m: int | None = None):
        shape, dtype = list(spec[0]), getattr(torch, spec[1].removeprefix("torch."))
        if m is not None:
            shape[0] = m
        if fill == "ids":
            return torch.stack([torch.randperm(experts, device=dev)[:top_k] for _ in range(shape[0])]).to(dtype)
        if fill == "scales":
            return torch.softmax(torch.randn(shape, device=dev), dim=-1).to(dtype)
        if fill == "one":
            return torch.ones(shape, device=dev, dtype=dtype)
        return (torch.randn(shape, device=dev) * 0.05).to(dtype)

    static = {k: tensor(call[k], "w") for k in ("fc1_expert_weights", "fc2_expert_weights")}
    static["quant_scales"] = [tensor(s, "one") for s in call["quant_scales"]]
    scalars = {k: v for k, v in call.items() if not isinstance(v, list) and k not in ("output_dtype", "activation_type")}

    def run(m: int) -> None:
        cutlass_fused_moe(
            input=tensor(call["input"], "x", m), token_selected_experts=tensor(call["token_selected_experts"], "ids", m),
            token_final_scales=tensor(call["token_final_scales"], "scales", m),
            output=torch.empty(m, call["input"][0][1], device=dev, dtype=getattr(torch, call["output_dtype"][6:])),
            output_dtype=getattr(torch, call["output_dtype"][6:]), activation_type=ActivationType(call["activation_type"]),
            **static, **scalars)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fi_counters import count_tuner

    counters = count_tuner()
    tuner = AutoTuner.get()
    with autotune(False):
        run(1)  # kernel modules loaded before anything is counted
    torch.cuda.synchronize()

    def serving() -> dict:
        counters.reset()
        for m in SERVED_AT:
            run(m)
        torch.cuda.synchronize()
        return {"token_counts": SERVED_AT, "lookups": len(counters.lookups), "hits": counters.hits,
                "misses": [x for x in counters.lookups if not x[2]][:5]}

    if v2:
        from flashinfer import autotune_v2

        def entry_files() -> int:
            return len(list(key_dir.glob("v2/*/entries/*.json")))

        before = entry_files()
        counters.reset()
        with torch.inference_mode(), autotune_v2(mode="tune", cache_root=key_dir):
            with autotune(tuning_buckets=tuple(get_hybrid_num_tokens_buckets(n)), round_up=True):
                run(n)
        torch.cuda.synchronize()
        startup = {"profiled": counters.profiled, "lookups": len(counters.lookups), "hits": counters.hits,
                   "entries_before": before, "entries_after": entry_files()}
        print(json.dumps({"startup_pass": startup, "serving": serving()}))
        return

    ranks = sorted(key_dir.glob("autotune_configs_dp*_rank*.json"))
    prints = {p.name: fingerprint(p) for p in ranks}
    hit_test = bool(ranks) and None not in prints.values() and len(set(prints.values())) == 1

    def tuning_pass(rank_file: Path) -> dict:
        tuner.clear_cache()
        accepted = tuner.load_configs(str(rank_file))
        counters.reset()
        with autotune(True, tuning_buckets=tuple(get_hybrid_num_tokens_buckets(n)), round_up=True):
            run(n)
        torch.cuda.synchronize()
        return {"metadata_accepted": bool(accepted), "profiled": counters.profiled, "lookups": len(counters.lookups),
                "hits": counters.hits}

    startup = tuning_pass(ranks[0])
    result = {"rank_files": len(ranks), "vllm_hit_test": hit_test, "startup_pass": startup, "serving": serving()}
    if other is not None:
        result["control_other_file"] = tuning_pass(other)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
