"""SGLang's planner: config -> spec -> SGLang's resolution -> per-rank recipes -> buckets.

Ranks whose calls make the same cache keys share one workload (tuned once, byte-identical
files). Buckets per op: every key SGLang's dummy passes look up for these flags, and every grid
value up to the largest key serving can reach - nothing above it (docs/plan.md).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from autotune_cache.autotuner import buckets as B
from autotune_cache.autotuner.installed import flashinfer_version_of
from autotune_cache.autotuner.recipe import OpRecipe
from autotune_cache.engines.sglang.recipes import recipes_for
from autotune_cache.engines.sglang.resolve import resolve
from autotune_cache.engines.sglang.speculative import MTP_ARCHS
from autotune_cache.errors import UsageError
from autotune_cache.plan.config_source import ConfigSource
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.entry_key import DEFAULT_SCHEMA, get_schema
from autotune_cache.plan.resolution import Resolution
from autotune_cache.plan.spec import ModelSpec, load_spec
from autotune_cache.plan.tuning import OpPlan, TuningPlan, Workload, dummy_tokens, pp_layer_ranges


def _serving_m(recipe: OpRecipe, res: Resolution, passes) -> int:
    """The largest dynamic dimension ``recipe``'s op sees at any time: the dummy passes' and, unless
    the op only decodes or the server is a PD decode worker, a full prefill chunk (per DP rank,
    gathered at a MoE layer)."""
    resolution = {"attn_dp_size": res.attn_dp_size, "mlp_gather": res.mlp_gather}
    op = {"tokens": recipe.tokens}
    m = max((dummy_tokens(resolution, op, p.to_dict()) or 0 for p in passes), default=0)
    if recipe.tokens in ("moe", "dense") and res.flags.disaggregation_mode != "decode":
        m = max(m, res.chunked_prefill_size * (res.gather if recipe.tokens == "moe" else 1))
    return max(m, 1)


def _op_plan(recipe: OpRecipe, res: Resolution, max_override: int | None) -> OpPlan:
    """Buckets for one op: every key SGLang's dummy passes look up for these flags (the engine
    keys) and every grid value up to the largest key serving can look up (so serving finds a
    tuned tactic at every batch and chunk size, and nothing above what it can reach is tuned)."""
    passes = [p for p in res.passes if not recipe.phases or p.phase in recipe.phases]
    cap = recipe.engine_tune_max_cap
    if recipe.bucket_rule == "moe_clamped" and cap is not None and res.flags.disaggregation_mode != "decode":
        # flashinfer_cutlass.py _cutlass_moe_tune_max_num_tokens: min(prefill chunk x attn_dp, 8192)
        tune_max = min(res.chunked_prefill_size * res.attn_dp_size, cap)
    else:
        tune_max = None  # trtllm MoE (and a PD decode worker's cutlass MoE): next_power_of_2(M)
    engine: set[int] = set()
    resolution = {"attn_dp_size": res.attn_dp_size, "mlp_gather": res.mlp_gather}
    for p in passes:
        m = dummy_tokens(resolution, {"tokens": recipe.tokens}, p.to_dict()) or 1
        engine |= B.engine_keys(recipe.bucket_rule, m, tune_max=tune_max)
    largest = _serving_m(recipe, res, passes) if max_override is None else max_override
    top = B.largest_key(recipe.bucket_rule, largest, tune_max)
    grid = set(B.hybrid_buckets(top))
    added = sorted(engine - grid)
    return OpPlan(recipe, tuple(sorted(grid | engine)), tuple(sorted(engine)), tuple(added), top)


def _skip_op_notes(spec: ModelSpec, res: Resolution, stages: list[tuple[int, int]]) -> tuple[str, ...]:
    """A --skip-ops name no call of this plan carries: SGLang 0.5.23 takes any name
    (flashinfer_autotune.py get_flashinfer_autotune_skip_ops: nargs="+", no choices) and hashes it
    into the key, and FlashInfer's autotune(skip_ops=) skips only exact custom_op matches - so a
    typo changes the key and skips nothing. Said, not refused: the key is the server's."""
    asked = set(res.key_fields.skip_ops)
    if not asked or not res.autotunes:
        return ()
    bare = replace(res, key_fields=replace(res.key_fields, skip_ops=()))
    ops = {op for start, end in set(stages) for r in recipes_for(spec, bare, range(start, end)) for op in r.custom_ops}
    unknown = sorted(asked - ops - {"flashinfer_megamoe"})  # SGLang's own name for its MegaMoE pass
    if not unknown:
        return ()
    return (f"--skip-ops {','.join(unknown)}: names no custom_op of the calls this plan tunes "
            f"({', '.join(sorted(ops)) or 'none'}); SGLang 0.5.23 takes any name and hashes it into the key, and "
            "FlashInfer skips only exact custom_op matches, so it skips nothing here",)


