"""``warm --targets``: many targets, one pool of workers, identical work tuned once.

A team's image carries the caches of every (model, topology, backend) it may serve. Tuning
them one ``warm`` at a time pays the worker start-up (Python, torch, FlashInfer, CUDA context:
about 4.5 s) per target, and tunes the same call again wherever two targets share it (the MoE
experts of TP8 and TP8 with DP-attention 8 are one call; so are the GEMMs of one model under two
served paths). Here every target's plan is merged into one work list of distinct *calls*
(FlashInfer API + arguments, whichever target it came from) and the union of their buckets, dealt
to one pool for the whole list. A target is committed - and handed to ``on_committed`` (the CLI
converts and pushes there) - as soon as the last bucket it needs is done and saved; the others go
on. Each call's results live in its own work dir, so a rerun (or another target list sharing the
call) resumes from what is saved.

Which keys a bucket produced is recorded as the worker tunes it (``worker.SlotRecorder``), so
each target's rank files hold exactly its own buckets, byte for byte what a ``warm`` of that
target alone would write from the same measurements.

``warm`` of one target is a fleet of one (``warm_fleet(alone=True)``): the same admission (the
existing-entry rule), work queue, dispatch, supervision and commit, in the target's own work dir
(``workdir.work_dir``), with careful tuning, and committed once the workers have finished.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tune.session.commit import Existing, existing_entry
from autotune_cache.tune.session.fleetrun import FleetRun
from autotune_cache.tune.workers.gpus import GpuInfo
from autotune_cache.tune.workers.machine import THIS_MACHINE, Machine, preflight
from autotune_cache.tune.workers.pool import WorkerPool
from autotune_cache.tune.careful.quality import QualitySettings
from autotune_cache.tune.session.timings import worker_timings
from autotune_cache.tune.session.work import distinct_ops, profiles_of
from autotune_cache.tune.careful.workdir import lock_work_dir, op_work_dir, open_work_dir, work_dir


def call_signature(op: dict) -> str:
    """What makes two planned ops one call: the FlashInfer API and its arguments (shapes, dtypes,
    scalars). Buckets, ids and layer counts are the targets' own."""
    return json.dumps({k: op[k] for k in ("api", "custom_ops", "kwargs")}, sort_keys=True)


@dataclass
class FleetItem:
    """One target in a fleet run."""

    name: str
    plan: TuningPlan
    layouts: tuple[str, ...] = ("sglang",)
    status: str = "pending"  # pending | written | complete | nothing-to-tune | failed
    message: str = ""
    #: Whose entry it is: the targets file's target (None: the command line's), and which of its
    #: workers (``target``, or a speculative ``draft``): the same fields as plan's and check's.
    target: str | None = None
    worker: str = "target"
    needs: dict = field(default_factory=dict)  # global op -> set of buckets
    local: list = field(default_factory=list)  # per workload: [(global op, local op dict)]
    existing: Existing | None = None  # the entry found at its path (admit)
    #: What its commit wrote (``FleetRun.commit_alone``): ``commit.commit_plan``'s answer, the
    #: rank files' names and, careful, the selection summary.
    written: str = ""
    written_at: float | None = None  # epoch seconds its commit finished (a fleet's time line)
    rank_files: list = field(default_factory=list)
    selection: dict = field(default_factory=dict)

    @property
    def profiles(self) -> int:
        ops, _ = distinct_ops(self.plan)
        return profiles_of(ops)

    def to_dict(self) -> dict:
        return {"name": self.name, "target": self.target, "worker": self.worker, "id": self.plan.id_str,
                "key_dir": str(self.plan.key_dir),
                "status": self.status, "message": self.message, "profiles": self.profiles,
                "layouts": list(self.layouts)}


@dataclass
class FleetWork:
    """Every target's ops merged: distinct calls, each with the union of the buckets wanted."""

    ops: list[dict]
    signatures: list[str]

    def profiles(self) -> int:
        return profiles_of(self.ops)


def merge_work(items: list[FleetItem]) -> FleetWork:
    index: dict[str, int] = {}
    ops: list[dict] = []
    for item in items:
        item.needs, item.local = {}, []
        local_ops, per_workload = distinct_ops(item.plan)
        for w_idx in range(len(item.plan.workloads)):
            row = []
            for i in per_workload[w_idx]:
                op = local_ops[i]
                sig = call_signature(op)
                if sig not in index:
                    index[sig] = len(ops)
                    ops.append({**op, "buckets": []})
                g = index[sig]
                merged = set(ops[g]["buckets"]) | set(op["buckets"])
                ops[g]["buckets"] = sorted(merged)
                item.needs.setdefault(g, set()).update(op["buckets"])
                row.append((g, op))
            item.local.append(row)
    return FleetWork(ops, list(index))


@dataclass
class FleetResult:
    items: list[FleetItem]
    profiles_total: int  # what the targets would tune one by one
    profiles_distinct: int  # after merging identical calls
    profiles_tuned: int  # this run (the rest were saved by an earlier one)
    gpus: int
    timings: dict

    def to_dict(self) -> dict:
        return {"workers": [i.to_dict() for i in self.items], "profiles_total": self.profiles_total,
                "profiles_distinct": self.profiles_distinct, "profiles_tuned": self.profiles_tuned,
                "gpus": self.gpus, "timings": self.timings}


