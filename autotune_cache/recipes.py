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

from .errors import UsageError
from .sglang import Resolution, arch_major
from .spec import Family, ModelSpec

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


class _Repr:
    """Renders like a torch dtype or a bool inside ``str(tuple)``, without importing torch."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _td(name: str) -> _Repr:
    return _Repr(f"torch.{name}")


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

    def signature(self) -> tuple:
        """What makes two ranks' calls produce the same cache keys (rank offsets excluded)."""
        return (self.api, tuple(sorted((k, repr(encode(v))) for k, v in self.kwargs.items() if k not in _RANK_ONLY)))

    def file_keys(self, bucket: int) -> list[str]:
        return [str(k) for k in _KEYS[self.api](self, bucket)]

    @classmethod
    def from_dict(cls, d: dict) -> "OpRecipe":
        return cls(d["id"], d["api"], tuple(d["custom_ops"]), {k: decode(v) for k, v in d["kwargs"].items()},
                   d["tokens"], d["bucket_rule"], d["layers"], d["mirrors"], d["engine_tune_max_cap"], d["verified"])

    def to_dict(self) -> dict:
        return {
            "id": self.id, "api": self.api, "custom_ops": list(self.custom_ops),
            "kwargs": {k: encode(v) for k, v in self.kwargs.items()},
            "tokens": self.tokens, "bucket_rule": self.bucket_rule, "layers": self.layers,
            "mirrors": self.mirrors, "engine_tune_max_cap": self.engine_tune_max_cap, "verified": self.verified,
        }


# Arguments that differ between ranks but never reach a cache key.
_RANK_ONLY = {"ep_rank", "tp_rank", "local_expert_offset"}


# ---------------------------------------------------------------------------------------------
# Key prediction: FlashInfer's ProfilingCacheKey.file_key = str((custom_op, runner, profile, extras))
# ---------------------------------------------------------------------------------------------

def _cutlass_moe_keys(r: OpRecipe, bucket: int):
    """flashinfer/fused_moe/core.py cutlass_fused_moe: choose_one over
    [input, fc1_w, fc1_b, fc2_w, fc2_b], dim 0 of input bucketed; extras = MoERunner.get_cache_key_extras."""
    kw = r.kwargs
    x, w1, w2 = kw["input"], kw["fc1_expert_weights"], kw["fc2_expert_weights"]
    b1 = kw.get("fc1_expert_biases")
    b2 = kw.get("fc2_expert_biases")
    profile = (
        x.concrete(bucket), w1.shape, b1.shape if b1 else (0,), w2.shape, b2.shape if b2 else (0,),
    )
    extras = (
        _td(x.dtype), _td(w1.dtype), _td(kw["output_dtype"].name), kw["token_selected_experts"].shape[1],
        kw["tp_size"], kw["ep_size"], 1, kw["enable_alltoall"], False,
        kw.get("use_w4_group_scaling", False), False, False, False,
        True,  # enable_pdl: device_support_pdl() on sm90+
        kw["activation_type"].value, False, kw["use_fused_finalize"],
    )
    return [(op, "MoERunner", profile, extras) for op in r.custom_ops]


def _bmm_fp8_keys(r: OpRecipe, bucket: int):
    """gemm_base.py fp8_gemm_sm100 -> choose_one("fp8_gemm", [a, b, sa, sb, out, workspace]):
    a's dim -2 bucketed; out dim -2 and workspace dim 0 constrained (-1); extras = dtypes."""
    kw = r.kwargs
    a, b = kw["A"], kw["B"]
    out_dtype = kw["dtype"].name
    profile = (a.concrete(bucket), b.shape, (1,), (1,), (1, -1, b.shape[2]), (-1,))
    runner = {"cublas": "CublasFp8GemmRunner", "cudnn": "CudnnFp8GemmRunner"}[kw["backend"]]
    return [("fp8_gemm", runner, profile, (_td(a.dtype), _td(b.dtype), _td(out_dtype)))]


