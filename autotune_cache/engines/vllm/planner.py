"""What vLLM tunes at startup, and where it keeps the result: the plan behind ``warm --layout vllm``.

Read from the vLLM 0.33.0 wheel (``VLLM_CHECKED``), and checked against vLLM's own code on CPU
by ``tests/engines/test_vllm_plan.py`` (vLLM's ``FlashInferExperts.apply`` records the call it makes):

* ``model_executor/warmup/kernel_warmup.py``: with FlashInfer usable on sm90+, every rank runs
  its dummy passes inside ``autotune(tuning_buckets=get_hybrid_num_tokens_buckets(
  max_num_batched_tokens), round_up=True)``. Each bucket is stored under its own value, as
  warm's one-bucket tunes are, so the buckets here are exactly those. When every rank finds a
  file with the same ``_metadata`` and entry count, vLLM loads them and skips tuning entirely:
  the keys must be right, because a wrong one is never re-tuned, only served by a heuristic.
* ``layers/fused_moe/experts/flashinfer_cutlass_moe.py`` (``--moe-backend flashinfer_cutlass``):
  the one FlashInfer tunable call vLLM makes on Hopper. It passes neither
  ``use_fused_finalize`` nor ``enable_pdl`` (FlashInfer's defaults: True, and PDL on sm90), so
  its key differs from SGLang's (which passes ``use_fused_finalize=False``): an SGLang tuning
  cannot be re-keyed for vLLM; it is tuned again here, in the same run.
* ``layers/fused_moe/config.py`` ``FusedMoEParallelConfig.make``: the experts are sharded over
  every rank of tp x dp (the MoE tp size is tp x dp), or, with ``--enable-expert-parallel``,
  split whole over them (ep size tp x dp, tp 1).
* The directory's hash is ``sha256(vllm_config.compute_hash())`` taken after the model is loaded
  (loading appends every MoE layer's name to the hashed config): only the engine can compute it,
  so it is given (``--vllm-config-hash``, as the engine's startup line prints it).

Dense FP8 models tune nothing in vLLM on Hopper (per-tensor FP8 linears run vLLM's own CUTLASS
``scaled_mm`` below sm100), and a single-rank vLLM reads FlashInfer's managed store instead of
these files: both are refused with the reason, never written on a guess.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from autotune_cache.autotuner import buckets as B
from autotune_cache.autotuner.installed import flashinfer_version_of
from autotune_cache.autotuner.recipe import OpRecipe
from autotune_cache.calls.fused_moe import cutlass_moe, moe_layers_in
from autotune_cache.engines.vllm.dispatch import layout_class, moe_dispatch
from autotune_cache.engines.vllm.layout import VllmRankName, arch_dir, single_rank
from autotune_cache.engines.vllm.sm100 import sm100_refusal, vllm_trtllm_bf16_moe
from autotune_cache.engines.vllm.target import VllmTarget
from autotune_cache.errors import UsageError
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.entry_key import KeyFields, render_dtype
from autotune_cache.plan.resolution import Resolution, arch_major
from autotune_cache.plan.spec import ModelSpec, load_spec
from autotune_cache.plan.topology import Topology, TopologyError
from autotune_cache.plan.tuning import OpPlan, TuningPlan, Workload, pp_layer_ranges
from autotune_cache.plan.weights import expert_weights_kind

if TYPE_CHECKING:
    from autotune_cache.plan.request import TuneRequest

#: The vLLM releases whose call sites, buckets and file names this module was checked against.
VLLM_CHECKED = ("0.33.0",)
#: What the vLLM wheel requires (``flashinfer-python==0.7.2.post1``): tests/data/engine_flashinfer_pins.json.
FLASHINFER_PINS = {"0.33.0": "0.7.2.post1"}
SCHEMA = "vllm-0.33"
#: The largest CUDA graph vLLM captures by default below Blackwell (``min(2 x max_num_seqs, 512)``).
_DEFAULT_MAX_GRAPH = 512


def other_config_refusal(manifest, plan: "TuningPlan") -> str | None:
    """Why an entry at a vLLM hash must not be taken as this plan's: the hash is given, not derived
    from the flags, so a hash copied from another server names another configuration's entry."""
    if manifest is None or plan.engine.name != "vllm":
        return None
    res = plan.resolution
    recorded = ((manifest.request or {}).get("vllm") or {}).get("max_num_batched_tokens")
    diffs = [f"{name} {theirs} there, {ours} here" for name, theirs, ours in (
        ("model", manifest.key_fields.model_path, res.key_fields.model_path),
        ("dtype", manifest.key_fields.dtype, res.key_fields.dtype),
        ("topology", manifest.topology.describe, res.topology.describe),
        ("ep", manifest.key_fields.ep, res.key_fields.ep),
        ("max_num_batched_tokens", recorded, res.chunked_prefill_size)) if theirs != ours]
    if not diffs:
        return None
    return (f"holds tuning for another configuration ({'; '.join(diffs)}): vLLM's config hash names one "
            "configuration - give the hash this server prints (or --force to replace the entry)")


