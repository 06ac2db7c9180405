"""The tuning plan: config -> spec -> SGLang resolution -> per-rank recipes -> buckets.

``TuningPlan`` stays typed up to the worker process (``warm.worker_task`` serializes what a
worker needs); ``to_dict()`` is the JSON ``fi-autotune plan --json`` prints. No GPU and no CUDA
runtime is needed; flashinfer is imported (CPU only) for its bucket functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from autotune_cache.autotuner import buckets as B
from autotune_cache.plan.config_source import ConfigSource, load_model_config
from autotune_cache.errors import UsageError
from autotune_cache.autotuner.installed import installed_flashinfer_version
from autotune_cache.plan.keys import DEFAULT_SCHEMA, get_schema
from autotune_cache.engines.sglang.layout import VERSION_RE
from autotune_cache.engines.sglang.recipes import OpRecipe, recipes_for
from autotune_cache.engines.sglang.resolve import Resolution, ServerFlags, resolve
from autotune_cache.plan.spec import ModelSpec, build_spec

if TYPE_CHECKING:
    from autotune_cache.plan.request import TuneRequest

PLAN_FORMAT = 1


@dataclass(frozen=True)
class OpPlan:
    recipe: OpRecipe
    buckets: tuple[int, ...]  # what warm tunes (grid values + engine keys), each stored under itself
    engine_keys: tuple[int, ...]  # what SGLang's dummy pass for these flags looks up
    added: tuple[int, ...]  # engine keys the superset lacked, added to ``buckets``
    max_tokens: int

    @property
    def profiles(self) -> int:
        return len(self.buckets) * len(self.recipe.custom_ops)

    def to_dict(self) -> dict:
        return {
            **self.recipe.to_dict(), "buckets": list(self.buckets), "engine_keys": list(self.engine_keys),
            "added_engine_keys": list(self.added), "max_tokens": self.max_tokens, "profiles": self.profiles,
        }


@dataclass(frozen=True)
class Workload:
    """Ranks whose calls produce identical cache keys: they get byte-identical rank files."""

    ranks: tuple[str, ...]  # rank file names
    ops: tuple[OpPlan, ...]
    stages: tuple[tuple[int, int], ...]  # [start, end) layer spans of the pipeline stages it covers

    @property
    def profiles(self) -> int:
        return sum(o.profiles for o in self.ops)

    def to_dict(self) -> dict:
        return {"ranks": list(self.ranks), "stages": [list(s) for s in self.stages], "profiles": self.profiles,
                "ops": [o.to_dict() for o in self.ops]}


@dataclass(frozen=True)
class TuningPlan:
    model: str
    source: ConfigSource
    spec: ModelSpec
    resolution: Resolution
    schema: str
    key: str
    key_string: str
    flashinfer_version: str
    cache_root: Path
    workloads: tuple[Workload, ...]
    max_tokens_override: int | None = None
    notes: tuple[str, ...] = field(default=())
    request: "TuneRequest | None" = field(default=None, compare=False)
    #: The engine layout the entry is written in: ``sglang``, or ``vllm`` / ``vllm-dir`` (``vllm.py``).
    layout: str = "sglang"

    @property
    def engine(self) -> str:
        return self.layout_obj.engine

    @property
    def autotunes(self) -> bool:
        return self.resolution.autotunes and any(w.ops for w in self.workloads)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why there is (or is no) tuning, for messages: SGLang's gate; where the gate is open but
        no call of the model is one fi-autotune tunes, that instead."""
        r = self.resolution
        if self.autotunes:
            return r.reasons
        if not r.autotunes:
            return tuple(x for x in r.reasons if "is False" in x) or r.reasons
        return ("SGLang 0.5.23 enters its autotune pass (" + "; ".join(r.reasons) + "), but none of the calls "
                "it makes there has tactics to tune for this model: its file holds no tactics",)

    @property
    def layout_obj(self):
        from autotune_cache.registry import get_layout

        return get_layout(self.layout)

    @property
    def arch_dir(self) -> str:
        """The arch as the layout spells it in the path (``sm90`` for SGLang, ``90a`` for vLLM)."""
        return self.layout_obj.arch_level(self.resolution.arch)

    @property
    def entry_id(self):
        fields = {"flashinfer_version": self.flashinfer_version, "arch": self.arch_dir, "key": self.key}
        layout = self.layout_obj
        return layout.make_id(tuple(fields[level.field] for level in layout.levels))

    @property
    def key_dir(self) -> Path:
        return self.layout_obj.entry_dir(self.cache_root, self.entry_id)

    @property
    def rank_files(self) -> list[str]:
        return self.layout_obj.expected_files(self.resolution.topology)

    @property
    def profiles(self) -> int:
        """Distinct (op, bucket) profiles: what warm measures once and copies to every rank."""
        return sum(w.profiles for w in self.workloads)

    def to_dict(self) -> dict:
        r = self.resolution
        return {
            "format": PLAN_FORMAT,
            "model": self.model,
            "model_path": r.key_fields.model_path,
            "request": self.request.to_dict() if self.request is not None else None,
            "source": self.source.to_dict() | {"describe": self.source.describe()},
            "spec": self.spec.to_dict(),
            "resolution": r.to_dict(),
            "schema": self.schema,
            "key": self.key,
            "key_string": self.key_string,
            "flashinfer_version": self.flashinfer_version,
            "arch": r.arch,
            "layout": self.layout,
            "id": str(self.entry_id),
            "cache_root": str(self.cache_root),
            "key_dir": str(self.key_dir),
            "rank_files": self.rank_files,
            "autotunes": self.autotunes,
            "reasons": list(r.reasons),
            "notes": list(r.notes + self.notes),
            "max_tokens_override": self.max_tokens_override,
            "workloads": [w.to_dict() for w in self.workloads],
            "profiles": self.profiles,
        }