def _trtllm_moe_keys(r: OpRecipe, bucket: int):
    """trtllm-gen MoE (sm100), approximate: the runner class is ``MoERunner``
    (fused_moe/backends/trtllm/sm100_runner.py; ``TrtllmMoERunner`` is an import alias), the
    profile covers the eight ``MoeRunnerInputs`` fields and the extras start with the JIT module's
    class name and enum ints we cannot read without the kernels. Here: the hidden-states profile
    and the shape-derived extras only. Not yet checked against a Blackwell-written file."""
    kw = r.kwargs
    hs = kw["hidden_states"]
    extras = (
        kw["top_k"], kw["local_num_experts"], kw["num_experts"], 0, hs.dtype,
        kw.get("gemm1_weights").dtype, hs.shape[1], hs.shape[1], kw["intermediate_size"],
    )
    return [(op, "MoERunner", (hs.concrete(bucket),), extras) for op in r.custom_ops]


def _generic_keys(r: OpRecipe, bucket: int):
    first = next(v for v in r.kwargs.values() if isinstance(v, T))
    return [(op, "?", (first.concrete(bucket),), ()) for op in r.custom_ops]


_KEYS = {
    "flashinfer.fused_moe.cutlass_fused_moe": _cutlass_moe_keys,
    "flashinfer.bmm_fp8": _bmm_fp8_keys,
    "flashinfer.fused_moe.trtllm_fp8_block_scale_moe": _trtllm_moe_keys,
    "flashinfer.fused_moe.trtllm_bf16_moe": _trtllm_moe_keys,
    "flashinfer.fused_moe.trtllm_fp4_block_scale_moe": _trtllm_moe_keys,
    "flashinfer.mm_fp4": _generic_keys,
    "flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla": _generic_keys,
}

# ---------------------------------------------------------------------------------------------
# Recipes
# ---------------------------------------------------------------------------------------------

_SWIGLU = Enum("flashinfer.fused_moe.core.ActivationType.Swiglu", 3)
_CUTLASS_TUNE_CAP = 8192  # flashinfer_cutlass.py _FLASHINFER_DEFAULT_TUNE_MAX_NUM_TOKENS


def _moe_dims(spec: ModelSpec, res: Resolution) -> tuple[int, int, int, int]:
    assert spec.moe is not None and res.experts_per_rank is not None and res.moe_intermediate_per_partition is not None
    return spec.hidden_size, res.experts_per_rank, res.moe_intermediate_per_partition, spec.moe.top_k


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
        "use_fused_finalize": False,  # SGLANG_FLASHINFER_MOE_FUSED_FINALIZE defaults to False
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
        # W4A16: bf16 activations, packed e2m1 weights (2 per byte) with ue8m0 scales per 32.
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
        raise UsageError(f"flashinfer_cutlass MoE does not tune {q!r} weights here")
    return OpRecipe(
        id="moe.experts", api="flashinfer.fused_moe.cutlass_fused_moe",
        custom_ops=("trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2"), kwargs=kwargs,
        tokens="moe", bucket_rule="moe_clamped", layers=layers,
        mirrors="sglang/srt/layers/moe/moe_runner/flashinfer_cutlass.py:_run_flashinfer_cutlass",
        engine_tune_max_cap=_CUTLASS_TUNE_CAP, verified=verified,
    )


def _routing(spec: ModelSpec) -> tuple[Enum, Any, Any]:
    """sglang/srt/layers/moe/utils.py RoutingMethodType as each model's gate selects it."""
    assert spec.moe is not None
    if spec.family in (Family.MLA_MOE, Family.MLA_DSA_MOE):
        return Enum("flashinfer.fused_moe.RoutingMethodType.DeepSeekV3", 2), spec.moe.n_group, spec.moe.topk_group
    # models/qwen3_moe.py (and gpt-oss, Mixtral): TopK -> Softmax
    return Enum("flashinfer.fused_moe.RoutingMethodType.Renormalize", 1), None, None


