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


def worker_timings(events: list[dict], t_start: float, t_tuned: float) -> dict:
    """Start-up, JIT, tuning and racing seconds (slowest worker, and summed over GPUs), peak GPU
    memory, and the time line (``timeline``)."""
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
    }
