"""The two ends of a warm that touch the tree: what is already at a plan's path (refused, kept,
or tuned again), and the entry written from the tuned rank files in one step."""

from __future__ import annotations

from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tree.layouts.values import Existing
from autotune_cache.tune.workers.gpus import GpuInfo


def existing_entry(plan: TuningPlan, info: GpuInfo) -> Existing | None:
    """What is at the plan's path (None: nothing); one rule for ``warm`` and ``warm --targets``,
    answered by the plan's layout (``CacheLayout.existing``)."""
    if not plan.key_dir.is_dir():
        return None
    return plan.layout_obj.existing(plan, info.names[0])


def commit_plan(plan: TuningPlan, rank_bytes: dict[str, bytes], metadata: dict, stats: dict, extra: dict,
                force: bool) -> str:
    """The plan's tuned files written in one step as its layout holds them (``commit_tuning``:
    a rank-file entry with its manifest, or FlashInfer's managed store's entries); refusals raise.
    What was written (the entry's directory, and for a store how many entries)."""
    return plan.layout_obj.commit_tuning(plan, rank_bytes, metadata, stats, extra, force)
