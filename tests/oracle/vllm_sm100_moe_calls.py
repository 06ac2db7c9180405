"""vLLM 0.33's own Blackwell MoE experts, run on CPU, with the FlashInfer kernel they call recorded.

    /work/vllm-oracle/bin/python tests/oracle/vllm_sm100_moe_calls.py CASES.json > CALLS.json
    /work/vllm-oracle/bin/python tests/oracle/vllm_sm100_moe_calls.py --golden   # re-record tests/data

Each case ``{"id", "hidden", "intermediate", "experts", "top_k", "tp", "dp", "ep", "m", "max_num_batched_tokens"}``
builds what vLLM builds for an unquantized MoE layer on sm100 with ``--moe-backend
flashinfer_trtllm`` (its default there: ``oracle/unquantized.py`` puts FLASHINFER_TRTLLM first on
Blackwell): vLLM's own ``FusedMoEParallelConfig.make`` split, its ``FusedMoEConfig`` and its
``TrtLlmBf16ExpertsMonolithic`` (the class ``_return_or_raise`` picks first), whose ``apply`` runs
for ``m`` tokens with ``flashinfer.fused_moe.trtllm_bf16_moe`` replaced by a recorder. The weights
are the shapes vLLM keeps after ``convert_moe_weights_to_flashinfer_trtllm_block_layout`` (an
in-place reorder: ``[E, 2I, H]`` and ``[E, H, I]``), viewed by vLLM's own ``view_as_block_major_k``.
Printed: one record per case, ``{"id", "case", "api", "m", "kwargs"}`` with every parameter of
FlashInfer's function bound (defaults applied) and encoded as ``tests/oracle/flashinfer_keys.py``
reads it, so the same record gives FlashInfer's own keys (``golden()`` below runs both:
``--golden``). Not vLLM's code: process groups (rank 0 of the configured
widths), and the device (CPU tensors; the experts' ``apply`` never asks for one).
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_moe_calls import encode  # noqa: E402  (plain tensor/enum encoding, no SGLang import)


class _Rank0:
    rank_in_group = 0


def record(case: dict) -> dict:
    import flashinfer.fused_moe as fm
    import vllm.model_executor.layers.fused_moe.config as C
    import vllm.model_executor.layers.fused_moe.experts.trtllm_bf16_moe as tb
    from vllm.config import ParallelConfig
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    pc = ParallelConfig(tensor_parallel_size=case["tp"], data_parallel_size=case["dp"],
                        enable_expert_parallel=case["ep"])
    with mock.patch.object(C, "get_dp_group", _Rank0), mock.patch.object(C, "get_pcp_group", _Rank0), \
            mock.patch.object(C, "get_tensor_model_parallel_rank", lambda: 0):
        mpc = C.FusedMoEParallelConfig.make(tp_size_=case["tp"], pcp_size_=1, dp_size_=case["dp"], sp_size_=1,
                                            vllm_parallel_config=pc)
    local = case["experts"] // mpc.ep_size
    cfg = C.FusedMoEConfig(
        num_experts=case["experts"], experts_per_token=case["top_k"], hidden_dim=case["hidden"],
        intermediate_size=case["intermediate"], num_local_experts=local, num_logical_experts=case["experts"],
        activation=MoEActivation.SILU, device="cpu", routing_method=C.RoutingMethodType.Renormalize,
        moe_parallel_config=mpc, in_dtype=torch.bfloat16, moe_backend="flashinfer_trtllm",
        max_num_tokens=case["max_num_batched_tokens"])
    experts = tb.TrtLlmBf16ExpertsMonolithic(cfg, C.FUSED_MOE_UNQUANTIZED_CONFIG)
    m, h, i = case["m"], case["hidden"], cfg.intermediate_size_per_partition
    seen: dict = {}
    signature = inspect.signature(fm.trtllm_bf16_moe)

    def recorder(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        seen.update(bound.arguments)
        return torch.empty(m, h, dtype=torch.bfloat16)

    with mock.patch.object(fm, "trtllm_bf16_moe", recorder):
        experts.apply(
            hidden_states=torch.empty(m, h, dtype=torch.bfloat16),
            w1=torch.empty(local, 2 * i, h, dtype=torch.bfloat16), w2=torch.empty(local, h, i, dtype=torch.bfloat16),
            router_logits=torch.empty(m, case["experts"], dtype=torch.bfloat16), activation=MoEActivation.SILU,
            global_num_experts=case["experts"], expert_map=None, a1q_scale=None, apply_router_weight_on_input=False)
    return {"id": case["id"], "case": case, "api": "flashinfer.fused_moe.trtllm_bf16_moe", "m": m,
            "kwargs": {k: encode(v) for k, v in seen.items()}}


#: The recorded cases: Qwen3-30B-A3B's MoE (hidden 2048, 128 experts of width 768, top-8).
CASES = [{"id": f"qwen3-30b-a3b-tp{tp}", "hidden": 2048, "intermediate": 768, "experts": 128, "top_k": 8, "tp": tp,
          "dp": 1, "ep": False, "m": 16, "max_num_batched_tokens": 8192} for tp in (1, 2)]
GOLDEN = Path(__file__).resolve().parent.parent / "data" / "vllm-0.33.0" / "sm100-trtllm_bf16_moe.json"


def golden() -> dict:
    """Each case's call (vLLM's own code) and FlashInfer's own keys for it at the buckets vLLM's
    startup pass tunes (``get_hybrid_num_tokens_buckets(max_num_batched_tokens)``), computed by
    tests/oracle/flashinfer_keys.py in a child process (it installs a fake B200 for the rest of
    its process)."""
    import subprocess
    import tempfile

    import flashinfer
    import vllm
    from flashinfer.fused_moe.utils import get_hybrid_num_tokens_buckets

    calls = [record(c) for c in CASES]
    wanted = [{"id": c["id"], "arch": "sm100", "api": c["api"], "buckets": list(get_hybrid_num_tokens_buckets(
        c["case"]["max_num_batched_tokens"])), "kwargs": {k: v["value"] if isinstance(v, dict) and str(
            v.get("enum", "")).startswith("vllm.") else v for k, v in c["kwargs"].items()}} for c in calls]
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "calls.json", Path(tmp) / "keys.json"
        src.write_text(json.dumps(wanted))
        subprocess.run([sys.executable, str(Path(__file__).with_name("flashinfer_keys.py")), str(src), "--out", str(out)],
                       check=True, stdout=subprocess.DEVNULL)
        # reduced as the SGLang goldens are (tests/oracle/reduce.py): candidates as [runner, file_key]
        keys = {k["id"]: [{"custom_op": g["custom_op"], "bucket": g["bucket"],
                           "candidates": [[c["runner"], c["file_key"]] for c in g["candidates"]
                                          if c.get("valid_tactics") != 0]} for g in k["keys"]]
                for k in json.loads(out.read_text())}
    return {"vllm": vllm.__version__, "flashinfer": flashinfer.__version__,
            "recorded_by": "tests/oracle/vllm_sm100_moe_calls.py --golden (vLLM's TrtLlmBf16ExpertsMonolithic.apply "
                           "on CPU, FlashInfer's function replaced by a recorder; keys: tests/oracle/flashinfer_keys.py "
                           "on a fake B200)",
            "cases": {c["id"]: {"case": c["case"], "call": c, "keys": {"buckets": wanted[i]["buckets"],
                                                                        "keys": keys[c["id"]]}}
                      for i, c in enumerate(calls)}}


def main() -> None:
    if sys.argv[1:] == ["--golden"]:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(golden(), indent=1) + "\n")
        print(f"wrote {GOLDEN}")
        return
    cases = json.loads(Path(sys.argv[1]).read_text())
    print(json.dumps([record(c) for c in cases]))


if __name__ == "__main__":
    main()
