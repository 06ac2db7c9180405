"""vLLM 0.33 on Blackwell (sm100): the one FlashInfer tunable call recorded from vLLM's own code.

On sm100 an unquantized MoE layer runs, by default (``oracle/unquantized.py`` puts
FLASHINFER_TRTLLM first on Blackwell, ``--moe-backend auto``) or with ``--moe-backend
flashinfer_trtllm``, ``TrtLlmBf16ExpertsMonolithic.apply``
(``layers/fused_moe/experts/trtllm_bf16_moe.py``), which calls ``trtllm_bf16_moe`` with
``tune_max_num_tokens = fi_moe_largest_bucket = max(max_num_batched_tokens x dp, 8192)`` (SGLang
passes ``next_power_of_2(M)``), shuffled BlockMajorK weights and no padding of its own.

Recorded (``tests/oracle/vllm_sm100_moe_calls.py``, vLLM's experts run on CPU with FlashInfer's
function replaced by a recorder; FlashInfer's own keys for the recorded call from
``tests/oracle/flashinfer_keys.py``; goldens in ``tests/data/vllm-0.33.0/sm100-trtllm_bf16_moe.json``):
Qwen3-MoE-style routing (Renormalize), tp 1 and 2, dp 1. Everything else vLLM may tune on
sm100 - NVFP4 MoE (``trtllm_fp4_block_scale_moe``), ``fp4_gemm``, mxfp8 and per-tensor FP8 GEMMs,
MLA decode, DeepSeek-style routing, data parallelism - is refused by ``sm100_refusal`` with what
is missing, never planned from a reading of the code. None of it has run on a Blackwell GPU.
"""

from __future__ import annotations

from autotune_cache.autotuner.recipe import M, Enum, OpRecipe, T
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.resolution import Resolution
from autotune_cache.plan.spec import Family, ModelSpec

#: The sm100 backends whose unquantized MoE call was recorded from vLLM (``auto`` picks it there).
RECORDED_BACKENDS = ("auto", "flashinfer_trtllm")
_FI_MOE_TUNE_FLOOR = 8192  # fi_moe_largest_bucket's floor


def sm100_refusal(spec: ModelSpec, flags: ServerFlags, arch: str, model_quant: str | None) -> str | None:
    """Why vLLM's sm100 plan for this target is not built (one line naming what is not recorded),
    or None for the recorded path."""
    unrecorded = ("is not recorded from vLLM 0.33's code on Blackwell (only the unquantized trtllm_bf16_moe "
                  "call is: docs/cache-layout.md)")
    if arch != "sm100":
        return f"{arch}: vLLM's calls on this GPU {unrecorded}"
    if spec.moe is None:
        return f"a dense model on sm100 (vLLM's fp4_gemm / mxfp8 / FP8 GEMM and MLA decode tuning) {unrecorded}"
    if model_quant is not None:
        return f"{model_quant} MoE weights on sm100 (e.g. trtllm_fp4_block_scale_moe) {unrecorded}"
    if flags.moe_runner_backend not in RECORDED_BACKENDS:
        return f"--moe-backend {flags.moe_runner_backend} on sm100 {unrecorded}"
    if spec.family in (Family.MLA_MOE, Family.MLA_DSA_MOE):
        return f"DeepSeek-style routing and MLA decode on sm100 {unrecorded}"
    if flags.dp > 1:
        return f"--data-parallel-size {flags.dp} on sm100 (vLLM's all-to-all choice for its monolithic experts) {unrecorded}"
    if spec.moe.num_experts > 2048:
        return "more than 2048 experts: vLLM's trtllm MoE refuses them (is_supported_config)"
    return None


def vllm_trtllm_bf16_moe(spec: ModelSpec, res: Resolution, layers: int, max_num_batched_tokens: int) -> OpRecipe:
    """``TrtLlmBf16ExpertsMonolithic.apply``'s call for ``layers`` MoE layers of one rank."""
    assert spec.moe is not None and res.experts_per_rank is not None and res.moe_intermediate_per_partition is not None
    h, e, i = spec.hidden_size, res.experts_per_rank, res.moe_intermediate_per_partition
    kwargs = {
        "routing_logits": T((M, spec.moe.num_experts), res.dtype, fill="router_logits"),
        "routing_bias": None,
        "hidden_states": T((M, h), "bfloat16", fill="activation"),
        "gemm1_weights": T((e, h // 64, 2 * i, 64), "bfloat16"),  # view_as_block_major_k of [E, 2I, H]
        "gemm2_weights": T((e, i // 64, h, 64), "bfloat16"),
        "num_experts": spec.moe.num_experts,
        "top_k": spec.moe.top_k,
        "n_group": None,
        "topk_group": None,
        "intermediate_size": i,
        "local_expert_offset": 0,
        "local_num_experts": e,
        "routed_scaling_factor": None,
        "routing_method_type": 1,  # RoutingMethodType.Renormalize
        "use_shuffled_weight": True,
        "weight_layout": Enum("flashinfer.fused_moe.WeightLayout.BlockMajorK", 2),
        "do_finalize": True,
        "enable_pdl": True,
        "tune_max_num_tokens": max(max_num_batched_tokens * res.attn_dp_size, _FI_MOE_TUNE_FLOOR),
        "activation_type": 3,  # Swiglu
        "norm_topk_prob": True,
    }
    return OpRecipe(
        id="moe.experts", api="flashinfer.fused_moe.trtllm_bf16_moe", custom_ops=("flashinfer::trtllm_bf16_moe",),
        kwargs=kwargs, tokens="moe", bucket_rule="moe_clamped", layers=layers, keys_checked=True,
        mirrors="vllm/model_executor/layers/fused_moe/experts/trtllm_bf16_moe.py:TrtLlmBf16ExpertsMonolithic.apply "
                "(vLLM 0.33.0, sm100; not yet run on Blackwell)",
    )
