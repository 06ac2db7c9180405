"""Op recipes: one FlashInfer tunable call each, with the exact shapes, dtypes and flags a rank runs.

A recipe is data: keyword arguments where tensors are ``T`` specs with ``"M"`` standing for the
token dimension. ``warm`` materializes them on a GPU; ``plan`` prints them; ``file_keys`` says
which FlashInfer cache keys a bucket produces, so a plan can be checked against what an engine
looks up without running anything.

Verified on a GPU (sm90): ``cutlass_fused_moe`` (bf16) and ``bmm_fp8``. The sm100 recipes
(trtllm-gen MoE, ``mm_fp4``, MLA decode) are written from the SGLang 0.5.23 call sites they cite
and tested at the argument level only: no Blackwell GPU has run them yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune_cache.autotuner.buckets import gemm_key
from autotune_cache.errors import UsageError
from autotune_cache.engines.sglang.resolve import Resolution, arch_major
from autotune_cache.plan.spec import Family, ModelSpec

M = "M"  # the dynamic token dimension


@dataclass(frozen=True)
class T:
    """A tensor argument: shape (ints and "M"), torch dtype name, layout, and how to fill it."""

    shape: tuple
    dtype: str
    layout: str = "row_major"  # or "column_major" (bmm_fp8's weight)
    fill: str = "weight"  # weight | activation | scale | topk_ids | topk_weights | router_logits | bias | zeros

    def concrete(self, m: int) -> tuple[int, ...]:
        return tuple(m if d == M else d for d in self.shape)

    def to_dict(self) -> dict:
        return {"tensor": {"shape": list(self.shape), "dtype": self.dtype, "layout": self.layout, "fill": self.fill}}


@dataclass(frozen=True)
class Dtype:
    name: str

    def to_dict(self) -> dict:
        return {"dtype": self.name}


@dataclass(frozen=True)
class Enum:
    qualname: str  # e.g. "flashinfer.fused_moe.core.ActivationType.Swiglu"
    value: int

    def to_dict(self) -> dict:
        return {"enum": self.qualname, "value": self.value}


def encode(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    return value


def decode(value: Any) -> Any:
    """The inverse of ``encode``: a plan's JSON kwargs back to T / Dtype / Enum."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        if "tensor" in value:
            t = value["tensor"]
            return T(tuple(t["shape"]), t["dtype"], t["layout"], t["fill"])
        if "dtype" in value:
            return Dtype(value["dtype"])
        if "enum" in value:
            return Enum(value["enum"], value["value"])
    return value


@dataclass(frozen=True)
class OpRecipe:
    id: str  # unique within a workload, e.g. "moe.experts", "linear.qkv_proj"
    api: str  # the FlashInfer function called
    custom_ops: tuple[str, ...]  # the AutoTuner custom_op names it tunes
    kwargs: dict = field(repr=False)
    tokens: str  # "moe": dp-gathered tokens; "dense": this rank's tokens; "decode": this rank's decode batch only
    bucket_rule: str  # "moe_clamped" (tune_max_num_tokens, clamped mapper) | "gemm" (from M, uncapped)
    layers: int  # how many layers of the real model run this exact call
    mirrors: str  # the SGLang function whose call this reproduces
    engine_tune_max_cap: int | None = None  # e.g. cutlass MoE: SGLang caps tune_max_num_tokens at 8192
    verified: bool = False  # run on a real GPU and keys checked
    #: The dummy passes (DummyPass.phase) this call belongs to; empty: every pass. A recipe of
    #: serving shapes only (no engine pass makes it) has ("serving",).
    phases: tuple[str, ...] = ()
    #: Its FlashInfer keys were checked against FlashInfer's own key construction (tests/oracle).
    keys_checked: bool = False

    def signature(self) -> tuple:
        """What makes two ranks' calls produce the same cache keys (rank offsets excluded)."""
        return (self.api, tuple(sorted((k, repr(encode(v))) for k, v in self.kwargs.items() if k not in _RANK_ONLY)))

    def file_keys(self, bucket: int) -> list[str]:
        """One key per custom op: the first candidate runner's (the only one, for most ops)."""
        return [group[0] for group in self.candidate_keys(bucket)]

    def candidate_keys(self, bucket: int) -> list[list[str]]:
        """Per custom op, the keys one profile may be stored under: one per candidate runner
        (FlashInfer stores the winner's, which only a GPU decides)."""
        from autotune_cache.autotuner.keys import BUILDERS

        if self.bucket_rule == "gemm":
            # A bucket off FlashInfer's grid (the dummy pass's own M, appended as the last bucket)
            # is stored under its mapped value: 288 tokens profile as 288 and key as 512.
            bucket = gemm_key(bucket)
        return [[str(k) for k in group] for group in BUILDERS[self.api](self, bucket)]

    @classmethod
    def from_dict(cls, d: dict) -> "OpRecipe":
        return cls(d["id"], d["api"], tuple(d["custom_ops"]), {k: decode(v) for k, v in d["kwargs"].items()},
                   d["tokens"], d["bucket_rule"], d["layers"], d["mirrors"], d["engine_tune_max_cap"], d["verified"],
                   tuple(d.get("phases") or ()), bool(d.get("keys_checked", False)))

    def to_dict(self) -> dict:
        return {
            "id": self.id, "api": self.api, "custom_ops": list(self.custom_ops),
            "kwargs": {k: encode(v) for k, v in self.kwargs.items()},
            "tokens": self.tokens, "bucket_rule": self.bucket_rule, "layers": self.layers,
            "mirrors": self.mirrors, "engine_tune_max_cap": self.engine_tune_max_cap, "verified": self.verified,
            "phases": list(self.phases), "keys_checked": self.keys_checked,
        }