def admit(items: list[FleetItem], info: GpuInfo, gpus: int | None, pool: WorkerPool | None,
          force: bool) -> tuple[list[FleetItem], int | None]:
    """The items to tune, and the worker count: the others are marked (nothing to tune, refused,
    already complete; ``item.existing`` is what was found) - one rule for every warm."""
    todo: list[FleetItem] = []
    n = None
    for item in items:
        plan = item.plan
        if not plan.autotunes:
            item.status, item.message = "nothing-to-tune", f"{plan.engine} would not autotune this configuration"
            continue
        n = preflight(plan, info, gpus, pool)
        existing = item.existing = None if force else existing_entry(plan, info)
        if existing is not None and existing.refusal:
            item.status, item.message = "failed", existing.refusal
            continue
        if existing is not None and existing.complete:
            item.status, item.message = "complete", "already complete (--force tunes it again)"
            continue
        todo.append(item)
    return todo, n


def careful_settings(plan: TuningPlan, quality: QualitySettings | None) -> QualitySettings:
    """The run's settings; a careful race replays CUDA graphs up to the engine's decode batch
    (every attention-DP rank's, at a MoE) unless told otherwise."""
    quality = quality or QualitySettings()
    if quality.careful and not quality.graph_max_tokens:
        quality = dataclasses.replace(quality, graph_max_tokens=plan.resolution.decode_batch * plan.resolution.attn_dp_size)
    return quality


@contextmanager
def held_dirs(dirs: list[Path], force: bool) -> Iterator[None]:
    """The run's work dirs, locked (``workdir.lock_work_dir``) and opened for as long as it tunes."""
    locks = []
    try:
        for d in dict.fromkeys(dirs):
            locks.append(lock_work_dir(d))
            open_work_dir(d, force)
        yield
    finally:
        for fd in locks:
            os.close(fd)


def warm_fleet(
    items: list[FleetItem],
    *,
    gpus: int | None,
    info: GpuInfo,
    pool: WorkerPool | None = None,
    force: bool = False,
    progress: Callable | None = None,
    on_committed: Callable[[FleetItem], None] | None = None,
    machine: Machine = THIS_MACHINE,
    deal: str = "targets",
    quality: QualitySettings | None = None,
    alone: bool = False,
    started: tuple[float, float] | None = None,
    planned: float | None = None,
) -> FleetResult:
    """Tune every item's plan on one pool, identical calls once; each item committed (and handed
    to ``on_committed``) as soon as its own buckets are saved. ``alone``: one target (``warm``),
    tuned in its own work dir (``quality`` may be careful) and committed once the workers have
    finished, its manifest recording their timings (from ``started``: perf and epoch seconds; a
    fleet's time line adds ``planned``, the epoch its targets were planned, and when each target
    was written)."""
    t_start, epoch_start = started or (time.perf_counter(), time.time())
    todo, n = admit(items, info, gpus, pool, force)
    if not todo:
        return FleetResult(items, 0, 0, 0, 0, {})
    quality = careful_settings(todo[0].plan, quality)
    work = merge_work(todo)
    total = sum(i.profiles for i in todo)
    dirs = ([work_dir(todo[0].plan, quality)] * len(work.ops) if alone else
            [op_work_dir(todo[0].plan, sig) for sig in work.signatures])
    with held_dirs(dirs, force):
        run = FleetRun(todo, work.ops, dirs, None, force, n, on_committed, deal, quality=quality, shared=not alone)
        tuned = run.profiles() - run.already()
        events = run.tune(pool, machine, progress)
        t_end = time.perf_counter()
        timings = worker_timings(events, t_start, t_end, epoch_start) if events or alone else {}
        if alone:
            run.commit_alone(todo[0], {"profiles": run.profiles(), "profiles_tuned_this_run": tuned, "gpus": n,
                                       **{k: v for k, v in timings.items() if k not in ("timeline", "gpu_workers", "pool")}})
            timings["write_s"] = round(time.perf_counter() - t_end, 3)
            timings["timeline"].update(planned=epoch_start, written=time.time())
        elif timings:
            timings["timeline"].update({"planned": planned} if planned is not None else {})
            stamps = {i.name: round(i.written_at - epoch_start, 3) for i in todo if i.written_at is not None}
            if stamps:
                timings["timeline"]["written"] = epoch_start + max(stamps.values())
                timings["targets_written"] = stamps
        if timings:
            timings["timeline"]["started"] = epoch_start
            timings["pool"] = run.pool_source
        timings["wall_s"] = round(time.perf_counter() - t_start, 3) if alone else round(t_end - t_start, 3)
        if all(i.status == "written" for i in todo):
            for d in dict.fromkeys(dirs):
                shutil.rmtree(d, ignore_errors=True)
        return FleetResult(items, total, run.profiles(), tuned, n or 0, timings)
