"""What SGLang 0.5.23 would resolve from a model spec, a target arch and the user's server flags.

Each rule cites the SGLang function it mirrors. Only the decisions that change the cache key,
whether FlashInfer autotune runs, or the shapes and token counts of the tuned ops live here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from autotune_cache.errors import UsageError
from autotune_cache.plan.keys import KeyFields, render_dtype
from autotune_cache.engines.sglang.attention import Attention, resolve_attention
from autotune_cache.engines.sglang.quant import check_backend_quantization, layer_quantization, moe_backend_for, refuse_unmodelled
from autotune_cache.engines.sglang.speculative import DEFAULT_MAX_RUNNING, Speculative, resolve_speculative
from autotune_cache.plan.spec import ModelSpec
from autotune_cache.plan.topology import Topology, TopologyError

# sglang/srt/model_executor/runner/flashinfer_autotune.py: should_run_flashinfer_autotune
MOE_BACKENDS_THAT_AUTOTUNE = (
    "flashinfer_trtllm",
    "flashinfer_trtllm_routed",
    "flashinfer_mxfp4",
    "flashinfer_cutedsl",
    "flashinfer_cutlass",
    "flashinfer_megamoe",
)
#: Every --moe-runner-backend SGLang 0.5.23 takes (arg_groups/choices.py); the ones outside the
#: gate's list never make SGLang autotune.
MOE_BACKENDS = MOE_BACKENDS_THAT_AUTOTUNE + (
    "auto", "triton", "triton_kernel", "deep_gemm", "marlin", "cutlass", "experimental_sgl_trtllm", "aiter",
    "humming", "experimental_sgl_marlin", "lora_cutedsl", "lora_triton", "lora_marlin", "hpc_ops", "megamoe",
    "intel_xpu")

#: MoE runners whose FlashInfer kernels exist for sm100/sm103 only (trtllm-gen, CuteDSL, MegaMoE).
BLACKWELL_ONLY_MOE = {"flashinfer_trtllm": "trtllm-gen", "flashinfer_trtllm_routed": "trtllm-gen",
                      "flashinfer_cutedsl": "CuteDSL", "flashinfer_megamoe": "MegaMoE"}

# arg_groups/overrides.py: _DEEPSEEK_FAMILY_ARCHS (the ones we model)
DEEPSEEK_FAMILY = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")
# arg_groups/model_overrides/qwen3_moe.py: _qwen3_moe_family_overrides
QWEN3_MOE_FAMILY = ("Qwen3MoeForCausalLM",)

SUPPORTED_ARCHS = ("sm90", "sm100", "sm103")
#: overrides.py _A2A_EP_SPANNING_BACKENDS: --moe-a2a-backend values that set ep_size = tp_size.
A2A_EP_SPANNING = frozenset({"megamoe", "deepep", "deepep_v2", "mooncake", "nixl", "ascend_fuseep", "flashinfer",
                             "flashinfer_megamoe", "mori", "pplx"})


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
    trust_remote_code: bool = False
    kv_cache_dtype: str = "auto"
    page_size: int | None = None
    context_length: int | None = None
    attention_backend: str | None = None
    decode_attention_backend: str | None = None
    prefill_attention_backend: str | None = None
    dsa_decode_backend: str | None = None
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_moe_runner_backend: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_attention_mode: str | None = None
    fp4_gemm_backend: str = "auto"
    disaggregation_mode: str = "null"
    decode_cuda_graph: bool = True  # False: --disable-cuda-graph / --cuda-graph-backend-decode disabled
    moe_fused_finalize: bool = False  # SGLANG_FLASHINFER_MOE_FUSED_FINALIZE=1 (cutlass MoE's key has it)
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
class DummyPass:
    """One autotune forward SGLang runs at startup: ``batch`` requests (a range where SGLang sizes
    the request pool from the KV-cache memory it profiles) of ``tokens_per_req`` tokens each."""

    phase: str  # decode | target_verify | draft_decode | draft_extend | extend
    runner: str
    batch: tuple[int, int]  # (smallest, largest) possible batch per DP rank
    tokens_per_req: int

    def tokens(self, gather: int = 1) -> tuple[int, int]:
        return self.batch[0] * self.tokens_per_req * gather, self.batch[1] * self.tokens_per_req * gather

    def to_dict(self) -> dict:
        return {"phase": self.phase, "runner": self.runner, "batch": list(self.batch),
                "tokens_per_req": self.tokens_per_req}


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
    decode_batch: int  # per-rank decode CUDA-graph max batch (serving; careful mode's graph sizes)
    chunked_prefill_size: int  # per attention-DP rank (SGLang divides it by attn_dp_size)
    notes: tuple[str, ...] = field(default=())
    attention: Attention | None = None
    speculative: Speculative | None = None
    #: "target", or "draft": the speculative draft worker, tuned into its own entry.
    worker: str = "target"
    #: Requests per DP rank the pool holds: SGLang sizes it from the KV-cache memory it profiles
    #: (kv_cache_configurator.py resolve_max_num_reqs: 2048..4096), unless --max-running-requests.
    request_pool: tuple[int, int] = (2048, 4096)
    passes: tuple[DummyPass, ...] = ()
    #: The FlashInfer backend of the NVFP4 linear layers' mm_fp4 (fp4_utils.py), or None.
    fp4_gemm_backend: str | None = None
    #: The MoE input is all-gathered over the attention-DP ranks (utils.require_mlp_tp_gather).
    mlp_gather: bool = False
    #: Decode runs in CUDA graphs (not with --disable-cuda-graph, nor on the torch-native / Flex
    #: attention backends, which turn them off).
    decode_cuda_graph: bool = True
    #: Shared experts SGLang fuses into the routed-expert kernel (extra experts and top-k slots).
    fused_shared_experts: int = 0

    @property
    def moe_tokens(self) -> int:
        """Tokens a MoE layer sees in the largest dummy pass (gathered over attention-DP ranks)."""
        return max((p.tokens(self.gather)[1] for p in self.passes), default=0)

    @property
    def gather(self) -> int:
        return self.attn_dp_size if self.mlp_gather else 1

    @property
    def is_draft(self) -> bool:
        return self.worker == "draft"

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items()
             if k not in ("flags", "topology", "key_fields", "attention", "speculative", "passes")}
        d["flags"] = self.flags.to_dict()
        d["topology"] = self.topology.to_dict()
        d["key_fields"] = self.key_fields.to_dict()
        d["moe_tokens"] = self.moe_tokens
        d["attention"] = self.attention.to_dict() if self.attention else None
        d["speculative"] = self.speculative.to_dict() if self.speculative else None
        d["passes"] = [p.to_dict() for p in self.passes]
        d["request_pool"] = list(self.request_pool)
        return d


def _memory_defaults(arch: str, tp: int) -> tuple[int, int]:
    """(decode CUDA-graph max bs, chunked prefill size) for the GPU class of ``arch``.

    arg_groups/memory_hook.py handle_gpu_memory_settings: H100 (80 GB) and H200 (141 GB) give
    max_bs 256 below tp 4 else 512 with an 8k chunk; B200/B300 (>= 160 GB) give 512 and 16k.
    """
    if arch == "sm90":
        return (256 if tp < 4 else 512), 8192
    return 512, 16384


#: fp4_utils.py initialize_fp4_gemm_config: --fp4-gemm-backend -> mm_fp4's backend string.
FP4_GEMM_BACKENDS = {"flashinfer_cutedsl": "cute-dsl", "flashinfer_cutlass": "cutlass", "flashinfer_cudnn": "cudnn",
                     "flashinfer_trtllm": "trtllm"}
#: should_run_flashinfer_autotune counts NVFP4 GEMMs only for these two.
FP4_BACKENDS_THAT_AUTOTUNE = ("cute-dsl", "cutlass")


def _fp4_backend(flag: str, sm100: bool) -> str | None:
    if flag == "auto":
        return "cute-dsl" if sm100 else None  # Hopper: marlin, no FlashInfer GEMM
    if flag not in FP4_GEMM_BACKENDS:
        raise UsageError(f"--fp4-gemm-backend {flag!r}: fi-autotune models auto and {', '.join(FP4_GEMM_BACKENDS)}")
    return FP4_GEMM_BACKENDS[flag]


#: Attention backends SGLang serves without decode CUDA graphs (attention_hook.py).
GRAPHLESS_ATTENTION = ("torch_native", "flex_attention")
#: --moe-a2a-backend values fi-autotune models; the others SGLang sizes from environment
#: capacities (MoRI, pplx, DeepEP v2) or runs through kernels of their own.
A2A_MODELLED = ("none", "deepep", "flashinfer")
#: overrides.py: the MoE runners the FlashInfer all-to-all takes.
FLASHINFER_A2A_RUNNERS = ("flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm", "flashinfer_trtllm_routed",
                          "deep_gemm")
#: DETERMINISTIC_ATTENTION_BACKEND_CHOICES (CUDA ones).
DETERMINISTIC_ATTENTION = ("fa3", "fa4", "flashinfer", "triton")
#: speculative_hook.py: the backends that take --speculative-eagle-topk > 1 with pages > 1.
TOPK_PAGED_ATTENTION = ("flashinfer", "fa3", "triton")


#: The model classes whose shared expert SGLang fuses into the routed experts, by the
#: architecture their gate compares (``fused_shared_experts_architecture``): deepseek_v2.py,
#: glm4_moe.py, deepseek_nextn.py. DeepseekV32ForCausalLM keeps DeepSeek-V3's name and so never fuses.
FUSING_ARCHS = ("DeepseekV3ForCausalLM", "DeepseekV3ForCausalLMNextN", "GlmMoeDsaForCausalLM",
                "GlmMoeDsaForCausalLMNextN")
#: overrides.py _moe_runner_fusion_disable / _a2a_fusion_adjustments: runners that turn it off.
NO_FUSION_RUNNERS = ("flashinfer_cutedsl", "flashinfer_trtllm", "experimental_sgl_trtllm", "flashinfer_trtllm_routed",
                     "lora_triton", "lora_cutedsl", "lora_marlin")


def _fused_shared_experts(spec: ModelSpec, backend: str, flags: ServerFlags, ep: int, model_quant: str | None) -> int:
    """moe/utils.py resolve_shared_experts_config with DeepseekV2ForCausalLM's
    shared_experts_fusion_disable_reason, on a CUDA GPU of sm80+ (every target here)."""
    moe = spec.moe
    if moe is None or spec.architecture not in FUSING_ARCHS or backend in NO_FUSION_RUNNERS:
        return 0
    if flags.moe_a2a_backend != "none" or ep > 1:
        return 0  # DeepEP-class and FlashInfer all-to-all; expert parallelism (CUDA)
    if moe.num_experts != 256 or moe.num_shared_experts != 1:
        return 0  # the validated configs (384 only for Quark MXFP4 checkpoints)
    if model_quant in ("modelopt_fp4", "modelopt_mixed") and spec.quant and any(
            "shared_expert" in m and "shared_expert_gate" not in m for m in spec.quant.modules_not_quantized):
        return 0  # ModelOptFp4Config.can_fuse_shared_expert: a bf16 shared expert cannot join FP4 experts
    return moe.num_shared_experts


def _check_startup(spec: ModelSpec, flags: ServerFlags, attention: Attention, speculative, sm100: bool) -> None:
    """SGLang 0.5.23's startup refusals that involve flags fi-autotune models (the flag probes in
    tests/data/sglang-0.5.23/probes.json hold SGLang's own message for each)."""
    a2a = flags.moe_a2a_backend
    if a2a not in A2A_MODELLED:
        raise UsageError(f"--moe-a2a-backend {a2a}: not modelled by fi-autotune (SGLang sizes its dispatch from "
                         "its own capacities and kernels); use none, deepep or flashinfer")
    if a2a == "flashinfer":
        if not flags.dp_attention or flags.dp != flags.tp:
            raise UsageError("--moe-a2a-backend flashinfer: SGLang 0.5.23 requires --attn-dp-size equal to --tp-size")
    if flags.speculative_algorithm and flags.attention_backend == "flex_attention":
        raise UsageError("--attention-backend flex_attention: SGLang 0.5.23 runs no speculative decoding with it")
    if speculative is not None and speculative.eagle_topk > 1 and attention.page_size > 1 \
            and attention.decode_backend not in TOPK_PAGED_ATTENTION:
        raise UsageError(f"--speculative-eagle-topk {speculative.eagle_topk}: with page size {attention.page_size} "
                         f"SGLang 0.5.23 takes it only on the {', '.join(TOPK_PAGED_ATTENTION)} attention backends, "
                         f"not {attention.decode_backend}")
    if flags.autotune_disabled_by and "deterministic" in flags.autotune_disabled_by:
        chosen = flags.attention_backend or (attention.decode_backend if spec.mla is not None else None)
        if chosen is None and spec.architecture == "GptOssForCausalLM" and sm100:
            chosen = "trtllm_mha"  # model_override: gpt-oss on Blackwell
        if chosen is not None and chosen not in DETERMINISTIC_ATTENTION:
            raise UsageError(f"--enable-deterministic-inference: SGLang 0.5.23 takes the "
                             f"{', '.join(DETERMINISTIC_ATTENTION)} attention backends only, and this "
                             f"command resolves {chosen}")