def pp_layer_ranges(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """sglang/srt/distributed/utils.py get_pp_indices: even split, the remainder to the last stages."""
    base, extra = divmod(num_layers, pp)
    ranges, start = [], 0
    for stage in range(pp):
        size = base + (1 if stage >= pp - extra else 0)
        ranges.append((start, start + size))
        start += size
    return ranges


def dummy_tokens(resolution: dict, op: dict, dummy_pass: dict) -> int | None:
    """What SGLang's dummy pass ``dummy_pass`` feeds this op: its largest batch (the request pool
    holds up to that many) times the tokens per request (except for MLA verify calls, whose dim 0
    counts requests), times the attention-DP width at a gathered MoE layer; None when the op is
    not part of that pass. Plain JSON (the plan's ``resolution``, a recipe, a pass), so the GPU
    replays (``verify``, tests, benchmarks) feed exactly what the plan counted."""
    phases = op.get("phases") or ()
    if phases and dummy_pass["phase"] not in phases:
        return None
    gather = resolution["attn_dp_size"] if op["tokens"] == "moe" and resolution.get("mlp_gather") else 1
    per_req = dummy_pass["tokens_per_req"] if op["tokens"] != "requests" else 1
    return dummy_pass["batch"][1] * per_req * gather


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


def resolve_target(
    model: str, flags: ServerFlags, arch: str, *, config: str | None = None, revision: str | None = None,
    flashinfer_version: str | None = None, model_path: str | None = None, worker: str = "target",
) -> tuple[ConfigSource, ModelSpec, Resolution, str]:
    """Config, spec, SGLang's resolution and the FlashInfer version: everything the key and the
    entry's path need, and nothing that imports flashinfer (``pull``, ``check`` and ``key``
    use this in images without a GPU)."""
    source, spec = load_spec(model, config=config, revision=revision, model_path=model_path)
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
    from autotune_cache.engines.sglang.speculative import MTP_ARCHS

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


def load_spec(model: str, *, config: str | None, revision: str | None, model_path: str | None) -> tuple[ConfigSource, ModelSpec]:
    """The model's config and what the planners read from it (no engine's view yet)."""
    source = load_model_config(model, config=config, revision=revision, model_path=model_path)
    return source, build_spec(source)


def flashinfer_version_of(given: str | None) -> str:
    """The FlashInfer version in the entry's path: ``--flashinfer-version``, else the installed one."""
    version = given or installed_flashinfer_version()
    if not version:
        raise UsageError("flashinfer-python is not installed: pass --flashinfer-version")
    if not VERSION_RE.match(version):
        raise UsageError(f"invalid --flashinfer-version {version!r}")
    return version


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
        from dataclasses import replace

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
        max_tokens_override=max_tokens, request=request,
    )
