"""The tuning half of ``warm --targets`` (``fleet.py``): the merged calls dealt to one pool, and
each target committed from the calls' saved results the moment its own buckets are done."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from autotune_cache.autotuner.rankfile import cache_file_bytes
from autotune_cache.errors import FiAutotuneError, Interrupted
from autotune_cache.tune.commit import commit_plan
from autotune_cache.tune.dispatch import Tasks, pool_for, run_workers
from autotune_cache.tune.machine import Machine
from autotune_cache.tune.pool import WorkerPool
from autotune_cache.tune.quality import QualitySettings
from autotune_cache.tune.supervise import Phase
from autotune_cache.tune.work import profile_cost, skeleton_of, work_queue
from autotune_cache.tune.workdir import merged_results, one_metadata, read_slot_records


#: How a fleet deals its work. ``targets`` (the default): target by target in the file's order, so
#: the first targets complete, and are committed and pushed, while the rest is still tuning.
#: ``longest``: the costliest (call, bucket) first across the whole fleet, whichever target wants
#: it (longest processing time first, against an idle tail). Measured on 1 and 2 H200s with the
#: 7-target batch of benchmarks/fleet.py, it is no faster (29.5 s vs 29.1 s on 2 GPUs): the loss
#: there is the workers' start-up, not the tail - so the order with the earliest pushes stays.
DEALS = ("longest", "targets")


class FleetRun:
    """One fleet's tuning: ``items`` (fleet.FleetItem, already merged) over the distinct calls
    ``ops``, each saved in its own work dir ``dirs[g]`` (``done[g]``: its buckets saved before)."""

    #: Prefix of each call's work-dir files (``tune.w<worker>.json`` / ``.done``).
    PREFIX = "tune"

    def __init__(self, items: list, ops: list[dict], dirs: list[Path], done: list[set[int]], force: bool, gpus: int,
                 on_committed: Callable | None, deal: str = "targets"):
        if deal not in DEALS:
            raise ValueError(f"deal {deal!r}: one of {', '.join(DEALS)}")
        self.items, self.ops, self.dirs, self.done = items, ops, dirs, done
        self.force, self.gpus, self.on_committed, self.deal = force, gpus, on_committed, deal
        self.remaining = {id(item): {(g, b) for g, bs in item.needs.items() for b in bs if b not in done[g]}
                          for item in items}

    def already(self) -> int:
        """Profiles an earlier run saved."""
        return sum(len(self.done[g] & set(op["buckets"])) * len(op["custom_ops"]) for g, op in enumerate(self.ops))

    def queue(self) -> list[tuple[int, int]]:
        """The (call, bucket) items in the order they are dealt (``DEALS``)."""
        if self.deal == "longest":
            items = work_queue(self.ops, self.done)
            return sorted(items, key=lambda gb: -profile_cost(self.ops[gb[0]], gb[1]))  # stable: ties keep op order
        queue: list[tuple[int, int]] = []
        queued: set[tuple[int, int]] = set()
        for item in self.items:
            mine = work_queue(self.ops, [set(op["buckets"]) - item.needs.get(g, set()) | self.done[g]
                                         for g, op in enumerate(self.ops)])
            for gb in mine:
                if gb not in queued:
                    queued.add(gb)
                    queue.append(gb)
        return queue

    def commit(self, item) -> None:
        try:
            self._commit_item(item)
            item.status = "written"
        except FiAutotuneError as e:
            item.status, item.message = "failed", str(e)
        if self.on_committed:
            try:
                self.on_committed(item)
            except FiAutotuneError as e:  # what comes after the write (convert, push) fails alone
                item.message = f"written, then: {e}"

    def on_done(self, ev: dict) -> list:
        """The commits a finished (call, bucket) makes ready (run once the workers have saved)."""
        g, b = map(int, ev["item"].split())
        ready = []
        for item in self.items:
            left = self.remaining[id(item)]
            if (g, b) in left:
                left.discard((g, b))
                if not left and item.status == "pending":
                    item.status = "committing"
                    ready.append(lambda item=item: self.commit(item))
        return ready

    def tune(self, pool: WorkerPool | None, machine: Machine, progress, distinct: int) -> list[dict]:
        """Deal the queue to the pool, committing each target as it completes; the workers' events."""
        queue = self.queue()
        already = self.already()
        with pool_for(machine, self.gpus, pool) as p:
            try:
                for item in self.items:  # nothing left to tune for it (an earlier run saved it all)
                    if not self.remaining[id(item)]:
                        self.commit(item)
                tasks = Tasks(skeleton_of(self.items[0].plan), True, lambda w: [
                    {"op": op, "out": str(self.dirs[g] / f"{self.PREFIX}.w{w}.json"),
                     "done": str(self.dirs[g] / f"{self.PREFIX}.w{w}.done")} for g, op in enumerate(self.ops)],
                    lambda w: self.dirs[0] / f"task.fleet.w{w}.json")
                phases = [Phase("tuning", lambda: [f"{g} {b}" for g, b in queue], distinct, already)]
                events = run_workers(p, tasks, min(len(p.procs), len(queue)), phases, progress, on_done=self.on_done,
                                     skip_if_idle=True)
            except Interrupted:
                raise Interrupted(f"interrupted: {self._written()} of {len(self.items)} targets were written; the "
                                  "finished buckets of the rest are kept and a rerun resumes from them") from None
            except FiAutotuneError as e:
                raise FiAutotuneError(str(e).replace("; nothing was written", "")
                                      + f"; {self._written()} of {len(self.items)} targets were written before it") from None
        for item in self.items:  # workers save at exit: whatever completed last is committed now
            if item.status in ("pending", "committing") and not self.remaining[id(item)]:
                self.commit(item)
        return events

    def _written(self) -> int:
        return sum(i.status == "written" for i in self.items)

    def _commit_item(self, item) -> None:
        """One target's rank files from the calls' saved results - exactly its own buckets' keys."""
        merged: dict[int, tuple[dict, dict]] = {}
        records: dict[int, dict] = {}
        rank_bytes: dict[str, bytes] = {}
        metadata: dict = {}
        for w_idx, workload in enumerate(item.plan.workloads):
            metas, entries = [], {}
            for g, op in item.local[w_idx]:
                if g not in merged:
                    merged[g] = merged_results(self.dirs[g], self.PREFIX)
                    records[g] = read_slot_records(self.dirs[g], self.PREFIX)
                meta, tuned = merged[g]
                if tuned:
                    metas.append(meta)
                for b in op["buckets"]:
                    recs = records[g].get(b)
                    if recs is None:
                        raise FiAutotuneError(f"{item.name}: no saved result for {op['id']} at {b} tokens")
                    for rec in recs:
                        if rec.key in tuned:
                            entries[rec.key] = tuned[rec.key]
            if not metas:
                raise FiAutotuneError(f"{item.name}: tuning produced no results (no tunable profile ran)")
            metadata = one_metadata(metas)
            data = cache_file_bytes(metadata, entries)
            for rank in workload.ranks:
                rank_bytes[rank] = data
        stats = {"profiles": item.profiles, "gpus": self.gpus, "quality": QualitySettings().mode,
                 "fleet_targets": len(self.items)}
        extra = {"selection": {"settings": QualitySettings().to_dict()}, "fleet": {"target": item.name}}
        commit_plan(item.plan, rank_bytes, metadata, stats, extra, self.force)
