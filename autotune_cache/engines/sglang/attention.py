"""The attention side of SGLang 0.5.23's resolution: which backend decodes, in which KV dtype and
page size, and whether that backend calls FlashInfer's one tunable attention op.

Only ``flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla`` (custom op
``trtllm_batch_decode_mla``) reaches FlashInfer's autotuner among the attention entry points
SGLang calls (the oracle checked every one: MHA decode/prefill, the MLA paged wrapper, ragged
prefill). SGLang calls it from ``TRTLLMMLABackend`` (``trtllm_mla``), ``CuteDslMLABackend``
(``cutedsl_mla``) and the DSA backend with ``--dsa-decode-backend trtllm``; never on sm90. Each
rule below names the SGLang function it mirrors; tests/data/sglang-0.5.23/ holds what SGLang's
own code resolved for the serving-command matrix and the flag probes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from autotune_cache.errors import UsageError
from autotune_cache.plan.spec import Family, ModelSpec

#: Decode backends whose MLA decode is FlashInfer's tunable op, and the ``backend`` they pass.
MLA_TUNABLE = {"trtllm_mla": "auto", "cutedsl_mla": "cute-dsl"}
#: The DSA decode backend that calls it (dsa_backend.py), with ``backend="trtllm-gen"``.
DSA_TUNABLE_DECODE = "trtllm"
KV_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")


@dataclass(frozen=True)
class Attention:
    """What the attention layers will run, as SGLang resolves it."""

    decode_backend: str
    prefill_backend: str
    kv_cache_dtype: str  # resolved: "auto" (the model dtype), "fp8_e4m3", "bfloat16", ...
    page_size: int
    context_length: int
    dsa_decode_backend: str | None  # DSA models only
    #: The FlashInfer ``backend`` argument of the tunable MLA call, or None when decode calls none.
    mla_backend: str | None
    #: Which backend serves TARGET_VERIFY (speculative decoding): the prefill side of a split
    #: backend unless --speculative-attention-mode decode (hybrid_attn_backend.py _select_backend).
    verify_backend: str
    verify_mla_backend: str | None
    notes: tuple[str, ...] = ()

    @property
    def kv_is_fp8(self) -> bool:
        return self.kv_cache_dtype == "fp8_e4m3"

    def to_dict(self) -> dict:
        return asdict(self)


def _mla_default(arch_major: int) -> str:
    """model_override_base.py get_default_attn_backend, MLA branch: fa3 on Hopper, flashinfer on
    Blackwell (before the DeepSeek-family override below)."""
    return "fa3" if arch_major == 9 else "flashinfer"


def resolve_attention(spec: ModelSpec, arch_major: int, *, attention_backend: str | None,
                      decode_attention_backend: str | None, prefill_attention_backend: str | None,
                      kv_cache_dtype: str, page_size: int | None, context_length: int | None,
                      dsa_decode_backend: str | None, speculative_attention_mode: str | None) -> Attention:
    notes: list[str] = []
    mla = spec.mla is not None
    dsa = spec.family == Family.MLA_DSA_MOE
    if kv_cache_dtype not in KV_DTYPES:
        raise UsageError(f"--kv-cache-dtype {kv_cache_dtype!r}: SGLang 0.5.23 takes {', '.join(KV_DTYPES)}")
    explicit = (attention_backend, prefill_attention_backend, decode_attention_backend)
    _check_startup(spec, arch_major, explicit, kv_cache_dtype, mla)
    if not mla:
        # GQA models: no attention entry point SGLang calls reaches FlashInfer's autotuner.
        backend = attention_backend or "default"
        return Attention(decode_attention_backend or backend, prefill_attention_backend or backend, kv_cache_dtype,
                         page_size or 1, context_length or spec.max_position_embeddings, None, None,
                         prefill_attention_backend or backend, None)
    if attention_backend == "nsa":
        attention_backend = "dsa"  # the DSA backend's former name, still accepted
    if "tokenspeed_mla" in (attention_backend, decode_attention_backend):
        # serving_hook.py _handle_deprecated_args: cutedsl_mla under its old name, FP8 KV and
        # verify on the decode kernel kept.
        kv_cache_dtype = "fp8_e4m3"
        speculative_attention_mode = "decode" if speculative_attention_mode == "prefill" else speculative_attention_mode
    attention_backend, decode_attention_backend = (
        "cutedsl_mla" if b == "tokenspeed_mla" else b for b in (attention_backend, decode_attention_backend))
    if prefill_attention_backend in ("tokenspeed_mla", "cutedsl_mla"):
        prefill_attention_backend = "trtllm_mla"  # cutedsl_mla is decode-only
    if dsa:
        # model_overrides/deepseek_v2.py: DSA models run the "dsa" backend (page 64 x index_kpool).
        backend = attention_backend or "dsa"
    elif all(b is None for b in explicit) and arch_major == 10:
        backend = "trtllm_mla"  # _deepseek_family_overrides: only when no attention flag is set
    else:
        backend = attention_backend or _mla_default(arch_major)
    decode = {"nsa": "dsa"}.get(decode_attention_backend, decode_attention_backend) or backend
    prefill = {"nsa": "dsa"}.get(prefill_attention_backend, prefill_attention_backend) or backend
    if decode == "cutedsl_mla" and prefill_attention_backend is None and attention_backend in (None, "cutedsl_mla"):
        prefill = "trtllm_mla"  # overrides.py _cutedsl_prefill_backend_fill
    if arch_major == 9 and "trtllm_mla" in (decode, prefill):
        raise UsageError("--attention-backend trtllm_mla: SGLang 0.5.23 runs it on Blackwell only")
    kv, page = _kv_and_page(dsa, decode, prefill, kv_cache_dtype, page_size, arch_major, notes)
    dsa_decode = None
    if dsa:
        # overrides.py _dsa_split_backend_resolution: trtllm decode on Blackwell (both KV dtypes);
        # Hopper decodes with fa3 (a bf16 KV cache) - neither is a FlashInfer call on sm90.
        dsa_decode = dsa_decode_backend or ("trtllm" if arch_major >= 10 else "fa3")
        if dsa_decode == "triton":
            raise UsageError("--dsa-decode-backend triton: SGLang 0.5.23 runs it on ROCm only")
        if dsa_decode == "tilelang" and kv == "fp8_e4m3":
            raise UsageError("--dsa-decode-backend tilelang: with an FP8 KV cache SGLang 0.5.23 needs the DSA prefill "
                             "backend on tilelang too (--dsa-prefill-backend is not modelled)")
    mla_backend = _tunable(decode, dsa_decode)
    uniform = decode == prefill
    verify = decode if uniform or speculative_attention_mode == "decode" else prefill
    return Attention(decode, prefill, kv, page, context_length or spec.max_position_embeddings, dsa_decode,
                     mla_backend, verify, _tunable(verify, dsa_decode), tuple(notes))


def _kv_and_page(dsa: bool, decode: str, prefill: str, kv_cache_dtype: str, page_size: int | None, arch_major: int,
                 notes: list[str]) -> tuple[str, int]:
    """The KV dtype and page size the MLA backends run with."""
    # KV dtype (overrides.py _dsa_kv_cache_dtype_default, _mla_kv_cache_dtype_checks).
    kv = kv_cache_dtype
    if dsa and decode == "dsa":
        if kv == "auto":
            kv = "fp8_e4m3" if arch_major >= 10 else "bfloat16"
        if kv == "bf16":
            kv = "bfloat16"
        if kv not in ("bfloat16", "fp8_e4m3"):
            raise UsageError(f"--kv-cache-dtype {kv_cache_dtype}: SGLang serves DeepSeek DSA in bf16 or fp8_e4m3 only")
    elif "trtllm_mla" in (decode, prefill) and kv not in ("fp8_e4m3", "bf16", "auto"):
        raise UsageError(f"--kv-cache-dtype {kv_cache_dtype}: the trtllm_mla backend takes fp8_e4m3, bf16 or auto")
    if kv == "bf16":
        kv = "bfloat16"
    # Page size (overrides.py _mla_backend_page_constraints; deepseek_v2.py for DSA).
    page = page_size
    if dsa and decode == "dsa":
        page = 64  # 64 x index_kpool (1 for DeepSeek-V3.2 and GLM-5.x)
        if page_size not in (None, 64):
            notes.append(f"--page-size {page_size}: SGLang sets page size 64 for DeepSeek DSA")
    elif "trtllm_mla" in (decode, prefill) or decode == "cutedsl_mla":
        page = page_size if page_size in (32, 64) else 64
        if page_size not in (None, 32, 64):
            notes.append(f"--page-size {page_size}: TensorRT-LLM MLA takes 32 or 64; SGLang uses 64")
    elif "flashmla" in (decode, prefill):
        page = 64
    elif page is None:
        page = 1
    return kv, page


#: model_hook.py: the attention backends gpt-oss runs on (CUDA ones; SGLang also lists AMD/Intel).
GPT_OSS_BACKENDS = ("triton", "trtllm_mha", "fa3", "fa4", "ascend", "intel_amx", "intel_xpu", "aiter")
#: Blackwell-only attention backends and KV dtypes (SGLang refuses them on sm90 at startup).
BLACKWELL_BACKENDS = ("trtllm_mla", "cutedsl_mla", "tokenspeed_mla")
BLACKWELL_KV = ("mxfp8", "nvfp4")
#: KV4 (fp4_mx_block16) on an MHA model: the backends SGLang accepts (overrides.py).
KV4_MHA_BACKENDS = ("triton", "torch_native", "flex_attention", "trtllm_mha")


def _check_startup(spec: ModelSpec, arch_major: int, explicit: tuple, kv_cache_dtype: str, mla: bool) -> None:
    """SGLang's startup refusals for attention flags fi-autotune models (each a UsageError naming
    the flag, as SGLang would stop the server)."""
    attention, prefill, decode = explicit
    named = [(f, b) for f, b in (("--attention-backend", attention), ("--prefill-attention-backend", prefill),
                                 ("--decode-attention-backend", decode)) if b is not None]
    for flag, b in named:
        if b in BLACKWELL_BACKENDS and arch_major < 10 and (mla or flag != "--prefill-attention-backend"):
            raise UsageError(f"{flag} {b}: SGLang 0.5.23 runs it on Blackwell (sm100/sm103) only")
        if spec.architecture == "GptOssForCausalLM" and b not in GPT_OSS_BACKENDS:
            raise UsageError(f"{flag} {b}: SGLang 0.5.23 runs gpt-oss on {', '.join(GPT_OSS_BACKENDS[:4])} only")
    if prefill == "cutedsl_mla":
        raise UsageError("--prefill-attention-backend cutedsl_mla: SGLang 0.5.23's CuteDSL MLA backend decodes only")
    if kv_cache_dtype in BLACKWELL_KV and arch_major < 10:
        raise UsageError(f"--kv-cache-dtype {kv_cache_dtype}: SGLang 0.5.23 takes it on Blackwell (sm100/sm103) only")
    if kv_cache_dtype == "fp4_mx_block16" and not mla:
        used = attention or ("fa3" if arch_major == 9 else None)
        if used is not None and used not in KV4_MHA_BACKENDS:
            raise UsageError(f"--kv-cache-dtype fp4_mx_block16: SGLang 0.5.23 takes it with the "
                             f"{', '.join(KV4_MHA_BACKENDS)} attention backends, not {used}")


def _tunable(backend: str, dsa_decode: str | None) -> str | None:
    if backend == "dsa":
        return "trtllm-gen" if dsa_decode == DSA_TUNABLE_DECODE else None
    return MLA_TUNABLE.get(backend)
