"""``warm``: run a plan on however many GPUs this machine has, and commit the rank files.

The (op, bucket) profiles of every distinct op are spread over one worker process per GPU
(``worker.py``, bound with CUDA_VISIBLE_DEVICES). Each worker tunes its buckets with
``autotune(True, tuning_buckets=(b,))`` - a profile tuned that way is stored under its own
value, exactly where a default engine pass looks it up - into per-op cache files in a work dir.
When every worker has finished, the files are merged (refusing mixed ``_metadata``: different
GPU models or software), one rank file is built per workload and copied byte for byte to each of
its ranks, and the whole entry is committed in one atomic step. Nothing reaches the tree before
that; an interrupted run keeps its finished buckets in the work dir and resumes from them.

One target is a fleet of one (``fleet.warm_fleet`` with ``alone``): the same admission, work
queue, dispatch, supervision, careful races and commit as ``warm --targets``; this module only
turns the fleet's answer into a ``WarmResult`` and its messages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from autotune_cache.errors import FiAutotuneError
from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tune.session.fleet import FleetItem, warm_fleet
from autotune_cache.tune.workers.gpus import GpuInfo
from autotune_cache.tune.workers.machine import THIS_MACHINE, Machine, preflight
from autotune_cache.tune.workers.pool import WorkerPool
from autotune_cache.tune.careful.quality import QualitySettings


@dataclass
class WarmResult:
    status: str  # written | complete | nothing-to-tune
    key_dir: str
    rank_files: list[str] = field(default_factory=list)
    profiles_tuned: int = 0
    profiles_total: int = 0
    gpus: int = 0
    timings: dict = field(default_factory=dict)
    message: str = ""
    selection: dict = field(default_factory=dict)  # careful mode: quality.selection_summary

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _kept(item: FleetItem, quality: QualitySettings | None) -> WarmResult:
    """What a target's fleet of one found at its path, without --force: another GPU model's entry
    is refused, a complete one is kept."""
    plan, existing = item.plan, item.existing
    if item.status == "failed":
        raise FiAutotuneError(f"{plan.entry_id} {existing.refusal}")
    was = existing.quality
    again = "carefully " if quality is not None and quality.careful and was != "careful" else ""
    return WarmResult("complete", str(plan.key_dir), message=f"already complete{plan.layout_obj.complete_words(was)} "
                      f"(use --force to tune it again {again}and replace it)")


def warm(
    plan: TuningPlan,
    *,
    gpus: int | None = None,
    force: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
    gpu_info: GpuInfo | None = None,
    pool: WorkerPool | None = None,
    quality: QualitySettings | None = None,
    machine: Machine = THIS_MACHINE,
    started: tuple[float, float] | None = None,
) -> WarmResult:
    """Tune ``plan`` on this machine's GPUs (``gpu_info``: as already detected) and commit its
    entry; its time line counts from ``started`` (perf and epoch seconds; default: now)."""
    started = started or (time.perf_counter(), time.time())
    if not plan.autotunes:
        return WarmResult("nothing-to-tune", str(plan.key_dir),
                          message=f"{plan.engine} would not autotune this configuration: nothing to write")
    info = gpu_info or machine.detect_gpus()
    preflight(plan, info, gpus, pool)
    if not plan.bound:  # FlashInfer's managed store: the directory this GPU's environment names
        plan = plan.for_environment(machine.environment())
    item = FleetItem("target", plan)
    result = warm_fleet([item], gpus=gpus, info=info, pool=pool, force=force, progress=progress, machine=machine,
                        quality=quality, alone=True, started=started)
    if item.status != "written":
        return _kept(item, quality)
    files = [str(plan.key_dir / r) for r in item.rank_files]
    return WarmResult("written", str(plan.key_dir), files, result.profiles_tuned, result.profiles_distinct, result.gpus,
                      result.timings, message="" if files else f"published {item.written}", selection=item.selection)
