"""The tuning half of every ``warm`` (``fleet.py``): the merged calls of one or many targets dealt
to one pool, and each target committed from the calls' saved results.

A fleet (``warm --targets``, two engines' calls, a target and its draft) keeps each call's work
in a dir of its own, shared with every target list that tunes it (``shared``), and commits a
target the moment its own buckets are done. ``warm`` of one target is a fleet of one: its calls
are saved in the target's own work dir (every key there is its own), it may tune carefully
(``repeats`` tunes of each call, then races: ``careful.py``), and it commits once the workers
have finished, so its manifest records their timings."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from autotune_cache.autotuner.rankfile import cache_file_bytes
from autotune_cache.errors import FiAutotuneError, Interrupted
from autotune_cache.tune.careful.careful import RacePlan, plan_pair_races, plan_races, select_op
from autotune_cache.tune.session.commit import commit_plan
from autotune_cache.tune.workers.dispatch import Tasks, pool_for, run_workers
from autotune_cache.tune.workers.machine import Machine
from autotune_cache.tune.workers.pool import WorkerPool
from autotune_cache.tune.careful.quality import QualitySettings, selection_summary
from autotune_cache.tune.workers.supervise import Phase
from autotune_cache.tune.session.work import profile_cost, profiles_of, skeleton_of, work_queue
from autotune_cache.tune.careful.workdir import merged_results, one_metadata, read_done, read_slot_records, tune_prefix


#: How a fleet deals its work. ``targets`` (the default): target by target in the file's order, so
#: the first targets complete, and are committed and pushed, while the rest is still tuning.
#: ``longest``: the costliest (call, bucket) first across the whole fleet, whichever target wants
#: it (longest processing time first, against an idle tail). Measured on 1 and 2 H200s with the
#: 7-target batch of benchmarks/fleet.py, it is no faster (29.5 s vs 29.1 s on 2 GPUs): the loss
#: there is the workers' start-up, not the tail - so the order with the earliest pushes stays.
DEALS = ("longest", "targets")


class FleetRun:
    """One run's tuning: ``items`` (fleet.FleetItem, already merged) over the distinct calls
    ``ops``, each saved in its work dir ``dirs[g]``. Each call is tuned ``quality.tunes`` times
    (quick: once); ``tunes[t]`` is the (call, repeat) of task op ``t``, and ``done[t]`` the
    buckets it saved before (None: read from the dirs). ``shared``: per-call dirs of a fleet."""

    #: Prefix of each call's work-dir files in a shared dir (``tune.w<worker>.json`` / ``.done``).
    PREFIX = "tune"

    def __init__(self, items: list, ops: list[dict], dirs: list[Path], done: list[set[int]] | None, force: bool,
                 gpus: int, on_committed: Callable | None, deal: str = "targets", *,
                 quality: QualitySettings | None = None, shared: bool = True):
        if deal not in DEALS:
            raise ValueError(f"deal {deal!r}: one of {', '.join(DEALS)}")
        self.quality = quality or QualitySettings()
        if self.quality.careful and (shared or len(items) != 1):
            raise ValueError("careful tuning is one target in its own work dir")
        self.items, self.ops, self.dirs, self.shared = items, ops, dirs, shared
        self.force, self.gpus, self.on_committed, self.deal = force, gpus, on_committed, deal
        self.tunes = [(g, r if self.quality.careful else None) for g in range(len(ops)) for r in range(self.quality.tunes)]
        self.tune_ops = [ops[g] for g, _ in self.tunes]
        self.done = done if done is not None else [read_done(dirs[g], self.prefix(g, r)) for g, r in self.tunes]
        self.remaining = {id(item): {(t, b) for t, (g, _) in enumerate(self.tunes) for b in item.needs.get(g, ())
                                     if b not in self.done[t]} for item in items}
        self.races: list[RacePlan] = []
        self.pairs: list[RacePlan] = []  # careful's pair round: each slot's fastest crossed and raced again
        #: Whose workers tuned: served (``fi-autotune workers``) or started by this run, and why not served.
        self.pool_source: dict = {}

    def prefix(self, g: int, r: int | None) -> str:
        """Work-dir file prefix of tune ``r`` of call ``g`` (a shared dir holds one call, tuned once)."""
        return self.PREFIX if self.shared else tune_prefix(g, r)

    def profiles(self) -> int:
        """Profiles the run tunes in all (every repeat of every distinct call)."""
        return profiles_of(self.tune_ops)

    def already(self) -> int:
        """Profiles an earlier run saved."""
        return sum(len(self.done[t] & set(op["buckets"])) * len(op["custom_ops"]) for t, op in enumerate(self.tune_ops))

    def queue(self) -> list[tuple[int, int]]:
        """The (task op, bucket) items in the order they are dealt (``DEALS``)."""
        if self.deal == "longest":
            items = work_queue(self.tune_ops, self.done)
            return sorted(items, key=lambda tb: -profile_cost(self.tune_ops[tb[0]], tb[1]))  # stable: ties keep op order
        queue: list[tuple[int, int]] = []
        queued: set[tuple[int, int]] = set()
        for item in self.items:
            mine = work_queue(self.tune_ops, [set(self.ops[g]["buckets"]) - item.needs.get(g, set()) | self.done[t]
                                              for t, (g, _) in enumerate(self.tunes)])
            for tb in mine:
                if tb not in queued:
                    queued.add(tb)
                    queue.append(tb)
        return queue

    def commit(self, item) -> None:
        try:
            self._commit_item(item)
            item.status, item.written_at = "written", time.time()
        except FiAutotuneError as e:
            item.status, item.message = "failed", str(e)
        if self.on_committed:
            try:
                self.on_committed(item)
            except FiAutotuneError as e:  # what comes after the write (convert, push) fails alone
                item.message = f"written, then: {e}"

    def on_done(self, ev: dict) -> list:
        """The commits a finished (task op, bucket) makes ready (run once the workers have saved)."""
        t, b = map(int, ev["item"].split())
        ready = []
        for item in self.items:
            left = self.remaining[id(item)]
            if (t, b) in left:
                left.discard((t, b))
                if not left and item.status == "pending":
                    item.status = "committing"
                    ready.append(lambda item=item: self.commit(item))
        return ready

    def _phases(self, queue: list[tuple[int, int]]) -> list[Phase]:
        """Tuning the queue; careful mode then races what the tunes disagree on (``careful.py``)."""
        phases = [Phase("tuning", lambda: [f"{t} {b}" for t, b in queue], self.profiles(), self.already())]
        if self.quality.careful:
            def race_phase() -> list[str]:
                workloads = [[g for g, _ in row] for row in self.items[0].local]  # careful: one target
                self.races.extend(plan_races(self.dirs[0], self.ops, self.quality, workloads))
                return [f"race {r.spec}" for r in self.races if not r.result.exists() and r.spec is not None]

            def pair_phase() -> list[str]:  # needs every first race's result: a phase of its own
                self.pairs.extend(plan_pair_races(self.dirs[0], self.races, self.quality))
                return [f"race {r.spec}" for r in self.pairs if not r.result.exists()]
            phases += [Phase("racing", race_phase), Phase("pairing", pair_phase)]
        return phases

    def _tasks(self) -> Tasks:
        """Each worker's task ops, one per (call, repeat): its results in the call's dir. The
        repeats of a call share its layer (``"layer"``); a fleet records which keys each bucket
        stored, so a target takes only its own (careful mode records them for the races)."""
        def task_ops(w: int) -> list[dict]:
            return [{"op": self.ops[g], "layer": g, "out": str(self.dirs[g] / f"{self.prefix(g, r)}.w{w}.json"),
                     "done": str(self.dirs[g] / f"{self.prefix(g, r)}.w{w}.done")} for g, r in self.tunes]
        name = "task.fleet.w{}.json" if self.shared else "task.w{}.json"
        return Tasks(skeleton_of(self.items[0].plan), self.shared or self.quality.careful, task_ops,
                     lambda w: self.dirs[0] / name.format(w))

    def tune(self, pool: WorkerPool | None, machine: Machine, progress) -> list[dict]:
        """Deal the work to the pool; the workers' events. A fleet commits each target as it
        completes; one target (not ``shared``) is committed by the caller (``commit_alone``)."""
        queue = self.queue()
        phases, tasks = self._phases(queue), self._tasks()
        with pool_for(machine, self.gpus, pool) as p:
            self.pool_source = {"source": p.source, **({"note": p.note} if p.note else {})}
            active = len(p.procs) if self.quality.careful else min(len(p.procs), len(queue))
            if not self.shared:  # nothing left to tune still shows its progress line, as it always has
                return run_workers(p, tasks, active, phases, progress)
            try:
                for item in self.items:  # nothing left to tune for it (an earlier run saved it all)
                    if not self.remaining[id(item)]:
                        self.commit(item)
                events = run_workers(p, tasks, active, phases, progress, on_done=self.on_done, skip_if_idle=True)
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

    def commit_alone(self, item, stats: dict) -> None:
        """One target's entry (the run's only one), its manifest carrying ``stats`` (the run's
        timings); a refusal raises, saying where the tuned buckets are kept."""
        rank_bytes, metadata, selection = self.rank_files(item)
        careful = self.quality.careful
        stats = {**stats, "quality": self.quality.mode, **({"selection": selection_summary(selection)} if careful else {})}
        extra = {"selection": {"settings": self.quality.to_dict(), **({"ops": selection} if careful else {})}}
        try:
            item.written = commit_plan(item.plan, rank_bytes, metadata, stats, extra, self.force)
        except FiAutotuneError as e:
            raise FiAutotuneError(f"{e} (the tuned buckets are kept in {self.dirs[0]})") from None
        item.status = "written"
        item.rank_files = item.plan.layout_obj.written_files(list(rank_bytes))
        item.selection = selection_summary(selection) if careful else {}

    def _commit_item(self, item) -> None:
        """A fleet's target, committed as soon as its buckets are saved."""
        rank_bytes, metadata, _ = self.rank_files(item)
        stats = {"profiles": item.profiles, "gpus": self.gpus, "quality": QualitySettings().mode,
                 "fleet_targets": len(self.items)}
        extra = {"selection": {"settings": QualitySettings().to_dict()}, "fleet": {"target": item.name}}
        commit_plan(item.plan, rank_bytes, metadata, stats, extra, self.force)

    def _call_results(self, g: int) -> tuple[dict, dict, dict | None, bool]:
        """One call's saved (``_metadata``, entries), what careful mode chose per bucket, and
        whether it ran at all (a fleet counts a call that stored entries, one target any file)."""
        if self.quality.careful:
            meta, entries, chosen = select_op(self.dirs[g], g, self.ops[g], self.quality,
                                              [r for r in self.races if r.op == g], [r for r in self.pairs if r.op == g])
            return meta, entries, chosen, bool(entries or meta)
        meta, tuned = merged_results(self.dirs[g], self.prefix(g, None))
        return meta, tuned, None, bool(tuned or (meta and not self.shared))

    def _own_keys(self, item, g: int, op: dict, tuned: dict, records: dict) -> dict:
        """The entries of ``item``'s own buckets of call ``g`` (its local ``op``): a shared dir may
        hold other targets' buckets, so a target takes the keys its buckets stored; a target's
        own dir is all its own."""
        if not self.shared:
            return tuned
        if g not in records:
            records[g] = read_slot_records(self.dirs[g], self.PREFIX)
        entries = {}
        for b in op["buckets"]:
            recs = records[g].get(b)
            if recs is None:
                raise FiAutotuneError(f"{item.name}: no saved result for {op['id']} at {b} tokens")
            for rec in recs:
                if rec.key in tuned:
                    entries[rec.key] = tuned[rec.key]
        return entries

    def rank_files(self, item) -> tuple[dict[str, bytes], dict, dict]:
        """One target's rank files (bytes per rank) from the calls' saved results, its
        ``_metadata`` and, careful, what was chosen per call."""
        results: dict[int, tuple] = {}
        records: dict[int, dict] = {}
        rank_bytes: dict[str, bytes] = {}
        metadata: dict = {}
        selection: dict = {}
        for w_idx, workload in enumerate(item.plan.workloads):
            metas, entries = [], {}
            for g, op in item.local[w_idx]:
                if g not in results:
                    results[g] = self._call_results(g)
                meta, tuned, chosen, ran = results[g]
                if chosen is not None:
                    selection[self.ops[g]["id"]] = chosen
                if ran:
                    metas.append(meta)
                entries.update(self._own_keys(item, g, op, tuned, records))
            if not metas:
                who = f"{item.name}: " if self.shared else ""
                raise FiAutotuneError(f"{who}tuning produced no results (no tunable profile ran)")
            metadata = one_metadata(metas)
            data = cache_file_bytes(metadata, entries)
            for rank in workload.ranks:
                rank_bytes[rank] = data
        return rank_bytes, metadata, selection
