"""Run inside an interpreter that has vLLM (0.33) and FlashInfer: the call vLLM's own
``FlashInferExperts.apply`` makes to ``cutlass_fused_moe`` for one MoE layer, next to the call of
an fi-autotune recipe, both bound to FlashInfer's signature with its defaults filled in.

argv[1]: JSON ``{"case": {hidden, intermediate, experts, top_k, tp, dp, ep, fp8, m}, "recipe": kwargs}``
(``recipe``: ``OpRecipe.to_dict()["kwargs"]``, optional). tests/data/vllm-0.33.0-cutlass_fused_moe-calls.json
holds what it printed for vLLM 0.33.0, so CI compares against vLLM's call without vLLM. Prints ``{"vllm": {...}, "ours": {...}}``:
tensors as ``[shape, dtype]``, enums as ints, the rest as JSON. Nothing runs on a GPU: the
FlashInfer function is replaced by a recorder; vLLM builds its parallel split
(``FusedMoEParallelConfig.make``), its expert config and its quantization config itself.
Used by tests/engines/test_vllm_plan.py when $FI_AUTOTUNE_VLLM_PYTHON names such an interpreter.
"""

import json
import sys
from pathlib import Path
from unittest import mock

import torch

import vllm.model_executor.layers.fused_moe.config as C
import vllm.model_executor.layers.fused_moe.experts.flashinfer_cutlass_moe as fcm
from vllm.config import ParallelConfig
from vllm.model_executor.layers.fused_moe.activation import MoEActivation

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # tests/support/fi_call.py, shared with the test
from fi_call import bound, materialize  # noqa: E402

args = json.loads(sys.argv[1])
case = args["case"]


class _Rank0:
    rank_in_group = 0


def vllm_call() -> dict:
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
        moe_parallel_config=mpc, in_dtype=torch.bfloat16, moe_backend="flashinfer_cutlass")
    m, h, i, k = case["m"], case["hidden"], cfg.intermediate_size_per_partition, case["top_k"]
    wdt = torch.float8_e4m3fn if case["fp8"] else torch.bfloat16
    if case["fp8"]:  # per-tensor static scales, as oracle/fp8.py make_fp8_moe_quant_config builds them
        one = torch.ones(1, dtype=torch.float32)
        quant = C.fp8_w8a8_moe_quant_config(
            w1_scale=torch.ones(local, dtype=torch.float32), w2_scale=torch.ones(local, dtype=torch.float32),
            a1_scale=one, a2_scale=one, g1_alphas=torch.ones(local, dtype=torch.float32),
            g2_alphas=torch.ones(local, dtype=torch.float32), a2_gscale=one)
    else:
        quant = C.FUSED_MOE_UNQUANTIZED_CONFIG
    experts = fcm.FlashInferExperts(cfg, quant)
    seen: dict = {}
    with mock.patch.object(fcm, "flashinfer_cutlass_fused_moe", lambda **kw: seen.update(kw)):
        experts.apply(
            output=torch.empty(m, h, dtype=torch.bfloat16), hidden_states=torch.empty(m, h, dtype=wdt),
            w1=torch.empty(local, 2 * i, h, dtype=wdt), w2=torch.empty(local, h, i, dtype=wdt),
            topk_weights=torch.empty(m, k, dtype=torch.float32), topk_ids=torch.zeros(m, k, dtype=torch.int64),
            activation=MoEActivation.SILU, global_num_experts=case["experts"], expert_map=None, a1q_scale=None,
            a2_scale=None, workspace13=None, workspace2=None, expert_tokens_meta=None,
            apply_router_weight_on_input=False)
    return seen


ours = args.get("recipe")
print(json.dumps({"vllm": bound(vllm_call()),
                  "ours": bound({k: materialize(v, case["m"]) for k, v in ours.items()}) if ours else None}))