def _moe_split(spec: "ModelSpec", flags: ServerFlags) -> tuple[int, int]:
    """(moe tp size, moe ep size) as ``FusedMoEParallelConfig.make`` flattens tp x dp."""
    world = flags.tp * flags.dp
    if flags.ep not in (1, world):
        raise UsageError(f"--ep {flags.ep}: vLLM's expert parallelism (--enable-expert-parallel) spans every rank "
                         f"of tp x dp: give --ep {world}, or --ep 1 for none")
    return (1, world) if flags.ep > 1 and world > 1 else (world, 1)


def resolve_vllm(spec: "ModelSpec", arch: str, flags: ServerFlags, model_path: str,
                 max_num_batched_tokens: int) -> Resolution:
    """vLLM's view of the target, in the fields the planner and warm read."""
    try:
        topology = Topology(tp=flags.tp, pp=flags.pp, dp=flags.dp, dp_attention=False)
    except TopologyError as e:
        raise UsageError(str(e)) from None
    if flags.pp > spec.num_layers:
        raise UsageError(f"--pp {flags.pp} exceeds the model's {spec.num_layers} layers")
    if spec.num_attention_heads % flags.tp:
        raise UsageError(f"--tp {flags.tp} does not divide the model's {spec.num_attention_heads} attention heads "
                         "(vLLM refuses it)")
    dtype = spec.dtype if flags.dtype == "auto" else render_dtype(flags.dtype)[len("torch."):]
    model_quant = flags.quantization or (spec.quant.method if spec.quant else None)
    backend = flags.moe_runner_backend
    moe_tp, moe_ep = _moe_split(spec, flags)
    experts = inter = None
    reasons: list[str] = []
    notes = [f"checked against vLLM {', '.join(VLLM_CHECKED)}"]
    if spec.moe is not None:
        if spec.moe.num_experts % moe_ep:
            raise UsageError(f"ep {moe_ep} does not divide the model's {spec.moe.num_experts} experts")
        if spec.moe.intermediate_size % moe_tp:
            raise UsageError(f"vLLM's MoE tp size {moe_tp} (tp x dp) does not divide the expert width "
                             f"{spec.moe.intermediate_size}")
        experts, inter = spec.moe.num_experts // moe_ep, spec.moe.intermediate_size // moe_tp
    kind = expert_weights_kind(spec, model_quant)
    per_tensor_fp8 = kind in ("fp8_tensor", "modelopt_fp8")
    why, reasons, dispatch = None, [], None
    if flags.autotune_disabled_by:
        why = f"the server runs with {flags.autotune_disabled_by}"
    elif spec.moe is None:
        if arch_major(arch) != 9:
            raise UsageError(f"vLLM on {arch}: {sm100_refusal(spec, flags, arch, model_quant)}")
        why = ("the model has no MoE layers, and vLLM runs dense layers on its own kernels below sm100 "
               "(per-tensor FP8: its CUTLASS scaled_mm)")
    else:
        dispatch = moe_dispatch(kind, arch, backend, flags.tp, flags.dp, moe_ep)
        if dispatch is None:
            raise UsageError(f"{kind or model_quant} experts with --moe-backend {backend} on {arch} "
                             f"({layout_class(flags.tp, flags.dp, moe_ep)}): not modelled - no recording of vLLM "
                             "0.33's own MoE dispatch covers it (engines/vllm/data/vllm-0.33.0-moe-dispatch.json)")
        if dispatch.error:
            raise UsageError(dispatch.refusal())
        if not dispatch.runs_flashinfer:
            reasons.append(dispatch.why())
        elif (arch_major(arch), dispatch.experts) == (9, "FlashInferExperts") and kind in ("bf16", "fp8_tensor"):
            reasons.append(f"--moe-backend {backend} on sm90: vLLM's FlashInferExperts tunes cutlass_fused_moe at "
                           "startup (its own model construction, recorded)")
        elif (arch_major(arch), dispatch.experts, kind) == (10, "TrtLlmBf16ExpertsMonolithic", "bf16"):
            refusal = sm100_refusal(spec, flags, arch, model_quant)
            if refusal:
                raise UsageError(f"vLLM on {arch}: {refusal}")
            reasons.append(f"--moe-backend {backend} on sm100 (unquantized): vLLM's TrtLlmBf16ExpertsMonolithic tunes "
                           "trtllm_bf16_moe at startup (recorded from vLLM's code on CPU; not yet run on Blackwell)")
        else:
            raise UsageError(f"{kind} experts with --moe-backend {backend} on {arch}: vLLM 0.33 runs them on "
                             f"{dispatch.experts} (a FlashInfer kernel) whose call fi-autotune does not model yet")
    if why:
        reasons.append(f"vLLM would not run FlashInfer autotune: {why}; nothing to cache")
    key_fields = KeyFields(model_path=model_path, dtype=render_dtype(dtype), quantization=flags.quantization,
                           moe_runner_backend=backend, tp=flags.tp, pp=flags.pp, attn_dp_size=flags.dp, ep=moe_ep,
                           config_class=spec.config_class)
    return Resolution(
        arch=arch, flags=flags, topology=topology, key_fields=key_fields, dtype=dtype,
        quantization=flags.quantization, model_quantization=("fp8" if per_tensor_fp8 else model_quant),
        moe_runner_backend=backend, attn_dp_size=flags.dp, attn_tp_size=flags.tp, moe_tp_size=moe_tp,
        moe_ep_size=moe_ep, experts_per_rank=experts, moe_intermediate_per_partition=inter, autotunes=why is None,
        moe_dispatch=dispatch,
        reasons=tuple(reasons), decode_batch=min(_DEFAULT_MAX_GRAPH, max_num_batched_tokens),
        chunked_prefill_size=max_num_batched_tokens, notes=tuple(notes),
    )


