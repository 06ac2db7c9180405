"""SGLang 0.5.23's own refusals and limits for the flags fi-autotune models: what SGLang itself
would refuse at startup (or what fi-autotune does not model) is a usage error before any plan.

Each rule cites the SGLang check it mirrors; the flag probes in
tests/data/sglang-0.5.23/probes.json hold SGLang's own message for each.
"""

from __future__ import annotations

from autotune_cache.errors import UsageError
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.resolution import arch_major
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



def check_flags(spec: ModelSpec, arch: str, flags: ServerFlags, worker: str) -> tuple[Topology, int]:
    """(the serving topology, the MoE EP size) - or the usage error SGLang's own checks give."""
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
    if flags.moe_runner_backend == "flashinfer_cutlass" and flags.ep not in (1, flags.tp) and spec.moe is not None:
        # moe_hook.py handle_moe_kernel_config (the dispatch probe "ep4" records SGLang's refusal)
        raise UsageError(f"--ep {flags.ep} with --tp {flags.tp} and --moe-runner-backend flashinfer_cutlass: SGLang "
                         "0.5.23 refuses it at startup (The expert parallel size must be 1 or the same as the tensor "
                         "parallel size)")
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
    # overrides.py _a2a_ep_size: an all-to-all MoE backend spans every TP rank with experts.
    ep = flags.tp if flags.moe_a2a_backend in A2A_EP_SPANNING else flags.ep
    return topo, ep


def check_blackwell_only(spec: ModelSpec, arch: str, flags: ServerFlags, dispatch, worker: str) -> None:
    """A Blackwell-only FlashInfer MoE backend asked for on another GPU: refused - unless SGLang's own
    dispatch (``dispatch``, for this worker's backend flag) recorded the experts running outside
    FlashInfer there, which is then what the plan says (nothing tuned for them)."""
    if arch_major(arch) == 10 or spec.moe is None:
        return
    mine = "speculative_moe_runner_backend" if worker == "draft" and flags.speculative_moe_runner_backend \
        else "moe_runner_backend"
    for name in ("moe_runner_backend", "speculative_moe_runner_backend"):
        value = getattr(flags, name)
        outside = name == mine and dispatch is not None and not dispatch.error and not dispatch.runs_flashinfer
        if value in BLACKWELL_ONLY_MOE and not outside:
            raise UsageError(f"--{name.replace('_', '-')} {value}: FlashInfer's {BLACKWELL_ONLY_MOE[value]} MoE kernels "
                             f"are built for Blackwell (sm100/sm103); fi-autotune does not model this backend on "
                             f"{arch} (SGLang 0.5.23 takes the flag there)")


def check_startup(spec: ModelSpec, flags: ServerFlags, attention, speculative, sm100: bool) -> None:
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
