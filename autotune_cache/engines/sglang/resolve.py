"""What SGLang 0.5.23 would resolve from a model spec, a target arch and the user's server flags.

Each rule cites the SGLang function it mirrors. Only the decisions that change the cache key,
whether FlashInfer autotune runs, or the shapes and token counts of the tuned ops live here.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune_cache.errors import UsageError
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.entry_key import KeyFields, render_dtype
from autotune_cache.plan.resolution import Resolution, arch_major
from autotune_cache.engines.sglang.attention import resolve_attention
from autotune_cache.engines.sglang.dispatch import moe_dispatch, not_recorded
from autotune_cache.engines.sglang.gate import autotune_gate, fp4_backend
from autotune_cache.engines.sglang.sizes import dummy_passes, fused_shared_experts, split
from autotune_cache.engines.sglang.startup import (check_blackwell_only, DEEPSEEK_FAMILY, FLASHINFER_A2A_RUNNERS, GRAPHLESS_ATTENTION,
                                                   QWEN3_MOE_FAMILY, check_flags, check_startup)
from autotune_cache.engines.sglang.quant import check_backend_quantization, layer_quantization, moe_backend_for, refuse_unmodelled
from autotune_cache.engines.sglang.speculative import resolve_speculative
from autotune_cache.plan.spec import ModelSpec


@dataclass(frozen=True)
class _Quant:
    dtype: str  # torch name, e.g. bfloat16
    quantization: str | None  # the server argument the key hashes
    key_backend: str  # the target's MoE backend: the key hashes it, in the draft's key too
    backend: str  # the running worker's MoE backend
    model_quant: str | None  # what the running model's layers run
    draft_quant: str | None
    fp4: str | None  # mm_fp4's backend for NVFP4 linear layers, or None


def resolve(spec: ModelSpec, arch: str, flags: ServerFlags, model_path: str, *, worker: str = "target",
            draft_spec: ModelSpec | None = None) -> Resolution:
    """SGLang's resolution for the target worker, or (``worker="draft"``, ``draft_spec`` = the
    draft model's spec) for the speculative draft worker of the same command."""
    topo, ep = check_flags(spec, arch, flags, worker)
    sm100 = arch_major(arch) == 10
    notes = _megamoe_notes(flags)
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
    q = _quantization(target, spec, flags, sm100, worker, notes)
    gate = autotune_gate(spec, flags, backend=q.backend, model_quant=q.model_quant, fp4=q.fp4, dtype=q.dtype,
                         sm100=sm100, worker=worker)
    notes.extend(gate.notes)
    flag = "--speculative-moe-runner-backend" if worker == "draft" and flags.speculative_moe_runner_backend \
        else "--moe-runner-backend"
    dispatch = moe_dispatch(spec, arch, q.backend, q.model_quant, worker=worker, flag=flag, a2a=flags.moe_a2a_backend)
    if gate.autotunes and dispatch is not None and not dispatch.error and not dispatch.runs_flashinfer:
        notes.append(dispatch.why())
    fused_shared = fused_shared_experts(spec, q.backend, flags, ep, q.model_quant)
    if fused_shared:
        notes.append(f"{spec.architecture}: SGLang fuses the shared expert into the routed experts "
                     f"({spec.moe.num_experts}+{fused_shared} experts, top-{spec.moe.top_k}+{fused_shared})")
    s = split(spec, flags, topo, ep, fused_shared)
    attention = resolve_attention(
        spec, arch_major(arch), attention_backend=flags.attention_backend,
        decode_attention_backend=flags.decode_attention_backend,
        prefill_attention_backend=flags.prefill_attention_backend, kv_cache_dtype=flags.kv_cache_dtype,
        page_size=flags.page_size, context_length=flags.context_length or target.max_position_embeddings,
        dsa_decode_backend=flags.dsa_decode_backend, speculative_attention_mode=flags.speculative_attention_mode)
    notes.extend(attention.notes)
    check_startup(spec, flags, attention, speculative, sm100)
    check_blackwell_only(spec, arch, flags, dispatch, worker)
    if dispatch is not None and dispatch.error:
        raise UsageError(dispatch.refusal(arch))
    # (flashinfer_megamoe's experts are tuned by its own pass, which the plan already says it does not
    # model (_megamoe_notes): no recipe is guessed for them, and the rest of the plan stands)
    if dispatch is None and gate.autotunes and spec.moe is not None and q.backend != "flashinfer_megamoe":
        raise UsageError(not_recorded(spec, arch, q.backend, q.model_quant, flag, flags.moe_a2a_backend))
    # attention_hook.py: the torch-native and Flex attention backends turn decode CUDA graphs off.
    decode_cuda_graph = flags.decode_cuda_graph and flags.attention_backend not in GRAPHLESS_ATTENTION
    p = dummy_passes(arch, flags, s, speculative, worker=worker, decode_cuda_graph=decode_cuda_graph)
    notes.extend(p.notes)
    key_fields = KeyFields(
        model_path=model_path, dtype=render_dtype(q.dtype), quantization=q.quantization,
        moe_runner_backend=q.key_backend, tp=flags.tp, pp=flags.pp, attn_dp_size=s.attn_dp, ep=ep,
        # flashinfer_autotune_cache_path hashes the running model's hf_config class: the draft
        # runner's own for a draft worker (its config; the same as the target's for an MTP draft).
        config_class=spec.config_class if not flags.trust_remote_code else spec.remote_config_class,
        skip_ops=tuple(sorted(set(flags.skip_ops))), draft_quantization=q.draft_quant, is_draft=worker == "draft",
    )
    return Resolution(
        fused_shared_experts=fused_shared, arch=arch, flags=flags, topology=topo, key_fields=key_fields,
        dtype=q.dtype, quantization=q.quantization, model_quantization=q.model_quant, moe_runner_backend=q.backend,
        attn_dp_size=s.attn_dp, attn_tp_size=s.attn_tp, moe_tp_size=s.moe_tp, moe_ep_size=s.moe_ep,
        experts_per_rank=s.experts_per_rank, moe_intermediate_per_partition=s.moe_intermediate_per_partition,
        autotunes=gate.autotunes, reasons=gate.reasons, decode_batch=p.decode_batch,
        chunked_prefill_size=p.chunked_prefill_size, notes=tuple(notes), attention=attention,
        speculative=speculative, worker=worker, request_pool=p.request_pool, passes=p.passes, fp4_gemm_backend=q.fp4,
        mlp_gather=s.attn_dp > 1,  # require_mlp_tp_gather with attention DP (moe_dense_tp_size unset)
        decode_cuda_graph=decode_cuda_graph, moe_dispatch=dispatch,
    )


