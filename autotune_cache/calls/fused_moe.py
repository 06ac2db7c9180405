"""FlashInfer's fused-MoE calls as the engines make them: the CUTLASS MoE (sm90+) and the
trtllm-gen MoE kernels (sm100), one recipe each, with the exact shapes, dtypes and flags a rank
passes in SGLang 0.5.23.

Neutral ground below the engines: SGLang's recipes use these as they are, and vLLM's planner
starts from the CUTLASS call and changes what its ``FlashInferExperts.apply`` passes otherwise,
so neither engine's package imports the other's."""

from __future__ import annotations

from typing import Any

from autotune_cache.autotuner.recipe import M, Dtype, Enum, OpRecipe, T
from autotune_cache.errors import UsageError
from autotune_cache.plan.resolution import Resolution
from autotune_cache.plan.spec import Family, ModelSpec

# ---------------------------------------------------------------------------------------------
# Recipes: each mirrors the SGLang 0.5.23 call site it names; tests/data/sglang-0.5.23/matrix.json
# holds the calls SGLang's own code made (tests/oracle), compared argument by argument in CI.
# ---------------------------------------------------------------------------------------------

_SWIGLU = Enum("flashinfer.fused_moe.core.ActivationType.Swiglu", 3)
_CUTLASS_TUNE_CAP = 8192  # flashinfer_cutlass.py _FLASHINFER_DEFAULT_TUNE_MAX_NUM_TOKENS


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _moe_dims(spec: ModelSpec, res: Resolution) -> tuple[int, int, int, int]:
    """(hidden, experts per rank, intermediate per rank, top-k): a fused shared expert is one more
    expert every token also selects."""
    assert spec.moe is not None and res.experts_per_rank is not None and res.moe_intermediate_per_partition is not None
    return (spec.hidden_size, res.experts_per_rank, res.moe_intermediate_per_partition,
            spec.moe.top_k + res.fused_shared_experts)


