"""``warm``: run a plan on however many GPUs this machine has, and commit the rank files.

The (op, bucket) profiles of every distinct op are spread over one worker process per GPU
(``worker.py``, bound with CUDA_VISIBLE_DEVICES). Each worker tunes its buckets with
``autotune(True, tuning_buckets=(b,))`` - a profile tuned that way is stored under its own
value, exactly where a default engine pass looks it up - into per-op cache files in a work dir.
When every worker has finished, the files are merged (refusing mixed ``_metadata``: different
GPU models or software), one rank file is built per workload and copied byte for byte to each of
its ranks, and the whole entry is committed in one atomic step. Nothing reaches the tree before
that; an interrupted run keeps its finished buckets in the work dir and resumes from them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from autotune_cache.errors import FiAutotuneError, Interrupted, UsageError
from autotune_cache.engines.sglang.layout import arch_from_capability
from autotune_cache.tree.manifest import Manifest, utc_now_iso
from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tune.quality import (QualitySettings, Selection, SlotRecord, apply_selection, candidates, choose,
                      selection_summary)
from autotune_cache.autotuner.rankfile import METADATA_KEY, RESERVED_KEYS, cache_file_bytes
from autotune_cache.tree.scan import scan_entry
from autotune_cache.tree.status import EntryStatus
from autotune_cache.engines.vllm.planner import other_config_refusal
from autotune_cache.tune.writer import commit_entry, other_gpu_refusal, replace_policy


@dataclass(frozen=True)
class GpuInfo:
    count: int
    arch: str | None
    names: tuple[str, ...]


def _gpus_from_smi() -> GpuInfo:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return GpuInfo(0, None, ())
    rows = [r.rsplit(",", 1) for r in out.stdout.strip().splitlines() if "," in r] if out.returncode == 0 else []
    if not rows:
        return GpuInfo(0, None, ())
    major, _, minor = rows[0][1].strip().partition(".")
    return GpuInfo(len(rows), arch_from_capability(int(major), int(minor or 0)), tuple(r[0].strip() for r in rows))


#: Test hooks (like FI_AUTOTUNE_CRASH_AT): a GPU-less CI runs the real commands end to end with
#: ``FI_AUTOTUNE_TEST_GPUS="2xNVIDIA H200@sm90"`` and a stand-in worker script in
#: ``FI_AUTOTUNE_TEST_WORKER`` (tests/_fake_worker.py) - nothing else differs.
TEST_GPUS_ENV, TEST_WORKER_ENV = "FI_AUTOTUNE_TEST_GPUS", "FI_AUTOTUNE_TEST_WORKER"


def detect_gpus() -> GpuInfo:
    """Through NVML (or nvidia-smi): no CUDA context in the parent, so workers own their devices."""
    fake = os.environ.get(TEST_GPUS_ENV)
    if fake:
        count, _, rest = fake.partition("x")
        name, _, arch = rest.partition("@")
        return GpuInfo(int(count), arch, (name,) * int(count))
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no nvidia-ml-py or no driver
        return _gpus_from_smi()
    try:
        n = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        names = tuple(str(pynvml.nvmlDeviceGetName(h)) for h in handles)
        arch = None
        if handles:
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handles[0])
            arch = arch_from_capability(major, minor)
        return GpuInfo(n, arch, names)
    finally:
        pynvml.nvmlShutdown()


def detect_gpu_uuids() -> list[str]:
    """This machine's GPU UUIDs in index order, as SGLang writes them (no "GPU-", lowercase)."""
    from autotune_cache.plan.topology import normalize_gpu_uuid

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [normalize_gpu_uuid(line) for line in out.stdout.split() if line.strip()]


def work_dir(plan: TuningPlan, quality: QualitySettings | None = None) -> Path:
    from platformdirs import user_cache_dir

    what: object = {"workloads": [w.to_dict() for w in plan.workloads], "root": str(plan.cache_root)}
    if quality is not None and quality.careful:  # careful tunes never mix with quick ones
        what = {**what, "quality": quality.to_dict()}
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]
    return Path(user_cache_dir("fi-autotune")) / "work" / f"{plan.flashinfer_version}-{plan.resolution.arch}-{plan.key}-{digest}"