def vllm_cutlass_moe(spec: "ModelSpec", res: Resolution, layers: int) -> OpRecipe:
    """``FlashInferExperts.apply``'s call: SGLang's shapes with vLLM's split, FlashInfer's defaults
    for what vLLM leaves out (``use_fused_finalize``, ``enable_pdl``, ``tune_max_num_tokens``),
    an empty ``quant_scales`` list for unquantized weights."""
    base = cutlass_moe(spec, res, layers)
    kwargs = dict(base.kwargs)
    kwargs["use_fused_finalize"] = True  # FlashInfer 0.7.2.post1's default; vLLM does not pass it
    if kwargs["quant_scales"] is None:
        kwargs["quant_scales"] = []
    return replace(base, kwargs=kwargs,
                   mirrors="vllm/model_executor/layers/fused_moe/experts/flashinfer_cutlass_moe.py:"
                           "FlashInferExperts.apply (vLLM 0.33.0)")


def make_vllm_plan(request: "TuneRequest", cache_root: Path) -> TuningPlan:
    """The plan of ``request`` for vLLM. Every rank makes the same call (ranks and layer counts
    never reach a key), so one workload holds every rank file, named as vLLM names them: world
    rank ``d*W + p*tp + t``, W = tp x pp."""
    target = request.engine
    assert isinstance(target, VllmTarget) and request.arch is not None
    flags = request.flags
    one = single_rank(flags.tp, flags.pp, flags.dp)
    n = target.budget(request.arch)
    version = flashinfer_version_of(request.flashinfer_version)
    if target.printed_at and not one and target.printed_at != f"{version}/{arch_dir(request.arch)}":
        raise UsageError(f"--vllm-config-hash: vLLM printed that hash under {target.printed_at}, but this plan is for "
                         f"FlashInfer {version} on {arch_dir(request.arch)}: the hash belongs to another image or GPU "
                         "(give --flashinfer-version/--arch of the server that printed it)")
    source, spec = load_spec(request.model, config=request.config, revision=request.revision,
                             model_path=request.model_path, overrides=flags.overrides, merge_rope=False)
    res = resolve_vllm(spec, request.arch, flags, request.served_path, n)
    stages = pp_layer_ranges(spec.num_layers, flags.pp)
    ops: tuple = ()
    if res.autotunes and res.moe_dispatch is not None and res.moe_dispatch.runs_flashinfer:
        counts = [moe_layers_in(spec, range(start, end)) for start, end in stages]
        if not all(counts):
            p = counts.index(0)
            raise UsageError(f"pipeline stage {p} (layers {stages[p][0]}-{stages[p][1] - 1}) has no MoE layer: vLLM "
                             "writes no file for its ranks; this split is not modelled")
        buckets = B.hybrid_buckets(n)
        recipe = (vllm_trtllm_bf16_moe(spec, res, counts[0], n) if arch_major(request.arch) != 9
                  else vllm_cutlass_moe(spec, res, counts[0]))
        # autotune(skip_ops=VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS): FlashInfer skips exact custom_op matches
        if not recipe.skipped_by(flags.skip_ops):
            ops = (OpPlan(recipe, buckets, buckets, (), n),)
    if ops and not one and not target.config_hash:
        raise UsageError(f"--layout {target.layout} with {flags.tp * flags.pp * flags.dp} ranks needs --vllm-config-hash: "
                         "vLLM names its cache dir by a hash of its whole resolved config, taken after it loads the "
                         "model, so only vLLM can say it; copy it from its startup line 'Using FlashInfer autotune "
                         "cache file: .../<hash>/...' (docs/cache-layout.md)")
    w = flags.tp * flags.pp
    ranks = tuple(VllmRankName(d, d * w + p * flags.tp + t).filename
                  for d in range(flags.dp) for p in range(flags.pp) for t in range(flags.tp))
    notes = (f"buckets: get_hybrid_num_tokens_buckets({n}) as vLLM's --max-num-batched-tokens {n} makes them "
             "(a speculative decoder raises it: not modelled)",)
    layout, key, key_string = target.layout, target.config_hash, \
        "vLLM's config hash, given (vLLM computes it from its whole config after loading the model)"
    if one:  # FlashInfer's managed store: one entry file per key, in the tuning environment's directory
        layout, key, key_string = "flashinfer-v2", "", ("FlashInfer's environment hash: a single-rank vLLM reads "
                                                        "FlashInfer's managed store (autotune_v2), keyed by the GPU's "
                                                        "software stack, not by vLLM's config")
        if target.config_hash:
            notes += ("--vllm-config-hash is not used: a single-rank vLLM reads FlashInfer's managed store",)
    return TuningPlan(
        model=request.model, source=source, spec=spec, resolution=res, schema=SCHEMA, key=key, key_string=key_string,
        flashinfer_version=version, cache_root=Path(cache_root), workloads=(Workload(ranks, ops, tuple(stages)),),
        max_tokens_override=None, notes=notes,
        request=replace(request, flashinfer_version=version, schema=SCHEMA,
                        engine=replace(target, max_num_batched_tokens=n)),
        layout=layout,
    )