# Arguments that differ between ranks but never reach a cache key.
_RANK_ONLY = {"ep_rank", "tp_rank", "local_expert_offset"}


# ---------------------------------------------------------------------------------------------
# Recipes: each mirrors the SGLang 0.5.23 call site it names; tests/data/sglang-0.5.23/matrix.json
# holds the calls SGLang's own code made (tests/oracle), compared argument by argument in CI.
# ---------------------------------------------------------------------------------------------

_SWIGLU = Enum("flashinfer.fused_moe.core.ActivationType.Swiglu", 3)
_CUTLASS_TUNE_CAP = 8192  # flashinfer_cutlass.py _FLASHINFER_DEFAULT_TUNE_MAX_NUM_TOKENS


def _round_up(x: int, m: int) -> int:
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
    inter = _round_up(-(-blocks // res.moe_tp_size) * 32, 128)
    return _round_up(spec.hidden_size, 256), inter


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
        "enable_alltoall": False,
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
    i = _round_up(i, 128)
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
    i = _round_up(i, 128)
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
        i = _round_up(i, 64)  # ModelOptNvFp4FusedMoEMethod.create_weights aligns gated NVFP4 to 64
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


def linear_shapes(spec: ModelSpec, res: Resolution) -> list[tuple[str, int, int, int]]:
    """(name, K, N, layers) of the per-rank linear layers of one decoder block, TP-split as SGLang does
    (QKVParallelLinear / RowParallelLinear / MergedColumnParallelLinear). Attention TP is tp/dp.
    MLA models' attention projections are not listed (no fi-autotune checkpoint quantizes them
    with a FlashInfer GEMM); their dense and shared-expert MLPs are."""
    h, tp_attn = spec.hidden_size, res.attn_tp_size
    out = []
    if spec.mla is None:
        kv_heads = max(1, spec.num_kv_heads // tp_attn)
        q = spec.num_attention_heads // tp_attn * spec.head_dim
        out += [("linear.qkv_proj", h, q + 2 * kv_heads * spec.head_dim, spec.num_layers),
                ("linear.o_proj", q, h, spec.num_layers)]
    else:  # MLA's output projection: the heads' v_head_dim back to hidden (RowParallelLinear)
        out += [("linear.o_proj", spec.num_attention_heads // tp_attn * spec.mla.v_head_dim, h, spec.num_layers)]
    if spec.dense_intermediate_size and spec.num_dense_mlp_layers:
        inter = spec.dense_intermediate_size // res.flags.tp
        out += [("linear.gate_up_proj", h, 2 * inter, spec.num_dense_mlp_layers),
                ("linear.down_proj", inter, h, spec.num_dense_mlp_layers)]
    if spec.moe is not None and spec.moe.num_shared_experts and spec.mla is not None:
        shared = spec.moe.intermediate_size * spec.moe.num_shared_experts // res.flags.tp
        # gate_up runs SGLang's own fused NVFP4 GEMM+SwiGLU kernel, not FlashInfer (deepseek_v2.py)
        out += [("linear.shared_experts.down_proj", shared, h, spec.num_moe_layers)]
    return out


def bmm_fp8_linear(name: str, k: int, n: int, layers: int, res: Resolution) -> OpRecipe:
    """sglang/srt/layers/quantization/fp8_utils.py flashinfer_bmm_fp8 (via apply_fp8_linear_bmm_flashinfer,
    ModelOptFp8LinearMethod.apply): bmm_fp8(q[M,K].unsqueeze(0), w[K,N].unsqueeze(0) column-major,
    x_scale.reshape(1), w_scale.reshape(1), out_dtype, backend="cublas")."""
    kwargs = {
        "A": T((1, M, k), "float8_e4m3fn", fill="activation"),
        "B": T((1, k, n), "float8_e4m3fn", layout="column_major"),
        "A_scale": T((1,), "float32", fill="scale"),
        "B_scale": T((1,), "float32", fill="scale"),
        "dtype": Dtype(res.dtype),
        "backend": "cublas",
    }
    return OpRecipe(
        id=name, api="flashinfer.bmm_fp8", custom_ops=("fp8_gemm",), kwargs=kwargs, tokens="dense",
        bucket_rule="gemm", layers=layers, mirrors="sglang/srt/layers/quantization/fp8_utils.py:flashinfer_bmm_fp8",
        verified=True, keys_checked=True,
    )


def mm_fp4_linear(name: str, k: int, n: int, layers: int, res: Resolution) -> OpRecipe:
    """sglang/srt/layers/quantization/fp4_utils.py fp4_gemm -> flashinfer.mm_fp4 (NVFP4, sm100) on
    the backend --fp4-gemm-backend resolves to (cute-dsl by default): a [M, K/2] packed e2m1,
    b [N, K/2].T, the activation scales swizzled (uint8, rows padded to 128, columns to 4),
    the weight's e4m3 block scales, alpha a 0-dim tensor (input_scale * weight_scale_2)."""
    kwargs = {
        "a": T((M, k // 2), "uint8", fill="activation"),
        "b": T((k // 2, n), "uint8", layout="column_major"),
        "a_descale": T((M, _round_up(k // 16, 4)), "uint8", fill="scale"),
        "b_descale": T((k // 16, n), "float8_e4m3fn", layout="column_major", fill="scale"),
        "alpha": T((), "float32", fill="scale"),
        "out_dtype": Dtype(res.dtype),
        "block_size": 16,
        "use_8x4_sf_layout": False,
        "backend": res.fp4_gemm_backend,
        "use_nvfp4": True,
        "enable_pdl": True,
    }
    return OpRecipe(
        id=name, api="flashinfer.mm_fp4", custom_ops=("fp4_gemm",), kwargs=kwargs, tokens="dense", bucket_rule="gemm",
        layers=layers, mirrors="sglang/srt/layers/quantization/fp4_utils.py:fp4_gemm", keys_checked=True,
    )


def _mla_block_width(max_seq_len: int, page: int) -> int:
    """trtllm_mla_backend.py: block tables are cdiv(max_seq_len, page) pages wide, padded to a
    multiple of lcm(128 / page, 4096 / page) (= 4096 / page)."""
    return _round_up(-(-max_seq_len // page), 4096 // page)


def mla_decode(spec: ModelSpec, res: Resolution, *, phase: str, q_len: int = 1, capture: bool = False,
               layers: int | None = None) -> OpRecipe:
    """The tunable MLA decode call (flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla):

    - trtllm_mla (TRTLLMMLABackend.forward_decode; forward_extend for TARGET_VERIFY and the
      draft's DRAFT_EXTEND_V2): query [batch, q_len, heads, 576] in the KV dtype, block tables
      [batch, width], a 150 MiB int8 workspace, backend "auto" (trtllm-gen and cute-dsl race);
    - DSA with --dsa-decode-backend trtllm (dsa_backend.py): tokens flattened (query [batch x
      q_len, 1, heads, 576]), block tables of the top-k indices [., 1, index_topk], a 384 MiB
      workspace, backend "trtllm-gen".

    The target's eager dummy pass runs it with seq lens 1 (plus the draft tokens when
    verifying): max_seq_len 1, or 1 + 2 x q_len (dense verify; 1 + q_len for DSA), keys serving
    never looks up. ``capture`` builds the CUDA-graph-capture call instead (max_seq_len the
    context length, plus the draft tokens in a verify or draft-extend graph): what every served
    decode step looks up, and what the draft's graph-capture passes tune. Phase ``serving`` is
    the target's capture-shaped call, which no dummy pass makes (tuned for serving only)."""
    assert spec.mla is not None and res.attention is not None
    att = res.attention
    verify = phase == "target_verify" or (phase == "serving" and q_len > 1)
    backend = att.verify_backend if verify else att.decode_backend
    dsa = backend == "dsa"
    heads = spec.num_attention_heads // res.attn_tp_size
    width = spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim
    dtype = "float8_e4m3fn" if att.kv_is_fp8 else res.dtype
    page = att.page_size
    extend = q_len if (verify or phase == "draft_extend") else 0
    if capture:
        max_seq = att.context_length + extend
    else:
        max_seq = 1 + (extend if dsa or phase == "draft_extend" else 2 * extend)
    if dsa:
        top_k = spec.mla.index_topk or 0
        query = T((M, 1, heads, width), dtype, fill="activation")
        tables = T((M, 1, top_k), "int32", fill="zeros")
        extra = {"workspace_buffer": T((402653184,), "uint8", fill="zeros"), "sparse_mla_top_k": top_k,
                 "backend": "trtllm-gen", "enable_pdl": None}
    else:
        query = T((M, q_len, heads, width), dtype, fill="activation")
        # the capture path sizes the tables for the context length, the eager pass for its seq lens
        tables = T((M, _mla_block_width(att.context_length if capture else max_seq, page)), "int32", fill="zeros")
        extra = {"workspace_buffer": T((157286400,), "int8", fill="zeros"), "sparse_mla_top_k": 0,
                 "backend": (att.verify_mla_backend if verify else att.mla_backend), "enable_pdl": True}
    kwargs = {
        "query": query,
        "kv_cache": T(("num_pages", 1, page, width), dtype),
        "qk_nope_head_dim": spec.mla.qk_nope_head_dim,
        "kv_lora_rank": spec.mla.kv_lora_rank,
        "qk_rope_head_dim": spec.mla.qk_rope_head_dim,
        "block_tables": tables,
        "seq_lens": T((M,), "int32", fill="zeros"),
        "max_seq_len": max_seq,
        "bmm1_scale": spec.mla.softmax_scale,
        "bmm2_scale": 1.0,
        "multi_ctas_kv_counter_buffer": T((32768 * heads,), "uint8", fill="zeros")
        if extra["backend"] != "cute-dsl" else None,
        **extra,
    }
    per_request = not dsa and q_len > 1  # dim 0 counts requests of q_len tokens
    return OpRecipe(
        id=f"attn.mla_decode.{phase}" + (f".q{q_len}" if q_len > 1 else ""),
        api="flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla",
        custom_ops=("trtllm_batch_decode_mla",), kwargs=kwargs, tokens="requests" if per_request else "dense",
        bucket_rule="mla", layers=layers if layers is not None else spec.num_layers,
        mirrors=("sglang/srt/layers/attention/dsa_backend.py (trtllm decode)" if dsa
                 else "sglang/srt/layers/attention/trtllm_mla_backend.py:TRTLLMMLABackend"),
        phases=(phase,), keys_checked=phase in ("decode", "target_verify", "serving"),
    )


def moe_layers_in(spec: ModelSpec, layers: range) -> int:
    """How many of ``layers`` are MoE layers (after the dense first ones, every ``layer_freq``-th)."""
    return sum(1 for i in layers if spec.moe and i >= spec.moe.first_dense_layers and i % spec.moe.layer_freq == 0)


def _moe_recipe(spec: ModelSpec, res: Resolution, moe_layers: int) -> OpRecipe | None:
    backend = res.moe_runner_backend
    q = res.model_quantization
    sm100 = arch_major(res.arch) == 10
    if spec.moe is None or not moe_layers or backend not in ("flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_trtllm"):
        if spec.moe is not None and moe_layers and backend in ("flashinfer_trtllm_routed", "flashinfer_cutedsl"):
            raise UsageError(f"--moe-runner-backend {backend}: SGLang 0.5.23 tunes its own FlashInfer calls there "
                             "and fi-autotune does not model them")
        return None
    if backend == "flashinfer_cutlass" or (backend == "flashinfer_mxfp4" and not sm100):
        if spec.quant and spec.quant.is_block_fp8:
            return None  # block FP8: the CUTLASS profiler has no tactics on sm90
        return cutlass_moe(spec, res, moe_layers)
    if not sm100:
        return None
    if backend == "flashinfer_mxfp4" or q in ("modelopt_fp4", "modelopt_mixed"):
        return trtllm_fp4_moe(spec, res, moe_layers)
    if q == "fp8" and spec.quant and spec.quant.is_block_fp8:
        return trtllm_fp8_block_moe(spec, res, moe_layers)
    if q is None:
        return trtllm_bf16_moe(spec, res, moe_layers)
    how = "" if res.flags.moe_runner_backend == backend else " (SGLang's default here)"
    raise UsageError(f"--moe-runner-backend {backend}{how} with {q} weights: not modelled")


def recipes_for(spec: ModelSpec, res: Resolution, layers: range) -> list[OpRecipe]:
    """The tunable calls one pipeline stage (``layers``) makes in SGLang's dummy passes, plus the
    serving-shape variants of the ones whose dummy-pass keys serving never looks up."""
    if not res.autotunes:
        return []
    out: list[OpRecipe] = []
    moe_layers = moe_layers_in(spec, layers)
    dense_layers = len(layers) - moe_layers
    q = res.model_quantization
    moe = _moe_recipe(spec, res, moe_layers)
    if moe is not None:
        out.append(moe)

    per_tensor_fp8 = q in ("modelopt", "modelopt_fp8", "modelopt_mixed")
    if per_tensor_fp8 or res.fp4_gemm_backend is not None:
        make = bmm_fp8_linear if per_tensor_fp8 else mm_fp4_linear
        seen = set()
        excluded = spec.quant.modules_not_quantized if spec.quant else ()
        for name, k, n, count in linear_shapes(spec, res):
            if name in ("linear.gate_up_proj", "linear.down_proj"):
                count = dense_layers
            elif name.startswith("linear.shared_experts"):
                count = moe_layers
            else:
                count = len(layers)
            if count == 0 or (k, n) in seen or k % 16 or n % 16:  # ModelOptFp8LinearMethod._can_use_flashinfer_bmm
                continue
            if _excluded(name, excluded):
                continue
            seen.add((k, n))
            out.append(make(name, k, n, count, res))

    att = res.attention
    if spec.mla is not None and att is not None and arch_major(res.arch) == 10:
        n = len(layers)
        for p in res.passes:
            if p.phase == "decode" and att.mla_backend:
                out.append(mla_decode(spec, res, phase="decode", layers=n))
            elif p.phase == "target_verify" and att.verify_mla_backend:
                out.append(mla_decode(spec, res, phase="target_verify", layers=n, q_len=p.tokens_per_req))
            elif p.phase == "draft_decode" and att.mla_backend:
                out.append(mla_decode(spec, res, phase="draft_decode", capture=True, layers=n))
            elif p.phase == "draft_extend" and att.mla_backend and att.decode_backend == "trtllm_mla":
                out.append(mla_decode(spec, res, phase="draft_extend", capture=True, layers=n,
                                      q_len=p.tokens_per_req))
        if not res.is_draft and res.passes and (att.mla_backend or att.verify_mla_backend):
            spec_tokens = res.speculative.num_draft_tokens if res.speculative else 1
            out.append(mla_decode(spec, res, phase="serving", capture=True, layers=n, q_len=spec_tokens))
    skip = set(res.key_fields.skip_ops)
    unique: dict[tuple, OpRecipe] = {}
    for r in out:
        if not (set(r.custom_ops) & skip):
            unique.setdefault((r.id, r.signature()), r)
    return list(unique.values())


#: Our linear ids -> the module path SGLang matches ModelOpt's exclude / ignore list against
#: (a fused layer counts as excluded when any of its parts is: gate_up = gate_proj / up_proj).
_MODULE_PATHS = {
    "linear.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.qkv_proj"),
    "linear.o_proj": ("self_attn.o_proj",),
    "linear.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj", "mlp.gate_up_proj"),
    "linear.down_proj": ("mlp.down_proj",),
    "linear.shared_experts.down_proj": ("mlp.shared_experts.down_proj",),
}


def _excluded(name: str, patterns: tuple[str, ...]) -> bool:
    """ModelOpt's exclude / ignore list, matched as glob patterns against the layer's module path
    (quantization/modelopt_quant.py is_layer_excluded), for any decoder layer."""
    import fnmatch

    paths = [f"model.layers.0.{m}" for m in _MODULE_PATHS.get(name, ())]
    return any(fnmatch.fnmatch(path, pat) or path.startswith(pat + ".") for path in paths for pat in patterns)