def distinct_ops(plan: TuningPlan) -> tuple[list[dict], list[list[int]]]:
    """Ops deduplicated across workloads (same call, same keys), and each workload's op indices,
    as the JSON the worker reads: this is where the typed plan crosses the process boundary."""
    uids: dict[str, int] = {}
    ops: list[dict] = []
    per_workload: list[list[int]] = []
    for w in plan.workloads:
        idx = []
        for op in (o.to_dict() for o in w.ops):
            sig = json.dumps({k: v for k, v in op.items() if k not in ("layers", "id")}, sort_keys=True)
            if sig not in uids:
                uids[sig] = len(ops)
                ops.append(op)
            idx.append(uids[sig])
        per_workload.append(idx)
    return ops, per_workload


def work_queue(ops: list[dict], done: list[set[int]]) -> list[tuple[int, int]]:
    """The (op, bucket) items still to tune, in the order they are dealt: op by op (a worker
    switches ops, and so saves, as rarely as possible), largest bucket first within an op (the
    longest profiles start early, the short ones fill the gaps at the end)."""
    return [(i, b) for i, op in enumerate(ops) for b in sorted((b for b in op["buckets"] if b not in done[i]), reverse=True)]


def _lock_work_dir(wd: Path) -> int:
    """Hold the work dir for this run: two warms of one target at once would take each other's
    finished buckets for their own (and delete the dir under each other). The lock file sits
    beside the dir, which is removed once the entry is written."""
    import fcntl

    from autotune_cache.errors import EntryLocked

    wd.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(wd.parent / f"{wd.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise EntryLocked(f"another warm is tuning this target into the same cache root right now (work dir {wd}); "
                          "wait for it, or give this one another --cache-dir") from None
    return fd


def tune_prefix(op: int, tune: int | None) -> str:
    """Work-dir file prefix of one tune of an op (quick mode: the op's only tune)."""
    return f"op{op}" if tune is None else f"op{op}.r{tune}"


def _done_lines(wd: Path, prefix: str):
    for p in sorted(wd.glob(f"{prefix}.w*.done")):
        for line in p.read_text().splitlines():
            bucket, _, rest = line.strip().partition(" ")
            if bucket.isdigit():
                yield int(bucket), rest


def read_done(wd: Path, prefix: "str | int") -> set[int]:
    """Buckets a tune has saved (a done line is written only after the op's file holds them)."""
    return {b for b, _ in _done_lines(wd, prefix if isinstance(prefix, str) else tune_prefix(prefix, None))}


def read_slot_records(wd: Path, prefix: str) -> dict[int, list[SlotRecord]]:
    """What a careful tune stored for each bucket (``quality.SlotRecord``), from its done lines."""
    out: dict[int, list[SlotRecord]] = {}
    for b, rest in _done_lines(wd, prefix):
        try:
            out[b] = [SlotRecord.from_dict(d) for d in json.loads(rest)] if rest else []
        except (ValueError, KeyError, TypeError):
            continue  # a torn line: that bucket offers no candidate
    return out


def merge_cache_files(paths: list[Path]) -> tuple[dict, dict]:
    """Union of tuned entries; the files must agree on ``_metadata`` (one GPU model, one image)."""
    meta: dict | None = None
    entries: dict = {}
    for p in paths:
        obj = json.loads(p.read_text())
        m = obj.get(METADATA_KEY) or {}
        if meta is None:
            meta = m
        elif m != meta:
            diff = {k: (meta.get(k), m.get(k)) for k in set(meta) | set(m) if meta.get(k) != m.get(k)}
            raise FiAutotuneError(f"refusing to merge tuning results from different environments: {diff}")
        for k, v in obj.items():
            if k not in RESERVED_KEYS:
                entries[k] = v
    return meta or {}, entries


def _one_metadata(metas: list[dict]) -> dict:
    """The one ``_metadata`` every file of a workload carries (one GPU model, one image)."""
    first = metas[0]
    for m in metas[1:]:
        if m != first:
            diff = {k: (first.get(k), m.get(k)) for k in set(first) | set(m) if first.get(k) != m.get(k)}
            raise FiAutotuneError(f"refusing to merge tuning results from different environments: {diff}")
    return first


@dataclass(frozen=True)
class RacePlan:
    """One (op, bucket) of a careful run: what its tunes stored and the candidates to race.
    ``spec`` is None when there is nothing to race (one candidate, or no tune recorded it)."""

    op: int
    bucket: int
    records: tuple  # per tune: list[SlotRecord] | None
    candidates: tuple
    spec: Path | None
    result: Path


