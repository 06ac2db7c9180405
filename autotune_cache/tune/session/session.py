"""The library side of the ``warm`` command: detect the GPUs (the workers already starting when
``--gpus`` says how many), plan for them, tune, then write v2 and push - typed in, a result out.
The command only builds the requests, calls one of these and prints the result: the plans are
made here (``fleetplan.plan_request``), under the root the command's ``Rooting`` names.

``run_warm`` is one target; ``run_fleet`` is many on one pool (``warm --targets``, both engines'
calls of ``--layout sglang,vllm``, a speculative target and its draft).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from autotune_cache.errors import FiAutotuneError
from autotune_cache.plan.request import TuneRequest
from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tree.roots import Rooting
from autotune_cache.tree.store.store import Store
from autotune_cache.tune.session.fleet import FleetItem, FleetResult, warm_fleet
from autotune_cache.tune.session.fleetplan import Fleet, FleetOrder, plan_order, plan_request
from autotune_cache.tune.workers.machine import THIS_MACHINE, Machine
from autotune_cache.tune.workers.pool import WorkerPool
from autotune_cache.tune.session.publish import Published, derived, publish, push_entry, write_derived, written_entry
from autotune_cache.tune.careful.quality import QualitySettings
from autotune_cache.tune.session.warm import WarmResult, warm


@dataclass(frozen=True)
class WarmOptions:
    """How to run: ``gpus`` (None: all), ``force``, the ``store`` to push to, the machine, and
    the command that shows the plan without a GPU (for the no-GPU message)."""

    gpus: int | None = None
    force: bool = False
    store: Store | None = None
    machine: Machine = THIS_MACHINE
    plan_hint: str = "`fi-autotune plan`"
    deal: str = "targets"  # a fleet's order: fleetrun.DEALS


class _EarlyPool:
    """With --gpus N the workers start at once: their torch imports and CUDA contexts overlap
    the GPU detection and the planning. Otherwise they start once the GPUs are counted."""

    def __init__(self, opts: WarmOptions):
        self.machine = opts.machine
        self.pool: WorkerPool | None = opts.machine.start_pool(opts.gpus) if opts.gpus is not None else None

    def start(self, count: int) -> WorkerPool:
        self.pool = self.pool or self.machine.start_pool(count)
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


@dataclass
class WarmRun:
    plan: TuningPlan
    result: WarmResult
    published: Published


def bind_environment(plans: list[TuningPlan], machine: Machine) -> list[TuningPlan]:
    """Plans into FlashInfer's managed store bound to the directory this machine's GPU environment
    names (read once, only if one needs it); the others as they are."""
    if all(p.bound for p in plans):
        return plans
    metadata = machine.environment()
    return [p if p.bound else p.for_environment(metadata) for p in plans]


def run_warm(request: TuneRequest, rooting: Rooting, opts: WarmOptions, *, layouts: tuple[str, ...] = ("sglang",),
             quality: QualitySettings | None = None, progress=None) -> WarmRun:
    """One target: ``request`` planned under ``rooting`` once the GPUs are known (their arch where
    the request names none); written (or found complete), it is also written into the other
    layouts ``layouts`` lists, and pushed to ``opts.store``."""
    started = time.perf_counter(), time.time()
    early = _EarlyPool(opts)
    try:
        info = opts.machine.usable_gpus(opts.gpus, opts.plan_hint)
        pool = early.start(info.count)
        plan = bind_environment([plan_request(request, rooting, info.arch, opts.machine)], opts.machine)[0]
        result = warm(plan, gpus=opts.gpus, force=opts.force, progress=progress, gpu_info=info, pool=pool,
                      quality=quality, machine=opts.machine, started=started)
    finally:
        early.close()
    done = result.status in ("written", "complete")
    return WarmRun(plan, result, publish(plan, layouts, opts.store) if done else Published())


@dataclass
class FleetRunResult:
    result: FleetResult
    pushed: list = field(default_factory=list)  # (target, pushed or already there)
    failed_after_writing: list = field(default_factory=list)  # (target, why)
    converted: dict = field(default_factory=dict)  # target -> V2Result.to_dict()
    fleet: Fleet | None = None  # the targets file planned (its errors, its shard); None: one command's entries

    @property
    def failed(self) -> bool:
        return any(i.status == "failed" for i in self.result.items) or bool(self.failed_after_writing)


class _Publisher:
    """Each written target converted at once and pushed beside the tuning (uploads one at a
    time, in order); a failure there fails that target alone. Each entry is scanned once."""

    def __init__(self, store: Store | None):
        self.store = store
        self.pushed: list = []
        self.failed: list = []
        self.converted: dict = {}
        self.lock = threading.Lock()
        self.pushes: list[threading.Thread] = []

    def _push(self, item: FleetItem, entry) -> None:
        try:
            r = push_entry(self.store, item.plan, entry)
            with self.lock:
                self.pushed.append((item.name, bool(r.pushed)))
        except FiAutotuneError as e:
            with self.lock:
                self.failed.append((item.name, str(e)))

    def _convert(self, item: FleetItem, entry) -> None:
        for name in derived(item.plan, item.layouts):
            try:
                self.converted[item.name] = write_derived(entry, name).to_dict()
            except FiAutotuneError as e:
                self.failed.append((item.name, f"{name}: {e}"))

    def publish(self, item: FleetItem, *, beside: bool) -> None:
        """``beside``: push in a thread while the tuning goes on (after the previous push)."""
        if self.store is None and not derived(item.plan, item.layouts):
            return
        entry = written_entry(item.plan)
        self._convert(item, entry)
        if self.store is None:
            return
        if not beside:
            self._push(item, entry)
            return
        previous = self.pushes[-1] if self.pushes else None
        t = threading.Thread(target=lambda: (previous and previous.join(), self._push(item, entry)), daemon=True)
        self.pushes.append(t)
        t.start()

    def join(self) -> None:
        for t in self.pushes:
            t.join()


def run_fleet(order: FleetOrder, opts: WarmOptions, *, progress=None,
              on_planned: Callable[[list[FleetItem], Fleet | None], None] | None = None,
              on_committed: Callable[[FleetItem], None] | None = None) -> FleetRunResult:
    """Many targets on one pool: ``order`` planned once the GPUs are known (``fleetplan.plan_order``)
    and handed to ``on_planned`` (the command prints there: the targets that failed, the shard);
    each item is handed to ``on_committed`` as soon as it is written or has failed, then converted
    to the layouts it lists and pushed; complete ones already there are too."""
    started = time.perf_counter(), time.time()
    early = _EarlyPool(opts)
    publisher = _Publisher(opts.store)

    def committed(item: FleetItem) -> None:
        if on_committed:
            on_committed(item)
        if item.status == "written":
            publisher.publish(item, beside=True)

    try:
        info = opts.machine.usable_gpus(opts.gpus, opts.plan_hint)
        # The workers start (Python, torch, FlashInfer, CUDA context: ~4.5 s) while the targets
        # are planned, not after.
        pool = early.start(info.count)
        items, fleet = plan_order(order, info.arch, opts.machine)
        if on_planned:
            on_planned(items, fleet)
        for item, plan in zip(items, bind_environment([i.plan for i in items], opts.machine)):
            item.plan = plan
        result = warm_fleet(items, gpus=opts.gpus, info=info, pool=pool, force=opts.force, progress=progress,
                            on_committed=committed, machine=opts.machine, deal=opts.deal, started=started,
                            planned=time.time())
    finally:
        early.close()
    for item in result.items:  # complete ones already there: convert and push them too
        if item.status == "complete":
            publisher.publish(item, beside=False)
    publisher.join()
    return FleetRunResult(result, publisher.pushed, publisher.failed, publisher.converted, fleet)