def _gpt_oss_mxfp4_dims(spec: ModelSpec, res: Resolution) -> tuple[int, int]:
    """(hidden, intermediate per rank) of gpt-oss MXFP4 experts on flashinfer_mxfp4:
    models/gpt_oss.py shards the expert width in whole 32-wide MXFP4 blocks (ceil(blocks / tp)),
    FusedMoE pads hidden to 256 and Mxfp4MoEMethod the intermediate to 128."""
    blocks = -(-spec.moe.intermediate_size // 32)
    inter = round_up(-(-blocks // res.moe_tp_size) * 32, 128)
    return round_up(spec.hidden_size, 256), inter


def moe_layers_in(spec: ModelSpec, layers: range) -> int:
    """How many of ``layers`` are MoE layers (after the dense first ones, every ``layer_freq``-th)."""
    return sum(1 for i in layers if spec.moe and i >= spec.moe.first_dense_layers and i % spec.moe.layer_freq == 0)


def cutlass_moe(spec: ModelSpec, res: Resolution, layers: int) -> OpRecipe:
    """sglang/srt/layers/moe/moe_runner/flashinfer_cutlass.py _run_flashinfer_cutlass (bf16 / fp8 per-tensor)
    and, for gpt-oss on sm90, the flashinfer_mxfp4 W4A16 path (use_w4_group_scaling)."""
    h, e, i, k = _moe_dims(spec, res)
    act = res.dtype
    q = res.model_quantization
    kwargs: dict[str, Any] = {
        "input": T((M, h), act, fill="activation"),
        "token_selected_experts": T((M, k), "int32", fill="topk_ids"),
        "token_final_scales": T((M, k), "float32", fill="topk_weights"),
        "output_dtype": Dtype(act),
        "quant_scales": None,
        "swiglu_alpha": None, "swiglu_beta": None, "swiglu_limit": None,
        "ep_size": res.moe_ep_size, "ep_rank": 0, "tp_size": res.moe_tp_size, "tp_rank": 0,
        "tune_max_num_tokens": _CUTLASS_TUNE_CAP,
        "activation_type": _SWIGLU,
        # flashinfer_cutlass.py: the flashinfer all-to-all dispatcher's decode batches run the MoE with
        # enable_alltoall (a key field); SGLang's dispatch probe records it (engines/sglang/dispatch.py)
        "enable_alltoall": res.flags.moe_a2a_backend == "flashinfer",
        "use_fused_finalize": res.flags.moe_fused_finalize,  # SGLANG_FLASHINFER_MOE_FUSED_FINALIZE (default off)
    }
    verified = False
    if q is None:
        kwargs["fc1_expert_weights"] = T((e, 2 * i, h), act)
        kwargs["fc2_expert_weights"] = T((e, h, i), act)
        verified = True
    elif q in ("fp8", "modelopt_fp8") and not (spec.quant and spec.quant.is_block_fp8):
        kwargs["input"] = T((M, h), "float8_e4m3fn", fill="activation")
        kwargs["fc1_expert_weights"] = T((e, 2 * i, h), "float8_e4m3fn")
        kwargs["fc2_expert_weights"] = T((e, h, i), "float8_e4m3fn")
        # [fc1 dequant (E,), fc2 input quant (1,), fc2 dequant (E,), fc1 input dequant (1,)]
        kwargs["quant_scales"] = [T((e,), "float32", fill="scale"), T((1,), "float32", fill="scale"),
                                  T((e,), "float32", fill="scale"), T((1,), "float32", fill="scale")]
    elif q == "mxfp4":
        # W4A16 (quantization/mxfp4.py, cutlass_sm90): bf16 activations, packed e2m1 weights (2 per
        # byte) with ue8m0 scales per 32, hidden and intermediate padded (_gpt_oss_mxfp4_dims).
        h, i = _gpt_oss_mxfp4_dims(spec, res)
        kwargs["input"] = T((M, h), act, fill="activation")
        kwargs["fc1_expert_weights"] = T((e, 2 * i, h // 2), "uint8")
        kwargs["fc2_expert_weights"] = T((e, h, i // 2), "uint8")
        kwargs["fc1_expert_biases"] = T((e, 2 * i), "bfloat16", fill="bias")
        kwargs["fc2_expert_biases"] = T((e, h), "bfloat16", fill="bias")
        kwargs["quant_scales"] = [T((e, 2 * i, h // 32), "uint8", fill="scale"), T((e, h, i // 32), "uint8", fill="scale")]
        kwargs["use_w4_group_scaling"] = True
        if spec.moe and spec.moe.swiglu_limit is not None:
            kwargs["swiglu_alpha"] = T((e,), "float32", fill="scale")
            kwargs["swiglu_beta"] = T((e,), "float32", fill="scale")
            kwargs["swiglu_limit"] = T((e,), "float32", fill="scale")
    else:
        raise UsageError(f"--moe-runner-backend flashinfer_cutlass with {q} weights: not modelled (fi-autotune "
                         "tunes bf16, FP8 per-tensor and gpt-oss MXFP4 through it)")
    return OpRecipe(
        id="moe.experts", api="flashinfer.fused_moe.cutlass_fused_moe",
        custom_ops=("trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2"), kwargs=kwargs,
        tokens="moe", bucket_rule="moe_clamped", layers=layers,
        mirrors="sglang/srt/layers/moe/moe_runner/flashinfer_cutlass.py:_run_flashinfer_cutlass",
        engine_tune_max_cap=_CUTLASS_TUNE_CAP, verified=verified, keys_checked=True,
    )


def _routing(spec: ModelSpec) -> tuple[int, Any, Any]:
    """sglang/srt/layers/moe/utils.py RoutingMethodType as each model's gate selects it:
    DeepSeekV3 (2) for DeepSeek / GLM / Kimi, Renormalize (1) for Qwen3-MoE and gpt-oss."""
    assert spec.moe is not None
    if spec.family in (Family.MLA_MOE, Family.MLA_DSA_MOE):
        return 2, spec.moe.n_group, spec.moe.topk_group
    return 1, None, None


def _trtllm_common(spec: ModelSpec, res: Resolution, e: int, i: int) -> dict:
    routing, n_group, topk_group = _routing(spec)
    deepseek = routing == 2
    return {
        "routing_logits": T((M, spec.moe.num_experts), "float32" if deepseek else res.dtype, fill="router_logits"),
        "routing_bias": T((spec.moe.num_experts,), "float32", fill="bias") if deepseek else None,
        "num_experts": spec.moe.num_experts,
        "top_k": spec.moe.top_k,
        "n_group": n_group,
        "topk_group": topk_group,
        "intermediate_size": i,
        "local_expert_offset": 0,
        "local_num_experts": e,
        "routing_method_type": routing,
        "do_finalize": True,
        "tune_max_num_tokens": "next_power_of_2(M)",
    }


def trtllm_fp8_block_moe(spec: ModelSpec, res: Resolution, layers: int) -> OpRecipe:
    """flashinfer_trtllm.py _run_fp8_block_scale_moe (128x128 block FP8, sm100): FusedMoE pads the
    per-rank intermediate to a multiple of 128 for flashinfer_trtllm (fused_moe_triton/layer.py)."""
    h, e, i, _ = _moe_dims(spec, res)
    i = round_up(i, 128)
    deepseek = spec.family in (Family.MLA_MOE, Family.MLA_DSA_MOE)
    scaling = spec.moe.routed_scaling_factor if deepseek and spec.moe.routed_scaling_factor is not None else 1.0
    kwargs = _trtllm_common(spec, res, e, i) | {
        "hidden_states": T((M, h), "float8_e4m3fn", fill="activation"),
        "hidden_states_scale": T((h // 128, M), "float32", fill="scale"),  # a_sf.t() of column-major scales
        "gemm1_weights": T((e, 2 * i, h), "float8_e4m3fn"),
        "gemm1_weights_scale": T((e, 2 * i // 128, h // 128), "float32", fill="scale"),
        "gemm2_weights": T((e, h, i), "float8_e4m3fn"),
        "gemm2_weights_scale": T((e, h // 128, i // 128), "float32", fill="scale"),
        "routed_scaling_factor": scaling,
        "use_shuffled_weight": False,
        "weight_layout": 0,
        "fp8_quantization_type": Enum("flashinfer.fused_moe.Fp8QuantizationType.DeepSeekFp8", 1),
        "activation_type": _SWIGLU,
        "norm_topk_prob": True,
        "output": T((M, h), "bfloat16", fill="zeros"),
    }
    return OpRecipe(
        id="moe.experts", api="flashinfer.fused_moe.trtllm_fp8_block_scale_moe",
        custom_ops=("flashinfer::trtllm_fp8_block_scale_moe",), kwargs=kwargs, tokens="moe",
        bucket_rule="moe_clamped", layers=layers, keys_checked=True,
        mirrors="sglang/srt/layers/moe/moe_runner/flashinfer_trtllm.py:_run_fp8_block_scale_moe (common_kwargs)",
    )


def trtllm_bf16_moe(spec: ModelSpec, res: Resolution, layers: int) -> OpRecipe:
    """flashinfer_trtllm.py bf16 path: trtllm_bf16_moe with shuffled BlockMajorK weights (sm100):
    [E, K/64, N, 64] tiles of 64 (unquantized.py process_weights_after_loading)."""
    h, e, i, _ = _moe_dims(spec, res)
    i = round_up(i, 128)
    kwargs = _trtllm_common(spec, res, e, i) | {
        "hidden_states": T((M, h), "bfloat16", fill="activation"),
        "gemm1_weights": T((e, h // 64, 2 * i, 64), "bfloat16"),
        "gemm2_weights": T((e, i // 64, h, 64), "bfloat16"),
        "routed_scaling_factor": spec.moe.routed_scaling_factor,
        "use_shuffled_weight": True,
        "weight_layout": Enum("flashinfer.fused_moe.WeightLayout.BlockMajorK", 2),
        "enable_pdl": True,
        "activation_type": 3,
        "norm_topk_prob": True,
    }
    return OpRecipe(
        id="moe.experts", api="flashinfer.fused_moe.trtllm_bf16_moe",
        custom_ops=("flashinfer::trtllm_bf16_moe",), kwargs=kwargs, tokens="moe", bucket_rule="moe_clamped",
        layers=layers, mirrors="sglang/srt/layers/moe/moe_runner/flashinfer_trtllm.py:_run_bf16_moe",
        keys_checked=True,
    )


def trtllm_fp4_moe(spec: ModelSpec, res: Resolution, layers: int) -> OpRecipe:
    """flashinfer_trtllm.py NVFP4 (modelopt_fp4) and, for gpt-oss, the flashinfer_mxfp4 path on sm100
    (quantization/mxfp4.py trtllm_sm100: MXFP4 weights, MXFP8 activations, padded dims)."""
    h, e, i, _ = _moe_dims(spec, res)
    mx = res.model_quantization == "mxfp4"
    if mx:
        hp, i = _gpt_oss_mxfp4_dims(spec, res)
        act = {"hidden_states": T((M, hp), "float8_e4m3fn", fill="activation"),
               "hidden_states_scale": T((M, hp // 32), "float8_e4m3fn", fill="scale")}
        w = {"gemm1_weights": T((e, 2 * i, hp // 2), "uint8"),
             "gemm1_weights_scale": T((e, 2 * i, hp // 32), "float8_e4m3fn", fill="scale"),
             "gemm1_bias": T((e, 2 * i), "float32", fill="bias"),
             "gemm1_alpha": T((e,), "float32", fill="scale"), "gemm1_beta": T((e,), "float32", fill="scale"),
             "gemm1_clamp_limit": T((e,), "float32", fill="scale"),
             "gemm2_weights": T((e, hp, i // 2), "uint8"),
             "gemm2_weights_scale": T((e, hp, i // 32), "float8_e4m3fn", fill="scale"),
             "gemm2_bias": T((e, hp), "float32", fill="bias"),
             "routed_scaling_factor": None}
    else:
        i = round_up(i, 64)  # ModelOptNvFp4FusedMoEMethod.create_weights aligns gated NVFP4 to 64
        hp = h
        act = {"hidden_states": T((M, h // 2), "uint8", fill="activation"),
               "hidden_states_scale": T((M, h // 16), "float8_e4m3fn", fill="scale")}
        w = {"gemm1_weights": T((e, 2 * i, h // 2), "uint8"),
             "gemm1_weights_scale": T((e, 2 * i, h // 16), "float8_e4m3fn", fill="scale"),
             "gemm2_weights": T((e, h, i // 2), "uint8"),
             "gemm2_weights_scale": T((e, h, i // 16), "float8_e4m3fn", fill="scale"),
             "output1_scale_scalar": T((e,), "float32", fill="scale"),
             "output1_scale_gate_scalar": T((e,), "float32", fill="scale"),
             "output2_scale_scalar": T((e,), "float32", fill="scale"),
             "routed_scaling_factor": spec.moe.routed_scaling_factor if spec.family != Family.GQA_MOE else None}
    kwargs = _trtllm_common(spec, res, e, i) | act | w | {
        "enable_pdl": True,
        "activation_type": 3,
        "norm_topk_prob": True,
        "output": T((M, h), "bfloat16", fill="zeros"),
    }
    return OpRecipe(
        id="moe.experts", api="flashinfer.fused_moe.trtllm_fp4_block_scale_moe",
        custom_ops=("flashinfer::trtllm_fp4_block_scale_moe",), kwargs=kwargs, tokens="moe", bucket_rule="moe_clamped",
        layers=layers, mirrors="sglang/srt/layers/moe/moe_runner/flashinfer_trtllm.py:_run_fp4_moe / _run_mxfp4_moe",
        keys_checked=True,
    )
