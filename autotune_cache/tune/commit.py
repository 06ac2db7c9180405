"""The two ends of a warm that touch the tree: what is already at a plan's path (refused, kept,
or tuned again), and the entry written from the tuned rank files in one step."""

from __future__ import annotations

from dataclasses import dataclass

from autotune_cache.errors import FiAutotuneError
from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tree.manifest import Manifest, utc_now_iso
from autotune_cache.tree.scan import scan_entry
from autotune_cache.tune.gpus import GpuInfo
from autotune_cache.tree.writer import commit_entry, other_gpu_refusal, replace_policy


@dataclass(frozen=True)
class Existing:
    """The entry already at a plan's path. ``refusal``: why it must not be replaced without
    --force (another GPU model's, or another configuration's under the same vLLM hash)."""

    refusal: str | None
    complete: bool
    quality: str | None  # the mode it was tuned in (None: by the engine or an older warm)


def existing_entry(plan: TuningPlan, info: GpuInfo) -> Existing | None:
    """What is at the plan's path (None: nothing); one rule for ``warm`` and ``warm --targets``.
    In FlashInfer's managed store (the plan bound to this GPU's environment) each key stands
    alone: complete when every lookup of the startup pass has its entry."""
    if not plan.key_dir.is_dir():
        return None
    if plan.layout_obj.env_keyed:
        groups = [g for w in plan.workloads for op in w.ops for g in op.lookups()]
        return Existing(None, not plan.layout_obj.lacking(plan.key_dir, groups), None)
    existing = scan_entry(plan.layout_obj, plan.key_dir, plan.entry_id)
    why = other_gpu_refusal(existing.gpu, info.names[0], plan.resolution.arch) or plan.engine.existing_entry_refusal(existing.manifest, plan)
    return Existing(
        refusal=why,
        complete=existing.complete_for(plan.rank_files),
        quality=existing.manifest.stats.get("quality") if existing.manifest else None,
    )


def commit_plan(plan: TuningPlan, rank_bytes: dict[str, bytes], metadata: dict, stats: dict, extra: dict,
                force: bool) -> str:
    """The manifest for ``plan`` and its rank files, committed in one step (refusals raise); or,
    for FlashInfer's managed store, every tuned key published as its own entry. What was written
    (the entry's directory, and for a store how many entries)."""
    layout = plan.layout_obj
    if layout.env_keyed:
        published = layout.publish_tuning(plan.cache_root, rank_bytes)
        return f"{published.env_dir}: {published.written} entries written, {published.unchanged} already there"
    now = utc_now_iso()
    res = plan.resolution
    manifest = Manifest(
        key=plan.key, schema=plan.schema, key_string=plan.key_string, key_fields=res.key_fields,
        topology=res.topology, flashinfer_version=plan.flashinfer_version, arch=plan.arch_dir, flashinfer_metadata=metadata,
        rank_files={}, created=now, updated=now, stats={**stats, "model_source": plan.source.describe()},
        request=plan.request.to_dict() if plan.request is not None else None, extra=extra,
    )
    result = commit_entry(layout, plan.cache_root, plan.entry_id, rank_bytes, manifest,
                          check=replace_policy(layout, plan.cache_root, force))
    if result.refused:
        raise FiAutotuneError(f"{plan.entry_id}: {result.refused[0][1]}; nothing was written")
    return str(plan.key_dir)
