"""What SGLang 0.5.23 would resolve from a model spec, a target arch and the user's server flags.

Each rule cites the SGLang function it mirrors. Only the decisions that change the cache key,
whether FlashInfer autotune runs, or the shapes and token counts of the tuned ops live here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .errors import UsageError
from .keys import KeyFields, render_dtype
from .topology import Topology, TopologyError
from .spec import ModelSpec

# sglang/srt/model_executor/runner/flashinfer_autotune.py: should_run_flashinfer_autotune
MOE_BACKENDS_THAT_AUTOTUNE = (
    "flashinfer_trtllm",
    "flashinfer_trtllm_routed",
    "flashinfer_mxfp4",
    "flashinfer_cutedsl",
    "flashinfer_cutlass",
    "flashinfer_megamoe",
)
MOE_BACKENDS = MOE_BACKENDS_THAT_AUTOTUNE + ("auto", "triton", "triton_kernel", "deep_gemm", "marlin", "cutlass")

# arg_groups/overrides.py: _DEEPSEEK_FAMILY_ARCHS (the ones we model)
DEEPSEEK_FAMILY = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")
# arg_groups/model_overrides/qwen3_moe.py: _qwen3_moe_family_overrides
QWEN3_MOE_FAMILY = ("Qwen3MoeForCausalLM",)

SUPPORTED_ARCHS = ("sm90", "sm100", "sm103")


def arch_major(arch: str) -> int:
    digits = arch[2:].rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(digits[:-1])


@dataclass(frozen=True)
class ServerFlags:
    """The sglang server flags that matter here; None means "left to SGLang's default"."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    dp_attention: bool = True
    ep: int = 1
    dtype: str = "auto"
    quantization: str | None = None
    moe_runner_backend: str = "auto"
    moe_a2a_backend: str = "none"
    skip_ops: tuple[str, ...] = ()
    max_running_requests: int | None = None
    cuda_graph_max_bs: int | None = None
    chunked_prefill_size: int | None = None
    autotune_extend: bool = False  # SGLANG_FLASHINFER_AUTOTUNE_EXTEND=1
    #: Why the server will not autotune at all (--disable-flashinfer-autotune, ...), or None.
    autotune_disabled_by: str | None = None
    #: The GPUs the tp ranks run on, in tp-rank order: flashinfer_megamoe (0.5.22+) names each
    #: rank file after its GPU's UUID.
    gpu_uuids: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["skip_ops"] = list(self.skip_ops)
        d["gpu_uuids"] = list(self.gpu_uuids)
        return d

    @classmethod
    def from_dict(cls, d: object) -> "ServerFlags":
        """From a manifest's request; unknown names (a newer fi-autotune's) are a ValueError,
        so a renamed flag can never be silently dropped."""
        if not isinstance(d, dict):
            raise ValueError("flags is not an object")
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown server flags {sorted(unknown)}")
        values = dict(d)
        for name in ("skip_ops", "gpu_uuids"):
            if name in values:
                if not isinstance(values[name], (list, tuple)) or not all(isinstance(s, str) for s in values[name]):
                    raise ValueError(f"{name} is not a list of strings")
                values[name] = tuple(values[name])
        for name, f in cls.__dataclass_fields__.items():
            if name not in values or name in ("skip_ops", "gpu_uuids"):
                continue
            v = values[name]
            kind = {"int": int, "int | None": (int, type(None)), "bool": bool, "str": str,
                    "str | None": (str, type(None))}.get(str(f.type))
            if kind is not None and (not isinstance(v, kind) or (kind is int and isinstance(v, bool))):
                raise ValueError(f"flag {name} has the wrong type")
        return cls(**values)


@dataclass(frozen=True)
class Resolution:
    arch: str
    flags: ServerFlags
    topology: Topology
    key_fields: KeyFields
    dtype: str  # torch name, e.g. bfloat16
    quantization: str | None  # server-side value that goes into the key
    model_quantization: str | None  # ModelConfig.quantization: what the layers run
    moe_runner_backend: str
    attn_dp_size: int
    attn_tp_size: int
    moe_tp_size: int
    moe_ep_size: int
    experts_per_rank: int | None
    moe_intermediate_per_partition: int | None
    autotunes: bool
    reasons: tuple[str, ...]
    decode_batch: int  # per-rank decode batch of the dummy pass (CUDA-graph max bs)
    chunked_prefill_size: int
    notes: tuple[str, ...] = field(default=())

    @property
    def moe_tokens(self) -> int:
        """Tokens a MoE layer sees in the dummy pass: the decode batch of every attention-DP rank."""
        return self.decode_batch * self.attn_dp_size

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("flags", "topology", "key_fields")}
        d["flags"] = self.flags.to_dict()
        d["topology"] = self.topology.to_dict()
        d["key_fields"] = self.key_fields.to_dict()
        d["moe_tokens"] = self.moe_tokens
        return d