def _tune_entries(wd: Path, op: int, tune: int) -> tuple[dict, dict]:
    files = sorted(wd.glob(f"{tune_prefix(op, tune)}.w*.json"))
    return merge_cache_files(files) if files else ({}, {})


def plan_races(wd: Path, ops: list[dict], quality: QualitySettings) -> list[RacePlan]:
    """Every (op, bucket)'s candidates from its tunes' saved results, and a race spec file for
    each that has more than one (a race already run - its result file exists - is kept)."""
    out = []
    for i, op in enumerate(ops):
        per_tune = [_tune_entries(wd, i, r) for r in range(quality.tunes)]
        metas = [m for m, e in per_tune if e]
        records = [read_slot_records(wd, tune_prefix(i, r)) for r in range(quality.tunes)]
        for b in sorted(op["buckets"]):
            recs = tuple(rec.get(b) for rec in records)
            cands = tuple(candidates(list(recs), [e for _, e in per_tune]))
            spec, result = wd / f"race.op{i}.b{b}.json", wd / f"race.op{i}.b{b}.result.json"
            if len(cands) < 2 or not metas:
                out.append(RacePlan(i, b, recs, cands, None, result))
                continue
            if not result.exists():
                spec.write_text(json.dumps({
                    "layer": i, "op": op, "bucket": b, "assignments": [c.entries() for c in cands],
                    "metadata": metas[0], "settings": quality.race_settings(b), "result": str(result),
                    "seed": 1000 * i + b}))
            out.append(RacePlan(i, b, recs, cands, spec, result))
    return out


def select_op(wd: Path, i: int, op: dict, quality: QualitySettings, races: list[RacePlan]) -> tuple[dict, dict, dict]:
    """The entries written for one op in careful mode: the first tune's, with each bucket's
    slots replaced by its race winner (the default unless a tuned tactic beat it by the
    threshold); and what was chosen and why, per bucket, for the manifest."""
    per_tune = [_tune_entries(wd, i, r) for r in range(quality.tunes)]
    metas = [m for m, e in per_tune if e]
    meta = _one_metadata(metas) if metas else {}
    entries: dict = {}
    for _, e in reversed(per_tune):  # the first tune's entries win where no race decides
        entries.update(e)
    chosen: dict = {}
    for rp in races:
        cands = list(rp.candidates)
        if not cands:
            continue
        if rp.spec is None:  # one candidate (every tune chose the default): nothing to race
            sel = Selection(0, (), None, None, False, "every tune chose it; nothing to race", len(cands[0].sources))
            record = sel.to_dict(cands, quality.tunes) | {"raced": False}
        else:
            try:
                result = json.loads(rp.result.read_text())
                medians = [float("inf") if m is None else float(m) for m in result["medians_ms"]]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise FiAutotuneError(f"race result of {op['id']} at {rp.bucket} tokens unreadable ({e}); rerun warm") from None
            sel = choose(cands, medians, quality.threshold)
            record = sel.to_dict(cands, quality.tunes) | {
                "raced": True, "graph": result.get("graph"), "runs": max(result.get("runs") or [0]),
                "relative_iqr": [None if x is None else round(x, 4) for x in result.get("relative_iqr") or []],
                **({"errors": result["errors"]} if any(result.get("errors") or []) else {})}
        entries = apply_selection(entries, list(rp.records), cands[sel.winner])
        chosen[str(rp.bucket)] = record
    return meta, entries, chosen


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
    selection: dict = field(default_factory=dict)  # careful mode: warm.selection_summary

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class WorkerPool:
    """One worker process per GPU, started before the plan exists so that their torch and
    flashinfer imports and CUDA contexts overlap the parent's planning; each then gets its task
    file and its work items on stdin."""

    def __init__(self, n: int, argv: list[str] | None = None):
        test_worker = os.environ.get(TEST_WORKER_ENV)
        argv = argv or ([sys.executable, test_worker] if test_worker else [sys.executable, "-m", "autotune_cache.tune.worker"])
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = [d.strip() for d in visible.split(",")] if visible else [str(i) for i in range(n)]
        self.procs: list[subprocess.Popen] = []
        self.logs = []
        for w in range(n):
            log = tempfile.TemporaryFile(mode="w+")  # FlashInfer logs and progress bars: never a full pipe
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": devices[w], "PYTHONUNBUFFERED": "1"}
            self.procs.append(subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, env=env, text=True, start_new_session=True))
            self.logs.append(log)

    def send(self, w: int, line: str | None) -> None:
        """One line to worker ``w`` (its task path, then work items); None closes its stdin."""
        stdin = self.procs[w].stdin
        try:
            if line is None:
                stdin.close()
            else:
                stdin.write(f"{line}\n")
                stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # it died already; _supervise reports it

    def log_text(self, w: int) -> str:
        self.logs[w].flush()
        self.logs[w].seek(0)
        return self.logs[w].read()

    def close(self) -> None:
        for p in self.procs:
            if p.stdin and not p.stdin.closed:
                try:
                    p.stdin.close()
                except OSError:
                    pass
            _kill(p)
        for log in self.logs:
            log.close()


