"""The part every warm shares once its work is known: start (or reuse) the pool, hand each worker
its task file, deal the items and read the events (``supervise.py``). Every warm reaches it
through ``fleetrun.FleetRun`` (one target is a fleet of one)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from autotune_cache.tune.workers.machine import Machine
from autotune_cache.tune.workers.pool import WorkerPool
from autotune_cache.tune.workers.supervise import OnDone, Phase, supervise


@dataclass(frozen=True)
class Tasks:
    """What each worker reads before its first item (``worker.py``): the model skeleton, whether
    to record the slots each bucket stored (careful mode, fleets), and its task ops - where each
    op's results go - written to ``path(w)``."""

    skeleton: dict
    record_slots: bool
    ops: Callable[[int], list[dict]]
    path: Callable[[int], Path]


@contextmanager
def pool_for(machine: Machine, n: int, pool: WorkerPool | None) -> Iterator[WorkerPool]:
    """The caller's pool (started early, while it planned), else a new one closed at the end."""
    own = pool is None
    pool = pool or machine.start_pool(n)
    try:
        yield pool
    finally:
        if own:
            pool.close()


def run_workers(pool: WorkerPool, tasks: Tasks, active: int, phases: list[Phase], progress,
                on_done: OnDone | None = None, *, skip_if_idle: bool = False) -> list[dict]:
    """Give the first ``active`` workers their tasks (the rest an empty line: nothing to do, exit),
    then deal the phases to them; the workers' events. ``skip_if_idle``: no worker has work, so
    nothing is supervised at all."""
    for w in range(len(pool.procs)):
        if w >= active:
            pool.send(w, "")  # nothing for this one
            continue
        path = tasks.path(w)
        path.write_text(json.dumps({"skeleton": tasks.skeleton, "record_slots": tasks.record_slots, "ops": tasks.ops(w)}))
        pool.send(w, str(path))
    workers = [(w, pool.procs[w]) for w in range(active)]
    if skip_if_idle and not workers:
        return []
    return supervise(workers, phases, progress, pool, on_done=on_done)