def _memory_defaults(arch: str, tp: int) -> tuple[int, int]:
    """(decode CUDA-graph max bs, chunked prefill size) for the GPU class of ``arch``.

    arg_groups/memory_hook.py _handle_gpu_memory_settings: H100 (80 GB) and H200 (141 GB) give
    max_bs 256 below tp 4 else 512 with an 8k chunk; B200/B300 (>= 160 GB) give 512 and 16k.
    """
    if arch == "sm90":
        return (256 if tp < 4 else 512), 8192
    return 512, 16384


def resolve(spec: ModelSpec, arch: str, flags: ServerFlags, model_path: str) -> Resolution:
    if arch not in SUPPORTED_ARCHS:
        raise UsageError(f"--arch {arch}: supported targets are {', '.join(SUPPORTED_ARCHS)}")
    megamoe = flags.moe_runner_backend == "flashinfer_megamoe"
    try:
        topo = Topology(tp=flags.tp, pp=flags.pp, dp=flags.dp, dp_attention=flags.dp_attention,
                        gpu_uuids=flags.gpu_uuids if megamoe else ())
    except TopologyError as e:
        raise UsageError(str(e)) from None
    if flags.ep < 1 or flags.tp % flags.ep:
        raise UsageError(f"--ep {flags.ep} must divide --tp {flags.tp}")
    if flags.moe_runner_backend not in MOE_BACKENDS:
        raise UsageError(f"unknown --moe-runner-backend {flags.moe_runner_backend!r}; known: {', '.join(MOE_BACKENDS)}")
    if flags.pp > spec.num_layers:
        raise UsageError(f"--pp {flags.pp} exceeds the model's {spec.num_layers} layers")
    for name in ("max_running_requests", "cuda_graph_max_bs", "chunked_prefill_size"):
        value = getattr(flags, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")

    sm100 = arch_major(arch) == 10
    notes: list[str] = []
    reasons: list[str] = []
    if megamoe:
        notes.append("flashinfer_megamoe's own autotune (FlashInfer namespaced records, SGLang "
                     "flashinfer_megamoe_autotune.py) is not modelled: SGLang still tunes it at startup")
        if not flags.gpu_uuids:
            notes.append("flashinfer_megamoe names each rank file after its GPU (rank_tp{t}_..._gpu<UUID>.json): "
                         "pass --gpu-uuids (the serving machine's, in tp-rank order) or --gpu-uuids auto there")
    elif flags.gpu_uuids:
        notes.append("--gpu-uuids ignored: only flashinfer_megamoe names rank files by GPU")

    # dtype: ModelRunner.dtype from --dtype (auto: the config's), forced bfloat16 for gpt-oss mxfp4
    # (model_overrides/gpt_oss.py).
    dtype = spec.dtype if flags.dtype == "auto" else render_dtype(flags.dtype)[len("torch."):]
    if spec.architecture == "GptOssForCausalLM" and spec.quant and spec.quant.method == "mxfp4":
        dtype = "bfloat16"

    ckpt_quant = spec.quant.method if spec.quant else None
    quantization = flags.quantization  # the server arg: this is what the key hashes
    backend = flags.moe_runner_backend
    if sm100 and spec.architecture in DEEPSEEK_FAMILY:
        # overrides.py _deepseek_moe_quant_resolution
        if quantization is None:
            if ckpt_quant is None and spec.architecture == "DeepseekV3ForCausalLM":
                notes.append(
                    "SGLang reads the safetensors headers to decide fp8 for a DeepseekV3 checkpoint without "
                    "quantization_config; without weights we assume bf16 (pass --quantization fp8 if not)"
                )
            else:
                quantization = ckpt_quant
        if flags.moe_a2a_backend == "none" and backend == "auto" and (
            quantization in ("fp8", "modelopt_fp8", "modelopt_fp4", "modelopt_mixed") or quantization is None
        ):
            backend = "flashinfer_trtllm"
    elif sm100 and spec.architecture in QWEN3_MOE_FAMILY:
        if quantization is None and ckpt_quant is not None:
            quantization = ckpt_quant
        if flags.moe_a2a_backend == "none" and backend == "auto" and (
            quantization in ("fp8", "modelopt_fp4", "modelopt_mixed") or quantization is None
        ):
            backend = "flashinfer_trtllm"
    elif spec.architecture == "GptOssForCausalLM" and backend == "auto":
        # model_overrides/gpt_oss.py _gpt_oss_overrides
        if sm100 and ckpt_quant == "mxfp4":
            backend = "flashinfer_mxfp4"
        elif flags.ep == 1 and quantization is None:
            backend = "triton_kernel"
            notes.append("gpt-oss defaults to the triton_kernel MoE backend here (assuming triton_kernels is installed)")

    # ModelConfig._verify_quantization: the checkpoint's method unless the flag overrides it.
    model_quant = quantization if quantization is not None else ckpt_quant

    # should_run_flashinfer_autotune
    moe_needs = spec.moe is not None and backend in MOE_BACKENDS_THAT_AUTOTUNE
    if model_quant in ("modelopt", "modelopt_fp8", "modelopt_mixed"):
        fp8_gemm_needs = True  # flashinfer_per_tensor_fp8_supported(): sm90 / sm100 / sm120
    else:
        fp8_gemm_needs = False  # block FP8 as MXFP8 on FlashInfer is not modelled (Blackwell MXFP8 only)
    fp4_gemm_needs = model_quant in ("modelopt_fp4", "modelopt_mixed") and sm100
    if moe_needs:
        reasons.append(f"MoE runner backend {backend!r} is one SGLang autotunes")
    if fp8_gemm_needs:
        reasons.append(f"{model_quant} checkpoint: per-tensor FP8 linear layers run flashinfer.bmm_fp8")
    if fp4_gemm_needs:
        reasons.append(f"{model_quant} checkpoint: NVFP4 linear layers run flashinfer.mm_fp4")
    autotunes = moe_needs or fp8_gemm_needs or fp4_gemm_needs
    if flags.autotune_disabled_by and autotunes:
        autotunes = False
        reasons.append(f"should_run_flashinfer_autotune() is False: the server runs with {flags.autotune_disabled_by}; "
                       "nothing to cache")
    elif not autotunes:
        why = [f"moe_runner_backend resolves to {backend!r}"]
        if spec.moe is None:
            why = ["the model has no MoE layers"]
        elif not sm100 and flags.moe_runner_backend == "auto":
            why.append("(the flashinfer_trtllm / flashinfer_mxfp4 defaults apply to sm100 only)")
        if model_quant == "fp8" and spec.quant and spec.quant.is_block_fp8:
            why.append(
                "and its 128x128 block-FP8 linear layers do not go through FlashInfer's tunable GEMMs "
                "(DeepGEMM / triton on Hopper)"
            )
        elif model_quant is None:
            why.append(f"and the {dtype} linear layers are not FlashInfer GEMMs")
        reasons.append(
            "should_run_flashinfer_autotune() is False: " + " ".join(why)
            + "; the server would not autotune, so there is nothing to cache"
        )

    attn_dp = topo.attn_dp_size
    attn_tp = flags.tp // attn_dp
    moe_ep = flags.ep
    moe_tp = flags.tp // flags.ep
    experts_per_rank = inter_pp = None
    if spec.moe is not None:
        if spec.moe.num_experts % moe_ep:
            raise UsageError(f"--ep {moe_ep} does not divide the model's {spec.moe.num_experts} experts")
        if spec.moe.intermediate_size % moe_tp:
            raise UsageError(
                f"MoE TP size {moe_tp} (tp/ep) does not divide the expert width {spec.moe.intermediate_size}"
            )
        experts_per_rank = spec.moe.num_experts // moe_ep
        inter_pp = spec.moe.intermediate_size // moe_tp
    if spec.num_attention_heads % attn_tp:
        raise UsageError(f"attention TP size {attn_tp} (tp/dp) does not divide {spec.num_attention_heads} heads")

    default_bs, default_chunk = _memory_defaults(arch, flags.tp)
    if flags.cuda_graph_max_bs is not None:
        decode_bs = flags.cuda_graph_max_bs
    else:
        decode_bs = default_bs
        if flags.max_running_requests is not None:
            decode_bs = min(decode_bs, flags.max_running_requests)
    if flags.max_running_requests is not None:
        # get_batch_sizes_to_capture clamps to the per-rank request pool
        decode_bs = min(decode_bs, max(1, flags.max_running_requests // attn_dp))
    chunk = flags.chunked_prefill_size or default_chunk

    key_fields = KeyFields(
        model_path=model_path,
        dtype=render_dtype(dtype),
        quantization=quantization,
        moe_runner_backend=backend,
        tp=flags.tp,
        pp=flags.pp,
        attn_dp_size=attn_dp,
        ep=flags.ep,
        config_class=spec.config_class,
        skip_ops=tuple(sorted(set(flags.skip_ops))),
    )
    return Resolution(
        arch=arch, flags=flags, topology=topo, key_fields=key_fields, dtype=dtype,
        quantization=quantization, model_quantization=model_quant, moe_runner_backend=backend,
        attn_dp_size=attn_dp, attn_tp_size=attn_tp, moe_tp_size=moe_tp, moe_ep_size=moe_ep,
        experts_per_rank=experts_per_rank, moe_intermediate_per_partition=inter_pp,
        autotunes=autotunes, reasons=tuple(reasons), decode_batch=decode_bs, chunked_prefill_size=chunk,
        notes=tuple(notes),
    )