def preflight(plan: TuningPlan, info: GpuInfo, gpus: int | None, pool: "WorkerPool | None") -> int:
    """Usage errors before any work: the plan's GPUs are these, FlashInfer imports. The worker count."""
    arch = plan.resolution.arch
    if plan.resolution.moe_runner_backend == "flashinfer_megamoe" and not plan.resolution.topology.gpu_uuids:
        raise UsageError("flashinfer_megamoe names each rank file after its GPU: pass --gpu-uuids (the serving "
                         "machine's UUIDs in tp-rank order, or auto when it is this machine)")
    if info.count == 0:
        raise UsageError("no CUDA GPU found: warm needs one (run `fi-autotune plan` to see the plan without a GPU)")
    if info.arch != arch:
        raise UsageError(f"the plan targets {arch} but this machine's GPUs are {info.arch} ({info.names[0]})")
    if len(set(info.names)) > 1 and gpus != 1:
        raise UsageError(f"mixed GPU models ({', '.join(sorted(set(info.names)))}): tuned tactics would differ; use --gpus 1")
    n = info.count if gpus is None else gpus
    if n < 1 or n > info.count:
        raise UsageError(f"--gpus {n}: this machine has {info.count} GPU(s)")
    if pool is not None and len(pool.procs) != n:
        raise ValueError(f"worker pool has {len(pool.procs)} workers, not {n}")
    import importlib.util

    if importlib.util.find_spec("flashinfer") is None:
        raise UsageError("flashinfer is not importable in this Python: install flashinfer-python")
    return n


def existing_verdict(layout, plan: TuningPlan, info: GpuInfo, quality: QualitySettings | None) -> "WarmResult | None":
    """What is already at the plan's path, without --force: another GPU model's entry is refused,
    a complete one is kept (None: tune)."""
    existing = scan_entry(layout, plan.key_dir, plan.entry_id)
    why = other_gpu_refusal(existing.gpu, info.names[0], plan.resolution.arch) or other_config_refusal(existing.manifest, plan)
    if why:
        raise FiAutotuneError(f"{plan.entry_id} {why}")
    if existing.status == EntryStatus.COMPLETE:
        was = existing.manifest.stats.get("quality") if existing.manifest else None
        how = f"in {was} mode" if was else "by the engine or an older warm"
        again = "carefully " if quality is not None and quality.careful and was != "careful" else ""
        return WarmResult("complete", str(plan.key_dir), message=f"already complete, tuned {how} (use --force to tune "
                          f"it again {again}and replace it)")
    return None


def commit_plan(plan: TuningPlan, rank_bytes: dict[str, bytes], metadata: dict, stats: dict, extra: dict,
                force: bool) -> None:
    """The manifest for ``plan`` and its rank files, committed in one step (refusals raise)."""
    layout = plan.layout_obj
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


