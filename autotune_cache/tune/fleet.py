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
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from autotune_cache.errors import FiAutotuneError, Interrupted
from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tune.quality import QualitySettings
from autotune_cache.autotuner.rankfile import cache_file_bytes
from autotune_cache.tree.scan import scan_entry
from autotune_cache.tree.status import EntryStatus
from autotune_cache.engines.vllm.planner import other_config_refusal
from autotune_cache.tune.warm import (GpuInfo, Phase, WorkerPool, _lock_work_dir, _one_metadata, _supervise, _timings, commit_plan,
                   distinct_ops, merge_cache_files, other_gpu_refusal, preflight, read_done, read_slot_records,
                   work_queue)

#: Prefix of each call's work-dir files (``tune.w<worker>.json`` / ``.done``).
PREFIX = "tune"


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
    needs: dict = field(default_factory=dict)  # global op -> set of buckets
    local: list = field(default_factory=list)  # per workload: [(global op, local op dict)]

    @property
    def profiles(self) -> int:
        ops, _ = distinct_ops(self.plan)
        return sum(len(op["buckets"]) * len(op["custom_ops"]) for op in ops)

    def to_dict(self) -> dict:
        return {"name": self.name, "id": str(self.plan.entry_id), "key_dir": str(self.plan.key_dir),
                "status": self.status, "message": self.message, "profiles": self.profiles,
                "layouts": list(self.layouts)}


@dataclass
class FleetWork:
    """Every target's ops merged: distinct calls, each with the union of the buckets wanted."""

    ops: list[dict]
    signatures: list[str]

    def profiles(self) -> int:
        return sum(len(op["buckets"]) * len(op["custom_ops"]) for op in self.ops)


def merge_work(items: list[FleetItem]) -> FleetWork:
    index: dict[str, int] = {}
    ops: list[dict] = []
    for item in items:
        item.needs, item.local = {}, []
        _, per_workload = distinct_ops(item.plan)
        local_ops, _ = distinct_ops(item.plan)
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


def op_work_dir(plan: TuningPlan, signature: str) -> Path:
    """One call's work dir, shared by every target (and every later run) that tunes it."""
    from platformdirs import user_cache_dir

    digest = hashlib.sha256(signature.encode()).hexdigest()[:16]
    return Path(user_cache_dir("fi-autotune")) / "work" / "calls" / f"{plan.flashinfer_version}-{plan.resolution.arch}-{digest}"


@dataclass
class FleetResult:
    items: list[FleetItem]
    profiles_total: int  # what the targets would tune one by one
    profiles_distinct: int  # after merging identical calls
    profiles_tuned: int  # this run (the rest were saved by an earlier one)
    gpus: int
    timings: dict

    def to_dict(self) -> dict:
        return {"targets": [i.to_dict() for i in self.items], "profiles_total": self.profiles_total,
                "profiles_distinct": self.profiles_distinct, "profiles_tuned": self.profiles_tuned,
                "gpus": self.gpus, "timings": self.timings}


