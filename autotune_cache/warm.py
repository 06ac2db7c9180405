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

from .errors import FiAutotuneError, Interrupted, UsageError
from .layouts import default_layout
from .layouts.sglang import arch_from_capability
from .manifest import Manifest, utc_now_iso
from .plan import TuningPlan
from .rankfile import METADATA_KEY, RESERVED_KEYS, cache_file_bytes
from .scan import scan_entry
from .status import EntryStatus
from .writer import commit_entry, other_gpu_refusal, replace_policy


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


def detect_gpus() -> GpuInfo:
    """Through NVML (or nvidia-smi): no CUDA context in the parent, so workers own their devices."""
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
    from .topology import normalize_gpu_uuid

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [normalize_gpu_uuid(line) for line in out.stdout.split() if line.strip()]


def work_dir(plan: TuningPlan) -> Path:
    from platformdirs import user_cache_dir

    workloads = [w.to_dict() for w in plan.workloads]
    digest = hashlib.sha256(json.dumps(workloads, sort_keys=True).encode()).hexdigest()[:12]
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


def read_done(wd: Path, uid: int) -> set[int]:
    out: set[int] = set()
    for p in wd.glob(f"op{uid}.w*.done"):
        for line in p.read_text().split():
            if line.isdigit():
                out.add(int(line))
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

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class WorkerPool:
    """One worker process per GPU, started before the plan exists so that their torch and
    flashinfer imports and CUDA contexts overlap the parent's planning; each then gets its task
    file and its work items on stdin."""

    def __init__(self, n: int, argv: list[str] | None = None):
        argv = argv or [sys.executable, "-m", "autotune_cache.worker"]
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


def warm(
    plan: TuningPlan,
    *,
    gpus: int | None = None,
    force: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
    gpu_info: GpuInfo | None = None,
    pool: "WorkerPool | None" = None,
) -> WarmResult:
    t_start, epoch_start = time.perf_counter(), time.time()
    layout = default_layout()
    root, eid, kdir, arch = plan.cache_root, plan.entry_id, plan.key_dir, plan.resolution.arch
    if not plan.autotunes:
        return WarmResult("nothing-to-tune", str(kdir), message="SGLang would not autotune this configuration: nothing to write")

    if plan.resolution.moe_runner_backend == "flashinfer_megamoe" and not plan.resolution.topology.gpu_uuids:
        raise UsageError("flashinfer_megamoe names each rank file after its GPU: pass --gpu-uuids (the serving "
                         "machine's UUIDs in tp-rank order, or auto when it is this machine)")
    info = gpu_info or detect_gpus()
    if info.count == 0:
        raise UsageError("no CUDA GPU found: warm needs one (run `fi-autotune plan` to see the plan without a GPU)")
    if info.arch != arch:
        raise UsageError(f"the plan targets {arch} but this machine's GPUs are {info.arch} ({info.names[0]})")
    if len(set(info.names)) > 1 and gpus != 1:
        raise UsageError(f"mixed GPU models ({', '.join(sorted(set(info.names)))}): tuned tactics would differ; use --gpus 1")
    if kdir.is_dir() and not force:
        existing = scan_entry(layout, kdir, eid)
        why = other_gpu_refusal(existing.gpu, info.names[0], arch)
        if why:
            raise FiAutotuneError(f"{eid} {why}")
        if existing.status == EntryStatus.COMPLETE:
            return WarmResult("complete", str(kdir), message="already complete (use --force to tune again)")
    n = info.count if gpus is None else gpus
    if n < 1 or n > info.count:
        raise UsageError(f"--gpus {n}: this machine has {info.count} GPU(s)")
    if pool is not None and len(pool.procs) != n:
        raise ValueError(f"worker pool has {len(pool.procs)} workers, not {n}")
    import importlib.util

    if importlib.util.find_spec("flashinfer") is None:
        raise UsageError("flashinfer is not importable in this Python: install flashinfer-python")

    ops, per_workload = distinct_ops(plan)
    wd = work_dir(plan)
    wd.mkdir(parents=True, exist_ok=True)
    if force:
        for p in wd.iterdir():
            p.unlink()
    done = [read_done(wd, i) for i in range(len(ops))]
    total = sum(len(op["buckets"]) * len(op["custom_ops"]) for op in ops)
    already = sum(len(d & set(op["buckets"])) * len(op["custom_ops"]) for op, d in zip(ops, done))
    queue = work_queue(ops, done)
    res = plan.resolution
    skeleton = {"hidden": plan.spec.hidden_size, "vocab": plan.spec.vocab_size, "tp": res.flags.tp,
                "dp": res.attn_dp_size, "dtype": res.dtype}

    own_pool = pool is None
    if pool is None:
        pool = WorkerPool(n)
    try:
        active = min(len(pool.procs), len(queue))
        for w in range(len(pool.procs)):
            if w >= active:
                pool.send(w, "")  # nothing for this one
                continue
            task = {"skeleton": skeleton, "ops": [
                {"op": op, "out": str(wd / f"op{i}.w{w}.json"), "done": str(wd / f"op{i}.w{w}.done")}
                for i, op in enumerate(ops)]}
            tpath = wd / f"task.w{w}.json"
            tpath.write_text(json.dumps(task))
            pool.send(w, str(tpath))
        workers = [(w, pool.procs[w]) for w in range(active)]
        events = _supervise(workers, queue, already, total, progress, pool)
    finally:
        if own_pool:
            pool.close()
    t_tuned = time.perf_counter()

    # Merge per workload and commit the whole entry at once.
    rank_bytes: dict[str, bytes] = {}
    metadata: dict = {}
    for w_idx, w in enumerate(plan.workloads):
        files = sorted(p for i in per_workload[w_idx] for p in wd.glob(f"op{i}.w*.json"))
        if not files:
            raise FiAutotuneError("tuning produced no results (no tunable profile ran)")
        metadata, entries = merge_cache_files(files)
        data = cache_file_bytes(metadata, entries)
        for rank in w.ranks:
            rank_bytes[rank] = data
    timings = _timings(events, t_start, t_tuned)
    now = utc_now_iso()
    manifest = Manifest(
        key=plan.key, schema=plan.schema, key_string=plan.key_string, key_fields=res.key_fields,
        topology=res.topology, flashinfer_version=plan.flashinfer_version, arch=arch, flashinfer_metadata=metadata,
        rank_files={}, created=now, updated=now,
        stats={"profiles": total, "profiles_tuned_this_run": total - already, "gpus": n,
               **{k: v for k, v in timings.items() if k != "timeline"},
               "model_source": plan.source.describe()},
        request=plan.request.to_dict() if plan.request is not None else None,
    )
    result = commit_entry(layout, root, eid, rank_bytes, manifest,
                          check=replace_policy(layout, root, force))
    if result.refused:
        raise FiAutotuneError(f"{eid}: {result.refused[0][1]}; nothing was written (the tuned buckets are kept in {wd})")
    timings["write_s"] = round(time.perf_counter() - t_tuned, 3)
    timings["wall_s"] = round(time.perf_counter() - t_start, 3)
    timings["timeline"].update(planned=epoch_start, written=time.time())
    shutil.rmtree(wd, ignore_errors=True)
    return WarmResult("written", str(kdir), [str(kdir / r) for r in sorted(rank_bytes)], total - already, total, n, timings)


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