def _megamoe_notes(flags: ServerFlags) -> list[str]:
    if flags.moe_runner_backend == "flashinfer_megamoe":
        notes = ["flashinfer_megamoe's own autotune (FlashInfer namespaced records, SGLang "
                 "flashinfer_megamoe_autotune.py) is not modelled: SGLang still tunes it at startup"]
        if not flags.gpu_uuids:
            notes.append("flashinfer_megamoe names each rank file after its GPU (rank_tp{t}_..._gpu<UUID>.json): "
                         "pass --gpu-uuids (the serving machine's, in tp-rank order) or --gpu-uuids auto there")
        return notes
    return ["--gpu-uuids ignored: only flashinfer_megamoe names rank files by GPU"] if flags.gpu_uuids else []


def _server_defaults(target: ModelSpec, flags: ServerFlags, sm100: bool, notes: list[str]) -> tuple[str, str | None, str]:
    """(dtype, --quantization as SGLang resolves it, MoE runner backend) before the quantization
    rules: the per-model overrides of arg_groups (deepseek, qwen3-moe, gpt-oss)."""
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
        # model_overrides/qwen3_moe.py: get_quantization_config(hf_config) reads config.json's own
        # quantization_config, so a ModelOpt checkpoint that keeps it in hf_quant_config.json copies
        # nothing (the dispatch probe of such a checkpoint, modelopt_fp8, records that)
        in_config = target.quant is not None and target.quant.source == "config.json"
        if quantization is None and ckpt_quant is not None and in_config:
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
    return dtype, quantization, backend


def _quantization(target: ModelSpec, spec: ModelSpec, flags: ServerFlags, sm100: bool, worker: str,
                  notes: list[str]) -> _Quant:
    dtype, quantization, backend = _server_defaults(target, flags, sm100, notes)
    ckpt_quant = target.quant.method if target.quant else None
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
    fp4 = fp4_backend(flags.fp4_gemm_backend, sm100) if model_quant in ("modelopt_fp4", "modelopt_mixed") else None
    return _Quant(dtype, quantization, key_backend, backend, model_quant, draft_quant, fp4)
