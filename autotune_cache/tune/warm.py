"""``warm``: run a plan on however many GPUs this machine has, and commit the rank files.

The (op, bucket) profiles of every distinct op are spread over one worker process per GPU
(``worker.py``, bound with CUDA_VISIBLE_DEVICES). Each worker tunes its buckets with
``autotune(True, tuning_buckets=(b,))`` - a profile tuned that way is stored under its own
value, exactly where a default engine pass looks it up - into per-op cache files in a work dir.
When every worker has finished, the files are merged (refusing mixed ``_metadata``: different
GPU models or software), one rank file is built per workload and copied byte for byte to each of
its ranks, and the whole entry is committed in one atomic step. Nothing reaches the tree before
that; an interrupted run keeps its finished buckets in the work dir and resumes from them.

The parts live beside this orchestrator: ``machine`` (GPUs, worker command), ``workdir``,
``work`` (the plan as work items), ``dispatch``/``supervise`` (the pool), ``careful`` (races),
``commit``. ``fleet.py`` is the same run for many targets at once.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from autotune_cache.autotuner.rankfile import cache_file_bytes
from autotune_cache.errors import FiAutotuneError
from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tune.careful import RacePlan, plan_pair_races, plan_races, select_op
from autotune_cache.tune.commit import commit_plan, existing_entry
from autotune_cache.tune.dispatch import Tasks, pool_for, run_workers
from autotune_cache.tune.gpus import GpuInfo
from autotune_cache.tune.machine import THIS_MACHINE, Machine, preflight
from autotune_cache.tune.pool import WorkerPool
from autotune_cache.tune.quality import QualitySettings, selection_summary
from autotune_cache.tune.supervise import Phase
from autotune_cache.tune.timings import worker_timings
from autotune_cache.tune.work import distinct_ops, profiles_of, skeleton_of, work_queue
from autotune_cache.tune.workdir import (lock_work_dir, merged_results, one_metadata, open_work_dir, read_done,
                                         tune_prefix, work_dir)


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


@dataclass(frozen=True)
class _Run:
    """One warm's work once the plan is admitted: its work dir, settings and start times."""

    plan: TuningPlan
    wd: Path
    n: int
    quality: QualitySettings
    force: bool
    t_start: float
    epoch_start: float


def _kept(plan: TuningPlan, info: GpuInfo, quality: QualitySettings | None) -> WarmResult | None:
    """What is already at the plan's path, without --force: another GPU model's entry is refused,
    a complete one is kept (None: tune)."""
    existing = existing_entry(plan, info)
    if existing is None:
        return None
    if existing.refusal:
        raise FiAutotuneError(f"{plan.entry_id} {existing.refusal}")
    if not existing.complete:
        return None
    was = existing.quality
    how = f"in {was} mode" if was else "by the engine or an older warm"
    if not plan.layout_obj.holds_rank_files:
        how = "(every lookup of the startup pass has its entry in FlashInfer's managed store)"
    again = "carefully " if quality is not None and quality.careful and was != "careful" else ""
    return WarmResult("complete", str(plan.key_dir), message=f"already complete{'' if how.startswith('(') else ', tuned'} {how} (use --force to tune "
                      f"it again {again}and replace it)")


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
) -> WarmResult:
    """Tune ``plan`` on this machine's GPUs (``gpu_info``: as already detected) and commit its entry."""
    t_start, epoch_start = time.perf_counter(), time.time()
    if not plan.autotunes:
        return WarmResult("nothing-to-tune", str(plan.key_dir),
                          message=f"{plan.engine} would not autotune this configuration: nothing to write")
    info = gpu_info or machine.detect_gpus()
    n = preflight(plan, info, gpus, pool)
    if not plan.bound:  # FlashInfer's managed store: the directory this GPU's environment names
        plan = plan.for_environment(machine.environment())
    if not force:
        kept = _kept(plan, info, quality)
        if kept is not None:
            return kept
    quality = quality or QualitySettings()
    if quality.careful and not quality.graph_max_tokens:
        # The engine replays CUDA graphs up to its decode batch (every attention-DP rank's, at a MoE)
        quality = dataclasses.replace(quality, graph_max_tokens=plan.resolution.decode_batch * plan.resolution.attn_dp_size)
    wd = work_dir(plan, quality)
    lock = lock_work_dir(wd)
    try:
        open_work_dir(wd, force)
        return _tune_and_commit(_Run(plan, wd, n, quality, force, t_start, epoch_start), progress, pool, machine)
    finally:
        os.close(lock)