def warm_fleet(
    items: list[FleetItem],
    *,
    gpus: int | None,
    info: GpuInfo,
    pool: WorkerPool | None = None,
    force: bool = False,
    progress: Callable | None = None,
    on_committed: Callable[[FleetItem], None] | None = None,
) -> FleetResult:
    t_start = time.perf_counter()
    todo: list[FleetItem] = []
    n = None
    for item in items:
        plan = item.plan
        if not plan.autotunes:
            item.status, item.message = "nothing-to-tune", f"{plan.engine} would not autotune this configuration"
            continue
        n = preflight(plan, info, gpus, pool)
        if plan.key_dir.is_dir() and not force:
            existing = scan_entry(plan.layout_obj, plan.key_dir, plan.entry_id)
            why = (other_gpu_refusal(existing.gpu, info.names[0], plan.resolution.arch)
                   or other_config_refusal(existing.manifest, plan))
            if why:
                item.status, item.message = "failed", why
                continue
            if existing.status == EntryStatus.COMPLETE:
                item.status, item.message = "complete", "already complete (--force tunes it again)"
                continue
        todo.append(item)
    work = merge_work(todo)
    total = sum(i.profiles for i in todo)
    if not todo:
        return FleetResult(items, 0, 0, 0, 0, {})
    dirs = [op_work_dir(todo[0].plan, sig) for sig in work.signatures]
    locks = []
    try:
        for d in dirs:
            locks.append(_lock_work_dir(d))
            d.mkdir(parents=True, exist_ok=True)
            if force:
                for p in d.iterdir():
                    p.unlink()
        done = [read_done(d, PREFIX) for d in dirs]
        distinct = work.profiles()
        already = sum(len(done[g] & set(op["buckets"])) * len(op["custom_ops"]) for g, op in enumerate(work.ops))
        remaining = {id(item): {(g, b) for g, bs in item.needs.items() for b in bs if b not in done[g]} for item in todo}
        # Deal the work target by target (in the list's order): the first targets complete, and
        # are committed, while the rest is still tuning.
        queue: list[tuple[int, int]] = []
        queued: set[tuple[int, int]] = set()
        for item in todo:
            mine = [(g, b) for g, b in work_queue(work.ops, [set(op["buckets"]) - item.needs.get(g, set()) | done[g]
                                                               for g, op in enumerate(work.ops)])]
            for gb in mine:
                if gb not in queued:
                    queued.add(gb)
                    queue.append(gb)
        own_pool = pool is None
        if pool is None:
            pool = WorkerPool(n)

        def commit(item: FleetItem) -> None:
            try:
                _commit_item(item, work, dirs, force, len(todo), n)
                item.status = "written"
            except FiAutotuneError as e:
                item.status, item.message = "failed", str(e)
            if on_committed:
                try:
                    on_committed(item)
                except FiAutotuneError as e:  # what comes after the write (convert, push) fails alone
                    item.message = f"written, then: {e}"

        def on_done(ev: dict) -> list:
            g, b = map(int, ev["item"].split())
            ready = []
            for item in todo:
                left = remaining[id(item)]
                if (g, b) in left:
                    left.discard((g, b))
                    if not left and item.status == "pending":
                        item.status = "committing"
                        ready.append(lambda item=item: commit(item))
            return ready

        try:
            for item in todo:  # nothing left to tune for it (an earlier run saved it all)
                if not remaining[id(item)]:
                    commit(item)
            active = min(len(pool.procs), len(queue))
            for w in range(len(pool.procs)):
                if w >= active:
                    pool.send(w, "")
                    continue
                task = {"skeleton": _skeleton(todo[0].plan), "record_slots": True, "ops": [
                    {"op": op, "out": str(dirs[g] / f"{PREFIX}.w{w}.json"), "done": str(dirs[g] / f"{PREFIX}.w{w}.done")}
                    for g, op in enumerate(work.ops)]}
                tpath = dirs[0] / f"task.fleet.w{w}.json"
                tpath.write_text(json.dumps(task))
                pool.send(w, str(tpath))
            workers = [(w, pool.procs[w]) for w in range(active)]
            events = _supervise(workers, [Phase("tuning", lambda: [f"{g} {b}" for g, b in queue], distinct, already)],
                                progress, pool, on_done=on_done) if workers else []
        except Interrupted:
            written = sum(i.status == "written" for i in todo)
            raise Interrupted(f"interrupted: {written} of {len(todo)} targets were written; the finished buckets of "
                              "the rest are kept and a rerun resumes from them") from None
        except FiAutotuneError as e:
            written = sum(i.status == "written" for i in todo)
            raise FiAutotuneError(str(e).replace("; nothing was written", "")
                                  + f"; {written} of {len(todo)} targets were written before it") from None
        finally:
            if own_pool:
                pool.close()
        for item in todo:  # workers save at exit: whatever completed last is committed now
            if item.status in ("pending", "committing") and not remaining[id(item)]:
                commit(item)
        t_end = time.perf_counter()
        timings = _timings(events, t_start, t_end) if events else {}
        timings["wall_s"] = round(t_end - t_start, 3)
        if all(i.status == "written" for i in todo):
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
        return FleetResult(items, total, distinct, distinct - already, n or 0, timings)
    finally:
        for fd in locks:
            os.close(fd)


def _skeleton(plan: TuningPlan) -> dict:
    """The worker's model skeleton (the LM head it stubs; any target's will do: it is never run
    for real, only its stub)."""
    res = plan.resolution
    return {"hidden": plan.spec.hidden_size, "vocab": plan.spec.vocab_size, "tp": res.flags.tp,
            "dp": res.attn_dp_size, "dtype": res.dtype}


def _commit_item(item: FleetItem, work: FleetWork, dirs: list[Path], force: bool, targets: int, gpus: int) -> None:
    """One target's rank files from the calls' saved results - exactly its own buckets' keys."""
    merged: dict[int, tuple[dict, dict]] = {}
    records: dict[int, dict] = {}
    rank_bytes: dict[str, bytes] = {}
    metadata: dict = {}
    for w_idx, workload in enumerate(item.plan.workloads):
        metas, entries = [], {}
        for g, op in item.local[w_idx]:
            if g not in merged:
                files = sorted(dirs[g].glob(f"{PREFIX}.w*.json"))
                merged[g] = merge_cache_files(files) if files else ({}, {})
                records[g] = read_slot_records(dirs[g], PREFIX)
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
        metadata = _one_metadata(metas)
        data = cache_file_bytes(metadata, entries)
        for rank in workload.ranks:
            rank_bytes[rank] = data
    stats = {"profiles": item.profiles, "gpus": gpus, "quality": QualitySettings().mode,
             "fleet_targets": targets}
    extra = {"selection": {"settings": QualitySettings().to_dict()}, "fleet": {"target": item.name}}
    commit_plan(item.plan, rank_bytes, metadata, stats, extra, force)