def resolve(spec: ModelSpec, arch: str, flags: ServerFlags, model_path: str, *, worker: str = "target",
            draft_spec: ModelSpec | None = None) -> Resolution:
    """SGLang's resolution for the target worker, or (``worker="draft"``, ``draft_spec`` = the
    draft model's spec) for the speculative draft worker of the same command."""
    if arch not in SUPPORTED_ARCHS:
        raise UsageError(f"--arch {arch}: supported targets are {', '.join(SUPPORTED_ARCHS)}")
    megamoe = flags.moe_runner_backend == "flashinfer_megamoe"
    try:
        topo = Topology(tp=flags.tp, pp=flags.pp, dp=flags.dp, dp_attention=flags.dp_attention,
                        gpu_uuids=flags.gpu_uuids if megamoe and worker == "target" else ())
    except TopologyError as e:
        raise UsageError(str(e)) from None
    if flags.ep < 1 or flags.tp % flags.ep:
        raise UsageError(f"--ep {flags.ep} must divide --tp {flags.tp}")
    # overrides.py _a2a_ep_size: an all-to-all MoE backend spans every TP rank with experts.
    ep = flags.tp if flags.moe_a2a_backend in A2A_EP_SPANNING else flags.ep
    for name in ("moe_runner_backend", "speculative_moe_runner_backend"):
        value = getattr(flags, name)
        if value is not None and value not in MOE_BACKENDS:
            raise UsageError(f"unknown --{name.replace('_', '-')} {value!r}; known: {', '.join(MOE_BACKENDS)}")
    if flags.pp > spec.num_layers:
        raise UsageError(f"--pp {flags.pp} exceeds the model's {spec.num_layers} layers")
    if flags.chunked_prefill_size == -1:
        raise UsageError("--chunked-prefill-size -1 (chunked prefill off): not modelled; SGLang 0.5.23 then sizes "
                         "its prefill passes by --max-prefill-tokens instead")
    for name in ("max_running_requests", "cuda_graph_max_bs", "chunked_prefill_size", "page_size", "context_length"):
        value = getattr(flags, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if flags.disaggregation_mode not in ("null", "decode"):
        raise UsageError(f"--disaggregation-mode {flags.disaggregation_mode}: fi-autotune models decode workers "
                         "(and plain servers); a prefill worker tunes in EXTEND shapes it does not model")

    sm100 = arch_major(arch) == 10
    for name in ("moe_runner_backend", "speculative_moe_runner_backend"):
        value = getattr(flags, name)
        if value in BLACKWELL_ONLY_MOE and not sm100 and spec.moe is not None:
            raise UsageError(f"--{name.replace('_', '-')} {value}: FlashInfer's {BLACKWELL_ONLY_MOE[value]} MoE kernels "
                             f"are built for Blackwell (sm100/sm103); fi-autotune does not model this backend on "
                             f"{arch} (SGLang 0.5.23 takes the flag there)")
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

    target = spec
    speculative = resolve_speculative(
        spec.architecture, model_path, algorithm=flags.speculative_algorithm,
        num_steps=flags.speculative_num_steps, eagle_topk=flags.speculative_eagle_topk,
        num_draft_tokens=flags.speculative_num_draft_tokens, draft_model_path=flags.speculative_draft_model_path,
        draft_moe_runner_backend=flags.speculative_moe_runner_backend)
    if worker == "draft":
        if speculative is None or draft_spec is None:
            raise ValueError("a draft worker's resolution needs --speculative-algorithm and the draft's spec")
        spec = draft_spec

    # dtype: ModelRunner.dtype from --dtype (auto: the config's), forced bfloat16 for gpt-oss mxfp4
    # (model_overrides/gpt_oss.py).
    dtype = target.dtype if flags.dtype == "auto" else render_dtype(flags.dtype)[len("torch."):]
    if target.architecture == "GptOssForCausalLM" and target.quant and target.quant.method == "mxfp4":
        dtype = "bfloat16"

    ckpt_quant = target.quant.method if target.quant else None
    quantization = flags.quantization  # the server arg: this is what the key hashes
    backend = flags.moe_runner_backend
    if sm100 and target.architecture in DEEPSEEK_FAMILY:
        # overrides.py _deepseek_moe_quant_resolution
        if quantization is None:
            if ckpt_quant is None and target.architecture == "DeepseekV3ForCausalLM":
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
    elif sm100 and target.architecture in QWEN3_MOE_FAMILY:
        if quantization is None and ckpt_quant is not None:
            quantization = ckpt_quant
        if flags.moe_a2a_backend == "none" and backend == "auto" and (
            quantization in ("fp8", "modelopt_fp4", "modelopt_mixed") or quantization is None
        ):
            backend = "flashinfer_trtllm"
    elif target.architecture == "GptOssForCausalLM" and backend == "auto":
        # model_overrides/gpt_oss.py _gpt_oss_overrides
        if sm100 and ckpt_quant == "mxfp4":
            backend = "flashinfer_mxfp4"
        elif flags.ep == 1 and quantization is None:
            backend = "triton_kernel"
            notes.append("gpt-oss defaults to the triton_kernel MoE backend here (assuming triton_kernels is installed)")

    backend = moe_backend_for(quantization, backend, sm100=sm100)
    refuse_unmodelled(quantization)
    check_backend_quantization(backend, quantization,
                               from_checkpoint=flags.quantization is None and quantization is not None)
    if flags.moe_a2a_backend == "flashinfer" and backend not in FLASHINFER_A2A_RUNNERS:
        raise UsageError(f"--moe-a2a-backend flashinfer with --moe-runner-backend {backend}: SGLang 0.5.23 takes "
                         f"{', '.join(FLASHINFER_A2A_RUNNERS)}")
    # ModelConfig._verify_quantization: the checkpoint's method unless the flag overrides it.
    model_quant = layer_quantization(quantization, ckpt_quant)
    key_backend = backend  # the key hashes the target's backend, also in the draft's key
    draft_quant = None
    if worker == "draft":
        # ModelConfig.from_server_args(is_draft_model=True): --speculative-draft-model-quantization,
        # which defaults to the target's --quantization as given (serving_hook.py), against the
        # draft checkpoint's own method; an MTP layer excluded from the checkpoint's quantization
        # keeps the method in its config but runs unquantized layers.
        draft_ckpt = spec.config_quantization or (spec.quant.method if spec.quant else None)
        draft_quant = layer_quantization(flags.quantization, draft_ckpt)
        model_quant = None if spec.config_quantization else draft_quant
        backend = flags.speculative_moe_runner_backend or backend
    fp4_backend = _fp4_backend(flags.fp4_gemm_backend, sm100) if model_quant in ("modelopt_fp4", "modelopt_mixed") \
        else None

    # should_run_flashinfer_autotune
    moe_needs = backend in MOE_BACKENDS_THAT_AUTOTUNE
    if model_quant in ("modelopt", "modelopt_fp8", "modelopt_mixed"):
        fp8_gemm_needs = True  # flashinfer_per_tensor_fp8_supported(): sm90 / sm100 / sm120
    else:
        fp8_gemm_needs = False  # block FP8 as MXFP8 on FlashInfer is not modelled (Blackwell MXFP8 only)
    fp4_gemm_needs = fp4_backend in FP4_BACKENDS_THAT_AUTOTUNE
    if moe_needs:
        reasons.append(f"MoE runner backend {backend!r} is one SGLang autotunes")
    if fp8_gemm_needs:
        reasons.append(f"{model_quant} checkpoint: per-tensor FP8 linear layers run flashinfer.bmm_fp8")
    if fp4_gemm_needs:
        reasons.append(f"{model_quant} checkpoint: NVFP4 linear layers run flashinfer.mm_fp4 ({fp4_backend})")
    autotunes = moe_needs or fp8_gemm_needs or fp4_gemm_needs
    if flags.autotune_disabled_by and autotunes:
        autotunes = False
        reasons.append(f"should_run_flashinfer_autotune() is False: the server runs with {flags.autotune_disabled_by}; "
                       "nothing to cache")
    elif not autotunes:
        why = [f"moe_runner_backend resolves to {backend!r}"]
        if spec.moe is None and not fp4_backend:
            why = [f"the {'draft' if worker == 'draft' else 'model'} has no MoE layers"
                   + ("" if backend in MOE_BACKENDS_THAT_AUTOTUNE else f" and its MoE backend is {backend!r}")]
        elif not sm100 and flags.moe_runner_backend == "auto":
            why.append("(the flashinfer_trtllm / flashinfer_mxfp4 defaults apply to sm100 only)")
        if fp4_backend and not fp4_gemm_needs:
            why.append(f"and its NVFP4 linear layers run mm_fp4 on {fp4_backend}, which SGLang does not count")
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
    if autotunes and backend == "flashinfer_cutlass" and not sm100 and spec.quant and spec.quant.is_block_fp8 \
            and model_quant == "fp8":
        notes.append("flashinfer_cutlass with 128x128 block-FP8 experts on sm90: FlashInfer's CUTLASS MoE profiler "
                     "has no tactics for them, so the pass tunes nothing")
    # A MoE backend that autotunes with a model without MoE layers (an EAGLE3 draft) still makes
    # SGLang enter the autotune context: the file it writes holds no tactics.
    if autotunes and moe_needs and spec.moe is None and not (fp8_gemm_needs or fp4_gemm_needs):
        notes.append(f"SGLang enters its autotune pass ({backend!r}) but the {'draft ' if worker == 'draft' else ''}"
                     "model has no MoE layer: nothing is tuned")

    fused_shared = _fused_shared_experts(spec, backend, flags, ep, model_quant)
    if fused_shared:
        notes.append(f"{spec.architecture}: SGLang fuses the shared expert into the routed experts "
                     f"({spec.moe.num_experts}+{fused_shared} experts, top-{spec.moe.top_k}+{fused_shared})")
    attn_dp = topo.attn_dp_size
    attn_tp = flags.tp // attn_dp
    moe_ep = ep
    moe_tp = flags.tp // ep
    experts_per_rank = inter_pp = None
    if spec.moe is not None:
        if spec.moe.num_experts % moe_ep:
            raise UsageError(f"--ep {moe_ep} does not divide the model's {spec.moe.num_experts} experts")
        if spec.moe.intermediate_size % moe_tp:
            raise UsageError(
                f"MoE TP size {moe_tp} (tp/ep) does not divide the expert width {spec.moe.intermediate_size}"
            )
        experts_per_rank = spec.moe.num_experts // moe_ep + fused_shared
        inter_pp = spec.moe.intermediate_size // moe_tp
    if spec.num_attention_heads % attn_tp:
        raise UsageError(f"attention TP size {attn_tp} (tp/dp) does not divide {spec.num_attention_heads} heads")

    attention = resolve_attention(
        spec, arch_major(arch), attention_backend=flags.attention_backend,
        decode_attention_backend=flags.decode_attention_backend,
        prefill_attention_backend=flags.prefill_attention_backend, kv_cache_dtype=flags.kv_cache_dtype,
        page_size=flags.page_size, context_length=flags.context_length or target.max_position_embeddings,
        dsa_decode_backend=flags.dsa_decode_backend, speculative_attention_mode=flags.speculative_attention_mode)
    notes.extend(attention.notes)
    _check_startup(spec, flags, attention, speculative, sm100)
    # attention_hook.py: the torch-native and Flex attention backends turn decode CUDA graphs off.
    decode_cuda_graph = flags.decode_cuda_graph and flags.attention_backend not in GRAPHLESS_ATTENTION

    # Sizes (memory_hook.py, speculative_hook.py, parallel_hook.py handle_data_parallelism).
    default_bs, default_chunk = _memory_defaults(arch, flags.tp)
    max_running = flags.max_running_requests
    if max_running is None and speculative is not None:
        max_running = DEFAULT_MAX_RUNNING  # _handle_eagle_family
    if flags.cuda_graph_max_bs is not None:
        decode_bs = flags.cuda_graph_max_bs
    else:
        decode_bs = default_bs if max_running is None else min(default_bs, max_running)
    chunk = max(1, (flags.chunked_prefill_size or default_chunk) // attn_dp)
    # kv_cache_configurator.py resolve_max_num_reqs, per attention-DP rank.
    pool = (max(1, max_running // attn_dp),) * 2 if max_running is not None else (2048, 4096)
    mlp_gather = attn_dp > 1  # require_mlp_tp_gather with attention DP (moe_dense_tp_size unset)

    def eager(n: int) -> int:
        # get_eager_max_batch_size: padded to the attention TP width when the MLP syncs over DP
        return -(-n // attn_tp) * attn_tp if attn_dp > 1 else n

    passes: list[DummyPass] = []
    if worker == "target":
        # cuda_graph_setup.capture_cuda_graphs builds the EagerRunner first; its warmup runs the
        # autotune dummy pass (base_runner._warmup), once, at the request pool's batch.
        width = speculative.num_draft_tokens if speculative is not None else 1
        passes.append(DummyPass("target_verify" if speculative else "decode", "EagerRunner",
                                (eager(pool[0]), eager(pool[1])), width))
    elif decode_cuda_graph:
        # Draft CUDA-graph runners tune at the first (largest) batch they capture:
        # get_batch_sizes_to_capture clamps the graph sizes to the request pool.
        batch = (min(decode_bs, pool[0]), min(decode_bs, pool[1]))
        passes.append(DummyPass("draft_decode", "EAGLEDraftCudaGraphRunner", batch, speculative.eagle_topk))
        passes.append(DummyPass("draft_extend", "EAGLEDraftExtendCudaGraphRunner", batch,
                                speculative.num_draft_tokens))
    else:
        notes.append("decode CUDA graphs are off: the draft worker's autotune runs in its graph runners, "
                     "so it tunes nothing")
    if worker == "target" and flags.autotune_extend and not speculative:
        passes.append(DummyPass("extend", "EagerRunner", (1, 1), chunk))  # max_prefill_buffer_tokens()
    if flags.disaggregation_mode == "decode":
        notes.append("PD decode worker: its requests arrive prefilled, so no MoE call sees a prefill chunk")

    key_fields = KeyFields(
        model_path=model_path,
        dtype=render_dtype(dtype),
        quantization=quantization,
        moe_runner_backend=key_backend,
        tp=flags.tp,
        pp=flags.pp,
        attn_dp_size=attn_dp,
        ep=ep,
        # flashinfer_autotune_cache_path hashes the running model's hf_config class: the draft
        # runner's own for a draft worker (its config; the same as the target's for an MTP draft).
        config_class=spec.config_class if not flags.trust_remote_code else spec.remote_config_class,
        skip_ops=tuple(sorted(set(flags.skip_ops))),
        draft_quantization=draft_quant,
        is_draft=worker == "draft",
    )
    return Resolution(
        fused_shared_experts=fused_shared,
        arch=arch, flags=flags, topology=topo, key_fields=key_fields, dtype=dtype,
        quantization=quantization, model_quantization=model_quant, moe_runner_backend=backend,
        attn_dp_size=attn_dp, attn_tp_size=attn_tp, moe_tp_size=moe_tp, moe_ep_size=moe_ep,
        experts_per_rank=experts_per_rank, moe_intermediate_per_partition=inter_pp,
        autotunes=autotunes, reasons=tuple(reasons), decode_batch=decode_bs, chunked_prefill_size=chunk,
        notes=tuple(notes), attention=attention, speculative=speculative, worker=worker, request_pool=pool,
        passes=tuple(passes), fp4_gemm_backend=fp4_backend, mlp_gather=mlp_gather,
        decode_cuda_graph=decode_cuda_graph,
    )