def resolve_target(
    model: str, flags: ServerFlags, arch: str, *, config: str | None = None, revision: str | None = None,
    flashinfer_version: str | None = None, model_path: str | None = None, worker: str = "target",
) -> tuple[ConfigSource, ModelSpec, Resolution, str]:
    """Config, spec, SGLang's resolution and the FlashInfer version: everything the key and the
    entry's path need, and nothing that imports flashinfer (``pull``, ``check`` and ``key``
    use this in images without a GPU)."""
    if flags.overrides and flags.speculative_algorithm:
        raise UsageError("--json-model-override-args with speculative decoding: SGLang applies it to the draft "
                         "model's config too, which fi-autotune does not model")
    source, spec = load_spec(model, config=config, revision=revision, model_path=model_path,
                             overrides=flags.overrides, merge_rope=True)
    served = model if model_path is None else model_path
    if worker == "draft":
        draft = draft_spec(spec, flags, served, revision=revision)
        res = resolve(spec, arch, flags, served, worker="draft", draft_spec=draft)
        return source, draft, res, flashinfer_version_of(flashinfer_version)
    res = resolve(spec, arch, flags, served)
    return source, spec, res, flashinfer_version_of(flashinfer_version)


def draft_spec(target: ModelSpec, flags: ServerFlags, served: str, *, revision: str | None) -> ModelSpec:
    """The speculative draft model's spec: the target checkpoint's own MTP layer (EAGLE/NEXTN on
    DeepSeek-family models), else the --speculative-draft-model-path model's config."""
    path = flags.speculative_draft_model_path
    if target.architecture in MTP_ARCHS and path in (None, served):
        return target.nextn()
    if path is None:
        raise UsageError(f"--speculative-algorithm on {target.architecture} needs --speculative-draft-model-path")
    if flags.pp > 1:
        raise UsageError("speculative decoding with --pp > 1: the draft runs on the last stage only, "
                         "which fi-autotune does not model")
    try:
        draft = load_spec(path, config=None, revision=None, model_path=None)[1]
    except UsageError as e:
        raise UsageError(f"--speculative-draft-model-path {path}: {e}") from None
    if draft.architecture.startswith("LlamaForCausalLMEagle") and (draft.quant or flags.quantization):
        # Its layers take 2 x hidden inputs (token embedding + fused target states): the dense
        # recipes' shapes do not hold, and only a quantized draft would make them tunable.
        raise UsageError(f"--speculative-draft-model-path {path}: a quantized {draft.architecture} draft is not "
                         "modelled")
    return draft


def make_plan(
    model: str,
    flags: ServerFlags,
    arch: str,
    *,
    config: str | None = None,
    revision: str | None = None,
    schema: str = DEFAULT_SCHEMA,
    flashinfer_version: str | None = None,
    cache_root: Path,
    max_tokens: int | None = None,
    model_path: str | None = None,
    request=None,
    worker: str = "target",
) -> TuningPlan:
    if max_tokens is not None and max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {max_tokens}")
    source, spec, res, version = resolve_target(model, flags, arch, config=config, revision=revision,
                                                flashinfer_version=flashinfer_version, model_path=model_path,
                                                worker=worker)
    schema_obj = get_schema(schema)

    if request is not None:
        request = replace(request, arch=arch, flashinfer_version=version)  # recorded as resolved
    by_signature: dict[tuple, tuple[list[str], list[OpPlan], list[tuple[int, int]]]] = {}
    stages = pp_layer_ranges(spec.num_layers, flags.pp) if worker == "target" else [(0, spec.num_layers)] * flags.pp
    for rank in res.topology.rank_names():
        start, end = stages[rank.pp]
        recipes = recipes_for(spec, res, range(start, end))
        sig = tuple(r.signature() for r in recipes)
        if sig not in by_signature:
            by_signature[sig] = ([], [_op_plan(r, res, max_tokens) for r in recipes], [])
        ranks, _, spans = by_signature[sig]
        ranks.append(rank.filename)
        if (start, end) not in spans:
            spans.append((start, end))
    workloads = tuple(Workload(tuple(r), tuple(ops), tuple(spans)) for r, ops, spans in by_signature.values())
    return TuningPlan(
        model=model, source=source, spec=spec, resolution=res, schema=schema,
        key=schema_obj.key(res.key_fields), key_string=schema_obj.key_string(res.key_fields),
        flashinfer_version=version, cache_root=Path(cache_root), workloads=workloads,
        max_tokens_override=max_tokens, request=request, notes=_skip_op_notes(spec, res, stages),
    )
