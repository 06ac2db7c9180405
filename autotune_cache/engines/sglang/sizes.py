"""The sizes SGLang 0.5.23 serves with: MoE and attention splits, batch and chunk sizes, the
request pool, and the autotune dummy passes it runs at startup (memory_hook.py,
speculative_hook.py, parallel_hook.py, cuda_graph_setup.py)."""

from __future__ import annotations

from dataclasses import dataclass

from autotune_cache.engines.sglang.speculative import DEFAULT_MAX_RUNNING
from autotune_cache.errors import UsageError
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.resolution import DummyPass
from autotune_cache.plan.spec import ModelSpec
from autotune_cache.plan.topology import Topology

def memory_defaults(arch: str, tp: int) -> tuple[int, int]:
    """(decode CUDA-graph max bs, chunked prefill size) for the GPU class of ``arch``.

    arg_groups/memory_hook.py handle_gpu_memory_settings: H100 (80 GB) and H200 (141 GB) give
    max_bs 256 below tp 4 else 512 with an 8k chunk; B200/B300 (>= 160 GB) give 512 and 16k.
    """
    if arch == "sm90":
        return (256 if tp < 4 else 512), 8192
    return 512, 16384


#: The model classes whose shared expert SGLang fuses into the routed experts, by the
#: architecture their gate compares (``fused_shared_experts_architecture``): deepseek_v2.py,
#: glm4_moe.py, deepseek_nextn.py. DeepseekV32ForCausalLM keeps DeepSeek-V3's name and so never fuses.
FUSING_ARCHS = ("DeepseekV3ForCausalLM", "DeepseekV3ForCausalLMNextN", "GlmMoeDsaForCausalLM",
                "GlmMoeDsaForCausalLMNextN")
#: overrides.py _moe_runner_fusion_disable / _a2a_fusion_adjustments: runners that turn it off.
NO_FUSION_RUNNERS = ("flashinfer_cutedsl", "flashinfer_trtllm", "experimental_sgl_trtllm", "flashinfer_trtllm_routed",
                     "lora_triton", "lora_cutedsl", "lora_marlin")


def fused_shared_experts(spec: ModelSpec, backend: str, flags: ServerFlags, ep: int, model_quant: str | None) -> int:
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



@dataclass(frozen=True)
class Split:
    """How a rank's share of the model is cut."""

    attn_dp: int
    attn_tp: int
    moe_tp: int
    moe_ep: int
    experts_per_rank: int | None
    moe_intermediate_per_partition: int | None


def split(spec: ModelSpec, flags: ServerFlags, topo: Topology, ep: int, fused_shared: int) -> Split:
    attn_dp = topo.attn_dp_size
    attn_tp = flags.tp // attn_dp
    moe_tp = flags.tp // ep
    experts_per_rank = inter_pp = None
    if spec.moe is not None:
        if spec.moe.num_experts % ep:
            raise UsageError(f"--ep {ep} does not divide the model's {spec.moe.num_experts} experts")
        if spec.moe.intermediate_size % moe_tp:
            raise UsageError(
                f"MoE TP size {moe_tp} (tp/ep) does not divide the expert width {spec.moe.intermediate_size}"
            )
        experts_per_rank = spec.moe.num_experts // ep + fused_shared
        inter_pp = spec.moe.intermediate_size // moe_tp
    if spec.num_attention_heads % attn_tp:
        raise UsageError(f"attention TP size {attn_tp} (tp/dp) does not divide {spec.num_attention_heads} heads")
    return Split(attn_dp, attn_tp, moe_tp, ep, experts_per_rank, inter_pp)


@dataclass(frozen=True)
class Passes:
    decode_batch: int
    chunked_prefill_size: int
    request_pool: tuple[int, int]
    passes: tuple[DummyPass, ...]
    notes: tuple[str, ...]


def dummy_passes(arch: str, flags: ServerFlags, s: Split, speculative, *, worker: str,
                 decode_cuda_graph: bool) -> Passes:
    """The serving sizes, and the autotune dummy passes the worker runs at startup."""
    default_bs, default_chunk = memory_defaults(arch, flags.tp)
    max_running = flags.max_running_requests
    if max_running is None and speculative is not None:
        max_running = DEFAULT_MAX_RUNNING  # _handle_eagle_family
    if flags.cuda_graph_max_bs is not None:
        decode_bs = flags.cuda_graph_max_bs
    else:
        decode_bs = default_bs if max_running is None else min(default_bs, max_running)
    chunk = max(1, (flags.chunked_prefill_size or default_chunk) // s.attn_dp)
    # kv_cache_configurator.py resolve_max_num_reqs, per attention-DP rank.
    pool = (max(1, max_running // s.attn_dp),) * 2 if max_running is not None else (2048, 4096)

    def eager(n: int) -> int:
        # get_eager_max_batch_size: padded to the attention TP width when the MLP syncs over DP
        return -(-n // s.attn_tp) * s.attn_tp if s.attn_dp > 1 else n

    passes: list[DummyPass] = []
    notes: list[str] = []
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
    return Passes(decode_bs, chunk, pool, tuple(passes), tuple(notes))