def _supervise(workers, queue: list[tuple[int, int]], already: int, total: int, progress, pool: "WorkerPool") -> list[dict]:
    """Deal the queue to the workers one item at a time (the next goes to whichever finishes
    first) and read their events; on any failure or signal stop them all and raise."""
    sel = selectors.DefaultSelector()
    # Raw reads split into lines here: a buffered readline() could keep a second event in its
    # buffer while select() waits on an fd with nothing left to read (and the worker waits on us).
    buffers: dict[int, bytes] = {}
    for w, proc in workers:
        sel.register(proc.stdout.fileno(), selectors.EVENT_READ, (w, proc))
        buffers[w] = b""
    events: list[dict] = []
    current: dict[int, tuple] = {}
    done = already
    failure: str | None = None
    stop = {"sig": None}

    def _on_signal(signum, frame):  # noqa: ARG001
        stop["sig"] = signum

    pending = list(reversed(queue))  # pop() deals from the front

    def deal(w: int) -> None:
        pool.send(w, " ".join(map(str, pending.pop())) if pending else None)

    def _on_event(ev: dict, w: int) -> str | None:
        nonlocal done
        ev["worker"] = w
        events.append(ev)
        if ev["event"] == "start":
            current[w] = (ev["op"], ev["bucket"])
        elif ev["event"] == "done":
            deal(w)
            done += ev["profiles"]
            if progress:
                progress(done, total, f"{ev['op']} @ {ev['bucket']} tokens (GPU {w})")
        elif ev["event"] == "error":
            op, bucket = ev.get("op"), ev.get("bucket")
            where = (f" while tuning {op} at {bucket} tokens" if bucket is not None else f" while loading {op}") if op else ""
            return f"worker on GPU {w} failed{where}: {ev['message']}"
        return None

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if progress:
            progress(done, total, "starting workers")
        for w, _ in workers:
            deal(w)
        open_streams = len(workers)
        while open_streams and failure is None and stop["sig"] is None:
            for key, _ in sel.select(timeout=0.5):
                w, proc = key.data
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    open_streams -= 1
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
                err = [ln for ln in pool.log_text(w).splitlines() if ln.strip()]
                op, bucket = current.get(w, (None, None))
                where = f" while tuning {op} at {bucket} tokens" if op else ""
                failure = f"worker on GPU {w} exited with {rc}{where}: {err[-1] if err else 'no message'}"
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        sel.close()
    if stop["sig"] is not None:
        raise Interrupted("interrupted: nothing was written; finished buckets are kept and a rerun resumes from them")
    if failure:
        raise FiAutotuneError(failure + "; nothing was written")
    return events


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