def _tune_and_commit(run: _Run, progress, pool: WorkerPool | None, machine: Machine) -> WarmResult:
    plan, wd, quality = run.plan, run.wd, run.quality
    ops, per_workload = distinct_ops(plan)
    # One task op per tune of each distinct op: quick mode has one tune, careful mode ``repeats``.
    tunes = [(i, r if quality.careful else None) for i in range(len(ops)) for r in range(quality.tunes)]
    done = [read_done(wd, tune_prefix(i, r)) for i, r in tunes]
    tune_ops = [ops[i] for i, _ in tunes]
    total = profiles_of(tune_ops)
    already = sum(len(d & set(op["buckets"])) * len(op["custom_ops"]) for op, d in zip(tune_ops, done))
    queue = work_queue(tune_ops, done)
    races: list[RacePlan] = []
    pairs: list[RacePlan] = []

    def race_phase() -> list[str]:
        races.extend(plan_races(wd, ops, quality))
        return [f"race {r.spec}" for r in races if not r.result.exists() and r.spec is not None]

    def pair_phase() -> list[str]:  # needs every first race's result: a phase of its own
        pairs.extend(plan_pair_races(wd, races, quality))
        return [f"race {r.spec}" for r in pairs if not r.result.exists()]

    phases = [Phase("tuning", lambda: [f"{v} {b}" for v, b in queue], total, already)]
    if quality.careful:
        phases += [Phase("racing", race_phase), Phase("pairing", pair_phase)]
    tasks = Tasks(skeleton_of(plan), quality.careful, lambda w: [
        {"op": ops[i], "layer": i, "out": str(wd / f"{tune_prefix(i, r)}.w{w}.json"),
         "done": str(wd / f"{tune_prefix(i, r)}.w{w}.done")} for i, r in tunes], lambda w: wd / f"task.w{w}.json")
    with pool_for(machine, run.n, pool) as p:
        active = len(p.procs) if quality.careful else min(len(p.procs), len(queue))
        events = run_workers(p, tasks, active, phases, progress)
    t_tuned = time.perf_counter()
    rank_bytes, metadata, selection = _rank_files(run, ops, per_workload, races, pairs)
    timings = worker_timings(events, run.t_start, t_tuned)
    stats = {"profiles": total, "profiles_tuned_this_run": total - already, "gpus": run.n,
             **{k: v for k, v in timings.items() if k != "timeline"}, "quality": quality.mode,
             **({"selection": selection_summary(selection)} if quality.careful else {})}
    extra = {"selection": {"settings": quality.to_dict(), **({"ops": selection} if quality.careful else {})}}
    try:
        written = commit_plan(plan, rank_bytes, metadata, stats, extra, run.force)
    except FiAutotuneError as e:
        raise FiAutotuneError(f"{e} (the tuned buckets are kept in {wd})") from None
    timings["write_s"] = round(time.perf_counter() - t_tuned, 3)
    timings["wall_s"] = round(time.perf_counter() - run.t_start, 3)
    timings["timeline"].update(planned=run.epoch_start, written=time.time())
    shutil.rmtree(wd, ignore_errors=True)
    files = [str(plan.key_dir / r) for r in sorted(rank_bytes)] if plan.layout_obj.holds_rank_files else []
    return WarmResult("written", str(plan.key_dir), files, total - already, total, run.n, timings,
                      message="" if files else f"published {written}",
                      selection=selection_summary(selection) if quality.careful else {})


def _rank_files(run: _Run, ops: list[dict], per_workload: list[list[int]], races: list[RacePlan],
                pairs: list[RacePlan]) -> tuple[dict[str, bytes], dict, dict]:
    """The entries of every op (careful: the raced winners), merged per workload into one rank
    file's bytes for each of its ranks; the ``_metadata`` and, careful, what was chosen per op."""
    selection: dict = {}
    op_results = []
    for i, op in enumerate(ops):
        if run.quality.careful:
            meta, entries, chosen = select_op(run.wd, i, op, run.quality, [r for r in races if r.op == i],
                                              [r for r in pairs if r.op == i])
            selection[op["id"]] = chosen
        else:
            meta, entries = merged_results(run.wd, tune_prefix(i, None))
        op_results.append((meta, entries))
    rank_bytes: dict[str, bytes] = {}
    metadata: dict = {}
    for w_idx, w in enumerate(run.plan.workloads):
        metas = [op_results[i][0] for i in per_workload[w_idx] if op_results[i][1] or op_results[i][0]]
        if not metas:
            raise FiAutotuneError("tuning produced no results (no tunable profile ran)")
        metadata = one_metadata(metas)
        entries = {k: v for i in per_workload[w_idx] for k, v in op_results[i][1].items()}
        data = cache_file_bytes(metadata, entries)
        for rank in w.ranks:
            rank_bytes[rank] = data
    return rank_bytes, metadata, selection