def warm(
    plan: TuningPlan,
    *,
    gpus: int | None = None,
    force: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
    gpu_info: GpuInfo | None = None,
    pool: "WorkerPool | None" = None,
    quality: QualitySettings | None = None,
) -> WarmResult:
    t_start, epoch_start = time.perf_counter(), time.time()
    layout = plan.layout_obj
    kdir = plan.key_dir
    if not plan.autotunes:
        return WarmResult("nothing-to-tune", str(kdir),
                          message=f"{plan.engine} would not autotune this configuration: nothing to write")

    info = gpu_info or detect_gpus()
    n = preflight(plan, info, gpus, pool)
    if kdir.is_dir() and not force:
        done = existing_verdict(layout, plan, info, quality)
        if done is not None:
            return done

    ops, per_workload = distinct_ops(plan)
    res = plan.resolution
    quality = quality or QualitySettings()
    if quality.careful and not quality.graph_max_tokens:
        # The engine replays CUDA graphs up to its decode batch (every attention-DP rank's, at a MoE)
        quality = dataclasses.replace(quality, graph_max_tokens=res.decode_batch * res.attn_dp_size)
    wd = work_dir(plan, quality)
    lock = _lock_work_dir(wd)
    try:
        wd.mkdir(parents=True, exist_ok=True)
        if force:
            for p in wd.iterdir():
                p.unlink()
        # One task op per tune of each distinct op: quick mode has one tune, careful mode ``repeats``.
        tunes = [(i, r if quality.careful else None) for i in range(len(ops)) for r in range(quality.tunes)]
        done = [read_done(wd, tune_prefix(i, r)) for i, r in tunes]
        tune_ops = [ops[i] for i, _ in tunes]
        total = sum(len(op["buckets"]) * len(op["custom_ops"]) for op in tune_ops)
        already = sum(len(d & set(op["buckets"])) * len(op["custom_ops"]) for op, d in zip(tune_ops, done))
        queue = work_queue(tune_ops, done)
        skeleton = {"hidden": plan.spec.hidden_size, "vocab": plan.spec.vocab_size, "tp": res.flags.tp,
                    "dp": res.attn_dp_size, "dtype": res.dtype}
        races: list[RacePlan] = []

        def race_phase() -> list[str]:
            races.extend(plan_races(wd, ops, quality))
            return [f"race {r.spec}" for r in races if not r.result.exists() and r.spec is not None]

        phases = [Phase("tuning", lambda: [f"{v} {b}" for v, b in queue], total, already)]
        if quality.careful:
            phases.append(Phase("racing", race_phase))

        own_pool = pool is None
        if pool is None:
            pool = WorkerPool(n)
        try:
            active = len(pool.procs) if quality.careful else min(len(pool.procs), len(queue))
            for w in range(len(pool.procs)):
                if w >= active:
                    pool.send(w, "")  # nothing for this one
                    continue
                task = {"skeleton": skeleton, "record_slots": quality.careful, "ops": [
                    {"op": ops[i], "layer": i, "out": str(wd / f"{tune_prefix(i, r)}.w{w}.json"),
                     "done": str(wd / f"{tune_prefix(i, r)}.w{w}.done")} for i, r in tunes]}
                tpath = wd / f"task.w{w}.json"
                tpath.write_text(json.dumps(task))
                pool.send(w, str(tpath))
            workers = [(w, pool.procs[w]) for w in range(active)]
            events = _supervise(workers, phases, progress, pool)
        finally:
            if own_pool:
                pool.close()
        t_tuned = time.perf_counter()

        # The entries of every op (careful: the raced winners), merged per workload, committed at once.
        selection: dict = {}
        op_results = []
        for i, op in enumerate(ops):
            if quality.careful:
                meta, entries, chosen = select_op(wd, i, op, quality, [r for r in races if r.op == i])
                selection[op["id"]] = chosen
            else:
                files = sorted(wd.glob(f"{tune_prefix(i, None)}.w*.json"))
                meta, entries = merge_cache_files(files) if files else ({}, {})
            op_results.append((meta, entries))
        rank_bytes: dict[str, bytes] = {}
        metadata: dict = {}
        for w_idx, w in enumerate(plan.workloads):
            metas = [op_results[i][0] for i in per_workload[w_idx] if op_results[i][1] or op_results[i][0]]
            if not metas:
                raise FiAutotuneError("tuning produced no results (no tunable profile ran)")
            metadata = _one_metadata(metas)
            entries = {k: v for i in per_workload[w_idx] for k, v in op_results[i][1].items()}
            data = cache_file_bytes(metadata, entries)
            for rank in w.ranks:
                rank_bytes[rank] = data
        timings = _timings(events, t_start, t_tuned)
        stats = {"profiles": total, "profiles_tuned_this_run": total - already, "gpus": n,
                 **{k: v for k, v in timings.items() if k != "timeline"}, "quality": quality.mode,
                 **({"selection": selection_summary(selection)} if quality.careful else {})}
        extra = {"selection": {"settings": quality.to_dict(), **({"ops": selection} if quality.careful else {})}}
        try:
            commit_plan(plan, rank_bytes, metadata, stats, extra, force)
        except FiAutotuneError as e:
            raise FiAutotuneError(f"{e} (the tuned buckets are kept in {wd})") from None
        timings["write_s"] = round(time.perf_counter() - t_tuned, 3)
        timings["wall_s"] = round(time.perf_counter() - t_start, 3)
        timings["timeline"].update(planned=epoch_start, written=time.time())
        shutil.rmtree(wd, ignore_errors=True)
        return WarmResult("written", str(kdir), [str(kdir / r) for r in sorted(rank_bytes)], total - already, total, n, timings,
                          selection=selection_summary(selection) if quality.careful else {})
    finally:
        os.close(lock)