def _trtllm_common(spec: ModelSpec, res: Resolution) -> dict:
    h, e, i, k = _moe_dims(spec, res)
    routing, n_group, topk_group = _routing(spec)
    deepseek = routing.qualname.endswith("DeepSeekV3")
    return {
        "routing_logits": T((M, spec.moe.num_experts), "float32" if deepseek else res.dtype, fill="router_logits"),
        "routing_bias": T((spec.moe.num_experts,), res.dtype, fill="bias") if deepseek else None,
        "num_experts": spec.moe.num_experts,
        "top_k": k,
        "n_group": n_group,
        "topk_group": topk_group,
        "intermediate_size": i,
        "local_expert_offset": 0,
        "local_num_experts": e,
        "routed_scaling_factor": spec.moe.routed_scaling_factor if spec.moe.routed_scaling_factor is not None else 1.0,
        "routing_method_type": routing,
    }


def trtllm_fp8_block_moe(spec: ModelSpec, res: Resolution, layers: int) -> OpRecipe:
    """flashinfer_trtllm.py _run_fp8_block_scale_moe (DeepSeek-style 128x128 block FP8, sm100)."""
    h, e, i, _ = _moe_dims(spec, res)
    kwargs = _trtllm_common(spec, res) | {
        "hidden_states": T((M, h), "float8_e4m3fn", fill="activation"),
        "hidden_states_scale": T((h // 128, M), "float32", fill="scale"),  # a_sf.t() of column-major scales
        "gemm1_weights": T((e, 2 * i, h), "float8_e4m3fn"),
        "gemm1_weights_scale": T((e, 2 * i // 128, h // 128), "float32", fill="scale"),
        "gemm2_weights": T((e, h, i), "float8_e4m3fn"),
        "gemm2_weights_scale": T((e, h // 128, i // 128), "float32", fill="scale"),
        "use_shuffled_weight": False,
        "fp8_quantization_type": Enum("flashinfer.fused_moe.Fp8QuantizationType.DeepSeekFp8", 1),
        "tune_max_num_tokens": "next_power_of_2(M)",
    }
    return OpRecipe(
        id="moe.experts", api="flashinfer.fused_moe.trtllm_fp8_block_scale_moe",
        custom_ops=("flashinfer::trtllm_fp8_block_scale_moe",), kwargs=kwargs, tokens="moe",
        bucket_rule="moe_clamped", layers=layers,
        mirrors="sglang/srt/layers/moe/moe_runner/flashinfer_trtllm.py:_run_fp8_block_scale_moe (common_kwargs)",
    )


def trtllm_bf16_moe(spec: ModelSpec, res: Resolution, layers: int) -> OpRecipe:
    """flashinfer_trtllm.py bf16 path: trtllm_bf16_moe with shuffled BlockMajorK weights (sm100)."""
    h, e, i, _ = _moe_dims(spec, res)
    kwargs = _trtllm_common(spec, res) | {
        "hidden_states": T((M, h), "bfloat16", fill="activation"),
        "gemm1_weights": T((e, 2 * i, h), "bfloat16"),
        "gemm2_weights": T((e, h, i), "bfloat16"),
        "use_shuffled_weight": True,
        "weight_layout": Enum("flashinfer.fused_moe.WeightLayout.BlockMajorK", 2),
        "tune_max_num_tokens": "next_power_of_2(M)",
    }
    return OpRecipe(
        id="moe.experts", api="flashinfer.fused_moe.trtllm_bf16_moe",
        custom_ops=("flashinfer::trtllm_bf16_moe",), kwargs=kwargs, tokens="moe", bucket_rule="moe_clamped",
        layers=layers, mirrors="sglang/srt/layers/moe/moe_runner/flashinfer_trtllm.py:_run_bf16_moe",
    )


def trtllm_fp4_moe(spec: ModelSpec, res: Resolution, layers: int) -> OpRecipe:
    """flashinfer_trtllm.py NVFP4 (modelopt_fp4) and MXFP4 (gpt-oss, flashinfer_mxfp4) paths on sm100."""
    h, e, i, _ = _moe_dims(spec, res)
    mx = res.model_quantization == "mxfp4"
    sf_vec = 32 if mx else 16
    kwargs = _trtllm_common(spec, res) | {
        # NVFP4: fp4 activations + swizzled e4m3 scales; MXFP4 (gpt-oss default precision): bf16 activations
        "hidden_states": T((M, h), "bfloat16", fill="activation") if mx else T((M, h // 2), "uint8", fill="activation"),
        "hidden_states_scale": None if mx else T((M, h // 16), "float8_e4m3fn", fill="scale"),
        "gemm1_weights": T((e, 2 * i, h // 2), "uint8"),
        "gemm1_weights_scale": T((e, 2 * i, h // sf_vec), "uint8" if mx else "float8_e4m3fn", fill="scale"),
        "gemm1_bias": T((e, 2 * i), "float32", fill="bias") if spec.moe.has_bias else None,
        "gemm2_weights": T((e, h, i // 2), "uint8"),
        "gemm2_weights_scale": T((e, h, i // sf_vec), "uint8" if mx else "float8_e4m3fn", fill="scale"),
        "gemm2_bias": T((e, h), "float32", fill="bias") if spec.moe.has_bias else None,
        "tune_max_num_tokens": "next_power_of_2(M)",
    }
    return OpRecipe(
        id="moe.experts", api="flashinfer.fused_moe.trtllm_fp4_block_scale_moe",
        custom_ops=("flashinfer::trtllm_fp4_block_scale_moe",), kwargs=kwargs, tokens="moe", bucket_rule="moe_clamped",
        layers=layers, mirrors="sglang/srt/layers/moe/moe_runner/flashinfer_trtllm.py:_run_fp4_moe / _run_mxfp4_moe",
    )


def linear_shapes(spec: ModelSpec, res: Resolution) -> list[tuple[str, int, int, int]]:
    """(name, K, N, layers) of the per-rank linear layers of one decoder block, TP-split as SGLang does
    (QKVParallelLinear / RowParallelLinear / MergedColumnParallelLinear). Attention TP is tp/dp."""
    h, tp_attn = spec.hidden_size, res.attn_tp_size
    kv_heads = max(1, spec.num_kv_heads // tp_attn)
    q = spec.num_attention_heads // tp_attn * spec.head_dim
    out = [("linear.qkv_proj", h, q + 2 * kv_heads * spec.head_dim, spec.num_layers),
           ("linear.o_proj", q, h, spec.num_layers)]
    if spec.dense_intermediate_size and spec.num_dense_mlp_layers:
        inter = spec.dense_intermediate_size // res.flags.tp
        out += [("linear.gate_up_proj", h, 2 * inter, spec.num_dense_mlp_layers),
                ("linear.down_proj", inter, h, spec.num_dense_mlp_layers)]
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
        verified=True,
    )


def mm_fp4_linear(name: str, k: int, n: int, layers: int, res: Resolution) -> OpRecipe:
    """sglang/srt/layers/quantization/fp4_utils.py fp4_gemm -> flashinfer.mm_fp4 (NVFP4, sm100):
    a [M, K/2] packed e2m1, b [N, K/2].T, 16-element e4m3 block scales (swizzled), alpha per tensor."""
    kwargs = {
        "a": T((M, k // 2), "uint8", fill="activation"),
        "b": T((k // 2, n), "uint8", layout="column_major"),
        "a_descale": T((M, k // 16), "float8_e4m3fn", fill="scale"),
        "b_descale": T((k // 16, n), "float8_e4m3fn", layout="column_major", fill="scale"),
        "alpha": T((1,), "float32", fill="scale"),
        "out_dtype": Dtype(res.dtype),
        "block_size": 16,
        "use_8x4_sf_layout": False,
        "backend": "cutlass",
    }
    return OpRecipe(
        id=name, api="flashinfer.mm_fp4", custom_ops=("fp4_gemm",), kwargs=kwargs, tokens="dense", bucket_rule="gemm",
        layers=layers, mirrors="sglang/srt/layers/quantization/fp4_utils.py:fp4_gemm (flashinfer_cutlass runner)",
    )


def mla_decode(spec: ModelSpec, res: Resolution, page_size: int = 64) -> OpRecipe:
    """sglang/srt/layers/attention/trtllm_mla_backend.py forward_decode (and dsa_backend.py's trtllm
    decode for DSA models, with sparse_mla_top_k = index_topk): one query token per request."""
    assert spec.mla is not None
    heads = spec.num_attention_heads // res.attn_tp_size
    width = spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim
    max_pages = -(-spec.max_position_embeddings // page_size)
    kwargs = {
        "query": T((M, 1, heads, width), res.dtype, fill="activation"),
        "kv_cache": T(("num_pages", page_size, width), res.dtype),
        "workspace_buffer": T((128 * 1024 * 1024,), "uint8", fill="zeros"),
        "qk_nope_head_dim": spec.mla.qk_nope_head_dim,
        "kv_lora_rank": spec.mla.kv_lora_rank,
        "qk_rope_head_dim": spec.mla.qk_rope_head_dim,
        "block_tables": T((M, max_pages), "int32", fill="zeros"),
        "seq_lens": T((M,), "int32", fill="zeros"),
        "max_seq_len": spec.max_position_embeddings,
        "sparse_mla_top_k": spec.mla.index_topk or 0,
        "bmm1_scale": 1.0 / (spec.mla.qk_head_dim ** 0.5),
        "bmm2_scale": 1.0,
    }
    return OpRecipe(
        id="attn.mla_decode", api="flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla",
        custom_ops=("trtllm_batch_decode_mla",), kwargs=kwargs, tokens="decode", bucket_rule="gemm",
        layers=spec.num_layers,
        mirrors="sglang/srt/layers/attention/trtllm_mla_backend.py:TRTLLMMLABackend.forward_decode",
    )


def moe_layers_in(spec: ModelSpec, layers: range) -> int:
    """How many of ``layers`` are MoE layers (after the dense first ones, every ``layer_freq``-th)."""
    return sum(1 for i in layers if spec.moe and i >= spec.moe.first_dense_layers and i % spec.moe.layer_freq == 0)


def recipes_for(spec: ModelSpec, res: Resolution, layers: range) -> list[OpRecipe]:
    """The tunable calls one pipeline stage (``layers``) makes in SGLang's dummy forward."""
    if not res.autotunes:
        return []
    sm100 = arch_major(res.arch) == 10
    out: list[OpRecipe] = []
    moe_layers = moe_layers_in(spec, layers)
    dense_layers = len(layers) - moe_layers
    backend = res.moe_runner_backend
    q = res.model_quantization

    if spec.moe is not None and moe_layers and backend in ("flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_trtllm"):
        if backend == "flashinfer_cutlass" or (backend == "flashinfer_mxfp4" and not sm100):
            if not (spec.quant and spec.quant.is_block_fp8):  # block FP8: CUTLASS profiler has no tactics on sm90
                out.append(cutlass_moe(spec, res, moe_layers))
        elif sm100 and backend == "flashinfer_mxfp4" or (sm100 and q in ("modelopt_fp4", "modelopt_mixed")):
            out.append(trtllm_fp4_moe(spec, res, moe_layers))
        elif sm100 and q == "fp8" and spec.quant and spec.quant.is_block_fp8:
            out.append(trtllm_fp8_block_moe(spec, res, moe_layers))
        elif sm100 and q is None:
            out.append(trtllm_bf16_moe(spec, res, moe_layers))

    per_tensor_fp8 = q in ("modelopt", "modelopt_fp8", "modelopt_mixed")
    if per_tensor_fp8 or (sm100 and q in ("modelopt_fp4",)):
        make = bmm_fp8_linear if per_tensor_fp8 else mm_fp4_linear
        seen = set()
        for name, k, n, count in linear_shapes(spec, res):
            if name.startswith("linear.gate_up") or name.startswith("linear.down"):
                count = dense_layers
            else:
                count = len(layers)
            if count == 0 or (k, n) in seen or k % 16 or n % 16:  # ModelOptFp8LinearMethod._can_use_flashinfer_bmm
                continue
            seen.add((k, n))
            out.append(make(name, k, n, count, res))

    if sm100 and spec.mla is not None and res.autotunes:
        out.append(mla_decode(spec, res))
    skip = set(res.key_fields.skip_ops)
    return [r for r in out if not (set(r.custom_ops) & skip)]
