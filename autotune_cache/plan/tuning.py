"""The tuning plan: what an engine's planner (``engines/<engine>/planner``) says a target tunes.

``TuningPlan`` stays typed up to the worker process (``warm.worker_task`` serializes what a
worker needs); ``to_dict()`` is the JSON ``fi-autotune plan --json`` prints. No GPU and no CUDA
runtime is needed; flashinfer is imported (CPU only) for its bucket functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from autotune_cache import registry
from autotune_cache.autotuner.jit_modules import ModulePlan, module_plan
from autotune_cache.autotuner.recipe import OpRecipe
from autotune_cache.plan.config_source import ConfigSource
from autotune_cache.plan.resolution import Resolution
from autotune_cache.plan.spec import ModelSpec

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

    def lookups(self) -> list[list[str]]:
        """Every lookup of the engine's startup pass: per (bucket, custom op) the keys it may be
        stored under (one per candidate runner; a cache holds the winner's)."""
        return [group for b in self.engine_keys for group in self.recipe.candidate_keys(b)]

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
    #: What the FlashInfer release this plan is for means to the server (``TuneRequest.plan``): its
    #: keys are not recorded for it, or the serving release runs another FlashInfer. Shown with the
    #: notes, and by ``warm`` as warnings: the tuning it does may not be used.
    version_warnings: tuple[str, ...] = field(default=())
    request: "TuneRequest | None" = field(default=None, compare=False)
    #: The engine layout the entry is written in: ``sglang``, or ``vllm`` / ``vllm-dir`` (``vllm.py``).
    layout: str = "sglang"

    @property
    def engine(self):
        """The engine object (``registry``) that runs the calls (``str()``: its label): the
        request's - a single-rank vLLM writes FlashInfer's managed store, yet its calls are vLLM's."""
        if self.request is not None:
            return registry.get_engine(self.request.engine.name)
        return registry.engine_of_layout(self.layout) or registry.default_engine()

    @property
    def bound(self) -> bool:
        """False for a plan into FlashInfer's managed store not yet tied to an environment: its
        directory is the hash of the tuning GPU's software stack, known once that GPU is
        (``for_environment``: warm binds it, ``plan --env-from`` too)."""
        return bool(self.key)

    @property
    def id_str(self) -> str:
        """The entry's id for messages: an unbound store plan's names its layout and what is pending."""
        return str(self.entry_id) if self.bound else f"{self.layout}:<environment hash>"

    def for_environment(self, metadata: dict) -> "TuningPlan":
        """This plan with the key the environment ``metadata`` (FlashInfer's ``_metadata``) names:
        unchanged for a layout whose path does not depend on it."""
        return self.layout_obj.bind_environment(self, metadata)

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
        return (f"{self.engine.title} enters its autotune pass (" + "; ".join(r.reasons) + "), but none of the "
                "calls it makes there has tactics to tune for this model: its file holds no tactics",)

    def kernel_modules(self) -> ModulePlan:
        """The FlashInfer kernel modules a warm of this plan loads, each prebuilt, cached here or
        to be compiled (``autotuner/jit_modules.py``): a fresh machine's first warm is mostly that."""
        return module_plan((o.recipe.api for w in self.workloads for o in w.ops), self.flashinfer_version,
                           self.resolution.arch)

    @property
    def layout_obj(self):
        return registry.get_layout(self.layout)

    @property
    def arch_dir(self) -> str:
        """The arch as the layout spells it in the path (``sm90`` for SGLang, ``90a`` for vLLM)."""
        return self.layout_obj.arch_level(self.resolution.arch)

    @property
    def entry_id(self):
        if not self.bound:
            return None
        fields = {"flashinfer_version": self.flashinfer_version, "arch": self.arch_dir, "key": self.key, "env_hash": self.key}
        layout = self.layout_obj
        return layout.make_id(tuple(fields[level.field] for level in layout.levels))

    @property
    def key_dir(self) -> Path:
        """The entry's directory (an unbound plan's: the store's base, where its directory will be)."""
        if not self.bound:
            return self.layout_obj.base(self.cache_root)
        return self.layout_obj.entry_dir(self.cache_root, self.entry_id)

    @property
    def writes(self) -> str | None:
        """What warm writes: ``rank_files`` under ``key_dir``, ``store_entries`` (FlashInfer's managed
        store: one file per winner under ``key_dir``/entries/), or None when nothing is tuned."""
        if not self.autotunes:
            return None
        return self.layout_obj.writes

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
            "id": str(self.entry_id) if self.bound else None,
            "cache_root": str(self.cache_root),
            # where warm writes: nothing (null) when the plan tunes nothing
            "key_dir": str(self.key_dir) if self.autotunes else None,
            "writes": self.writes,
            "rank_files": self.rank_files,  # the files the key names (SGLang's cache path), tuned or not
            "dp_meaning": self.engine.dp_meaning(self.resolution.topology),
            "autotunes": self.autotunes,
            "reasons": list(r.reasons),
            "notes": list(r.notes + self.notes + self.version_warnings),
            "max_tokens_override": self.max_tokens_override,
            "kernel_modules": self.kernel_modules().to_dict() if self.autotunes else None,
            "workloads": [{**w.to_dict(), "ops": [o.to_dict() | {"from": self.provenance(o.recipe)} for o in w.ops]}
                          for w in self.workloads],
            "profiles": self.profiles,
        }

    def provenance(self, recipe) -> str:
        """Why this call is in the plan, for a reader (and doctor): for the experts, the recorded
        dispatch of the engine's own code that names the kernel (``Resolution.moe_dispatch``);
        for every call, the engine's call site it mirrors and how its keys were checked."""
        checked = ("run on a GPU" if recipe.verified else "keys from FlashInfer's own code on the engine's recorded "
                   "call" if recipe.keys_checked else "read from the engine's code, not recorded")
        site = f"{recipe.mirrors} ({checked})"
        dispatch = self.resolution.moe_dispatch
        source = getattr(dispatch, "source", None) if recipe.id.startswith("moe.") else None
        return f"{source}; call: {site}" if source else f"call: {site}"


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