def _timings(events: list[dict], t_start: float, t_tuned: float) -> dict:
    ready = {e["worker"]: e for e in events if e["event"] == "ready"}
    cuda = {e["worker"]: e for e in events if e["event"] == "cuda"}
    imported = {e["worker"]: e for e in events if e["event"] == "imported"}
    fin = [e for e in events if e["event"] == "finished"]
    starts = [e["t"] for e in events if e["event"] == "start" and "t" in e]
    startup = [imported[w]["import_s"] + (cuda[w]["cuda_s"] if w in cuda else 0.0) + ready[w]["setup_s"]
               for w in ready if w in imported]
    return {
        "startup_import_s": round(max(startup, default=0.0), 3),
        "jit_s": round(max((e.get("jit_s", 0.0) for e in fin), default=0.0), 3),
        "tuning_s": round(max((e["tune_s"] for e in fin), default=0.0), 3),
        "tuning_gpu_s": round(sum(e["tune_s"] for e in fin), 3),
        **({"racing_s": round(max(e.get("race_s") or 0.0 for e in fin), 3),
            "racing_gpu_s": round(sum(e.get("race_s") or 0.0 for e in fin), 3)}
           if any(e.get("race_s") for e in fin) else {}),
        "workers_wall_s": round(t_tuned - t_start, 3),
        "peak_gpu_mem_bytes": max((e["peak_mem"] for e in fin), default=0),
        **({"floor_gpu_s": round(sum(e["floor_s"] for e in fin), 3)} if fin and all(e.get("floor_s") is not None for e in fin) else {}),
        # Epoch seconds of each phase's last (or first) worker: a time line benchmarks can lay
        # next to the command's own start and end.
        "timeline": {k: v for k, v in {
            "workers_imported": max((e["t"] for e in imported.values() if "t" in e), default=None),
            "workers_cuda": max((e["t"] for e in cuda.values() if "t" in e), default=None),
            "workers_ready": max((e["t"] for e in ready.values() if "t" in e), default=None),
            "first_profile": min(starts, default=None),
            "workers_finished": max((e["t"] for e in fin if "t" in e), default=None),
        }.items() if v is not None},
    }


@dataclass
class Phase:
    """One round of work items dealt to the pool; the next phase starts once every item of this
    one is done and every worker has saved (``flush``): racing needs all tunes' results."""

    name: str  # tuning | racing
    items: Callable[[], list[str]]  # built when the phase starts
    total: int = 0  # progress units (tuning: profiles; racing: races)
    already: int = 0


