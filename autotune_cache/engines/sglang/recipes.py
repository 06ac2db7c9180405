"""SGLang 0.5.23's tunable FlashInfer calls for a model: one recipe (``autotuner.recipe``) per call site.

Each builder mirrors the SGLang function it names (``mirrors``); tests/data/sglang-0.5.23/matrix.json
holds the calls SGLang's own code made (tests/oracle), compared argument by argument in CI.

Verified on a GPU (sm90): ``cutlass_fused_moe`` (bf16) and ``bmm_fp8``. The sm100 recipes
(trtllm-gen MoE, ``mm_fp4``, MLA decode) are written from the SGLang 0.5.23 call sites they cite
and tested at the argument level only: no Blackwell GPU has run them yet.
"""

from __future__ import annotations

from autotune_cache.autotuner.recipe import M, M128, Dtype, OpRecipe, T
from autotune_cache.calls.fused_moe import (cutlass_moe, moe_layers_in, round_up, trtllm_bf16_moe, trtllm_fp4_moe,
                                            trtllm_fp8_block_moe)
from autotune_cache.errors import UsageError
from autotune_cache.plan.resolution import Resolution, arch_major
from autotune_cache.plan.spec import ModelSpec


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
        "a_descale": T((M128, round_up(k // 16, 4)), "uint8", fill="scale"),
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
    return round_up(-(-max_seq_len // page), 4096 // page)


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


def _moe_recipe(spec: ModelSpec, res: Resolution, moe_layers: int) -> OpRecipe | None:
    """The experts' call - which must be the one SGLang's own dispatch recorded for this kind of
    weights, backend and a2a backend (``res.moe_dispatch``), or the plan refuses it as not modelled."""
    d = res.moe_dispatch
    if d is not None and not d.error and not d.runs_flashinfer:
        return None  # SGLang's own dispatch runs these experts outside FlashInfer (dispatch.py)
    recipe = _moe_call(spec, res, moe_layers)
    if d is not None and d.apis is not None and (recipe.api if recipe else None) not in d.tunable_apis:
        raise UsageError(d.not_modelled(recipe.api if recipe else None))
    return recipe


def _moe_call(spec: ModelSpec, res: Resolution, moe_layers: int) -> OpRecipe | None:
    backend = res.moe_runner_backend
    q = res.model_quantization
    sm100 = arch_major(res.arch) == 10
    if res.flags.moe_a2a_backend == "flashinfer" and any(p.phase != "decode" for p in res.passes):
        # token_dispatcher/flashinfer.py: only decode batches go through the all-to-all (the probe's
        # call); an all-gather prefill runs the MoE without it - another key, not recorded
        raise UsageError(f"--moe-a2a-backend flashinfer with {', '.join(sorted({p.phase for p in res.passes}))} "
                         "passes: SGLang's MoE then runs both with and without its all-to-all; not modelled")
    if spec.moe is None or not moe_layers or backend not in ("flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_trtllm"):
        if spec.moe is not None and moe_layers and backend in ("flashinfer_trtllm_routed", "flashinfer_cutedsl"):
            raise UsageError(f"--moe-runner-backend {backend}: SGLang 0.5.23 tunes its own FlashInfer calls there "
                             "and fi-autotune does not model them")
        return None
    if backend == "flashinfer_cutlass" or (backend == "flashinfer_mxfp4" and not sm100):
        if spec.quant and spec.quant.is_block_fp8:
            return None  # block FP8: SGLang's Fp8MoEMethod runs Triton there (dispatch.py's probe)
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
        if not r.skipped_by(skip):
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
