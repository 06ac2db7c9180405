"""Where a warm's time went, from its workers' events: what the command prints and the
manifest's stats record (docs/benchmarks.md compares them across versions)."""

from __future__ import annotations


def _timeline(imported: dict, cuda: dict, ready: dict, fin: list, starts: list) -> dict:
    """Epoch seconds of each phase's last (or first) worker: a time line benchmarks can lay next
    to the command's own start and end."""
    return {k: v for k, v in {
        "workers_imported": max((e["t"] for e in imported.values() if "t" in e), default=None),
        "workers_cuda": max((e["t"] for e in cuda.values() if "t" in e), default=None),
        "workers_ready": max((e["t"] for e in ready.values() if "t" in e), default=None),
        "first_profile": min(starts, default=None),
        "workers_finished": max((e["t"] for e in fin if "t" in e), default=None),
    }.items() if v is not None}


#: A worker's stamps, in the order they happen: the event that sets each (first or last of its kind).
_WORKER_STAMPS = (("imported", "imported", min), ("cuda", "cuda", min), ("ready", "ready", min),
                  ("first_profile", "start", min), ("last_profile", "done", max), ("finished", "finished", max))


def per_worker(events: list[dict], epoch_start: float | None) -> list[dict]:
    """Each worker's own time line, in seconds since ``epoch_start`` (the command's start; None:
    the first event's): when it had imported torch and FlashInfer, had its CUDA context, its
    task, started its first profile and finished its last, and exited; its JIT (layer builds
    and first calls), tuning and racing seconds and how many items it ran. A fleet's fixed
    start is the gap before ``first_profile``; its tail, the gap between workers' ``last_profile``."""
    stamped = [e for e in events if "t" in e and "worker" in e]
    if not stamped:
        return []
    t0 = epoch_start if epoch_start is not None else min(e["t"] for e in stamped)
    out = []
    for w in sorted({e["worker"] for e in stamped}):
        mine = [e for e in stamped if e["worker"] == w]
        row: dict = {"worker": w}
        for name, kind, pick in _WORKER_STAMPS:
            ts = [e["t"] for e in mine if e["event"] == kind]
            if ts:
                row[name] = round(pick(ts) - t0, 3)
        fin = next((e for e in mine if e["event"] == "finished"), {})
        row.update({k: round(fin[f], 3) for k, f in (("jit_s", "jit_s"), ("tune_s", "tune_s"), ("race_s", "race_s"),
                                                    ("floor_s", "floor_s")) if fin.get(f) is not None})
        row["items"] = sum(e["event"] in ("done", "raced") for e in mine)
        out.append(row)
    return out


def kernel_modules(events: list[dict]) -> list[dict]:
    """Each FlashInfer kernel module the workers loaded (``kernel_modules.py``'s ``module``
    events): how (``compiled`` by some worker wins over ``cached`` and ``prebuilt``), the
    longest any worker spent on it (a wait on another worker's build included), how many
    workers loaded it and the op that first asked for it; the slowest first."""
    rank = {"compiled": 0, "unknown": 1, "cached": 2, "prebuilt": 3}
    out: dict[str, dict] = {}
    for e in events:
        if e.get("event") != "module":
            continue
        row = out.setdefault(e["module"], {"module": e["module"], "how": e["how"], "seconds": 0.0, "workers": 0,
                                           "op": e.get("op")})
        if rank.get(e["how"], 1) < rank.get(row["how"], 1):
            row["how"] = e["how"]
        row["seconds"] = round(max(row["seconds"], e["seconds"]), 3)
        row["workers"] += 1
    return sorted(out.values(), key=lambda r: (-r["seconds"], r["module"]))


def compiling_s(events: list[dict]) -> float:
    """The most seconds one worker spent on modules compiled in this run (building them, or
    waiting on another worker's build): the share of a fresh machine's warm that prebuilt
    modules would take off."""
    compiled = {e["module"] for e in events if e.get("event") == "module" and e["how"] == "compiled"}
    per: dict = {}
    for e in events:
        if e.get("event") == "module" and e["module"] in compiled:
            per[e.get("worker")] = per.get(e.get("worker"), 0.0) + e["seconds"]
    return round(max(per.values(), default=0.0), 3)


def worker_timings(events: list[dict], t_start: float, t_tuned: float, epoch_start: float | None = None) -> dict:
    """Start-up, JIT, tuning and racing seconds (slowest worker, and summed over GPUs), peak GPU
    memory, the time line (``timeline``) and each GPU worker's own (``gpu_workers``, ``per_worker``)."""
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
        "timeline": _timeline(imported, cuda, ready, fin, starts),
        "compiling_s": compiling_s(events),
        "kernel_modules": kernel_modules(events),
        "gpu_workers": per_worker(events, epoch_start),
    }