def _supervise(workers, phases: list[Phase], progress, pool: "WorkerPool",
               on_done: Callable[[dict], list[Callable[[], None]]] | None = None) -> list[dict]:
    """Deal each phase's items to the workers one at a time (the next goes to whichever finishes
    first) and read their events; on any failure or signal stop them all and raise.

    ``on_done(event)`` may return callbacks to run once every worker has saved what it holds
    (a *flush round*: ``fleet`` commits a target as soon as its last item is done). Workers
    answer ``flush`` in order, so each ``flushed`` belongs to the oldest round still waiting on
    that worker."""
    sel = selectors.DefaultSelector()
    # Raw reads split into lines here: a buffered readline() could keep a second event in its
    # buffer while select() waits on an fd with nothing left to read (and the worker waits on us).
    buffers: dict[int, bytes] = {}
    for w, proc in workers:
        sel.register(proc.stdout.fileno(), selectors.EVENT_READ, (w, proc))
        buffers[w] = b""
    live = [w for w, _ in workers]
    events: list[dict] = []
    current: dict[int, tuple] = {}
    state = {"phase": 0, "done": phases[0].already, "total": phases[0].total, "barrier": -1}
    busy: set[int] = set()
    closed: set[int] = set()
    rounds: list[dict] = []  # flush rounds: {"waiting": set of workers, "then": [callbacks]}
    failure: str | None = None
    stop = {"sig": None}

    def _on_signal(signum, frame):  # noqa: ARG001
        stop["sig"] = signum

    pending = list(reversed(phases[0].items()))  # pop() deals from the front

    def last_phase() -> bool:
        return state["phase"] == len(phases) - 1

    def deal(w: int) -> None:
        if pending:
            pool.send(w, pending.pop())
            busy.add(w)
        elif last_phase() and not rounds and w not in closed:
            pool.send(w, None)
            closed.add(w)

    def flush_then(callbacks: list[Callable[[], None]]) -> None:
        waiting = {w for w in live if w not in closed}
        for w in waiting:
            pool.send(w, "flush")
        rounds.append({"waiting": waiting, "then": list(callbacks)})
        settle()

    def settle() -> None:
        while rounds and not rounds[0]["waiting"]:
            for cb in rounds.pop(0)["then"]:
                cb()

    def next_phase() -> None:
        state["phase"] += 1
        phase = phases[state["phase"]]
        pending.extend(reversed(phase.items()))
        state["done"], state["total"] = phase.already, phase.total or len(pending)
        if progress:
            progress(state["done"], state["total"], f"{phase.name} {len(pending)} items", phase.name)
        for w in live:
            deal(w)
        advance()

    def advance() -> None:
        # Between phases every worker saves what it holds first: the next phase's items are
        # built from the files (racing needs every tune's results).
        if pending or busy:
            return
        if not last_phase():
            if state["barrier"] != state["phase"]:
                state["barrier"] = state["phase"]
                flush_then([next_phase])
            return
        if not rounds:
            for w in live:
                deal(w)

    def _on_event(ev: dict, w: int) -> str | None:
        ev["worker"] = w
        events.append(ev)
        name = phases[state["phase"]].name
        if ev["event"] == "start":
            current[w] = (ev["op"], ev["bucket"])
        elif ev["event"] in ("done", "raced"):
            busy.discard(w)
            state["done"] += ev.get("profiles", 1)
            if progress:
                what = (f"{ev['op']} @ {ev['bucket']} tokens" if ev["event"] == "done"
                        else Path(ev["spec"]).stem.replace("race.", ""))
                progress(state["done"], state["total"], f"{what} (GPU {w})", name)
            callbacks = on_done(ev) if on_done and ev["event"] == "done" else []
            if callbacks:
                flush_then(callbacks)
            deal(w)
            advance()
        elif ev["event"] == "flushed":
            for r in rounds:
                if w in r["waiting"]:
                    r["waiting"].discard(w)
                    break
            settle()
            advance()
        elif ev["event"] == "error":
            op, bucket = ev.get("op"), ev.get("bucket")
            where = (f" while tuning {op} at {bucket} tokens" if bucket is not None else f" while loading {op}") if op else ""
            return f"worker on GPU {w} failed{where}: {ev['message']}"
        return None

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if progress:
            progress(state["done"], state["total"], "starting workers", phases[0].name)
        for w, _ in workers:
            deal(w)
        advance()
        open_streams = len(workers)
        while open_streams and failure is None and stop["sig"] is None:
            for key, _ in sel.select(timeout=0.5):
                w, proc = key.data
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    open_streams -= 1
                    if w not in closed and failure is None:
                        failure = _exit_failure(pool, w, proc, current)
                    continue
                *lines, buffers[w] = (buffers[w] + chunk).split(b"\n")
                for line in lines:
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    failure = _on_event(ev, w) or failure
        for w, proc in workers:
            if failure is not None or stop["sig"] is not None:
                _kill(proc)
            rc = proc.wait()
            if rc != 0 and failure is None and stop["sig"] is None:
                failure = _exit_failure(pool, w, proc, current)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        sel.close()
    if stop["sig"] is not None:
        raise Interrupted("interrupted: nothing was written; finished buckets are kept and a rerun resumes from them")
    if failure:
        raise FiAutotuneError(failure + "; nothing was written")
    return events


def _exit_failure(pool: "WorkerPool", w: int, proc: subprocess.Popen, current: dict) -> str:
    """Why worker ``w`` stopped before it was told to: its exit status and last log line."""
    try:
        rc = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        rc = "no exit status (its output closed)"
    err = [ln for ln in pool.log_text(w).splitlines() if ln.strip()]
    op, bucket = current.get(w, (None, None))
    where = f" while tuning {op} at {bucket} tokens" if op else ""
    return f"worker on GPU {w} exited with {rc}{where}: {err[-1] if err else 'no message'}"


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
