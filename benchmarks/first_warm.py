"""A fresh machine's first warm, against the same warm once FlashInfer's kernels are built, and
against the engine's own boot-time tuning pass on the same fresh machine (issue 47).

    python benchmarks/first_warm.py --out docs/results/first_warm_<date>.json     # on a GPU machine
    python benchmarks/first_warm.py --table docs/results/first_warm_<date>.json   # the table again

"Fresh" is an empty FlashInfer JIT workspace (``FLASHINFER_WORKSPACE_BASE`` pointed at a new
directory): every kernel module that no package ships prebuilt is compiled, as on a container
build or a CI runner. "Again" is the same command with that workspace kept. The engine's pass
(benchmarks/engine_rank.py ``cold``: one rank's startup autotune, what each server rank pays at
boot) runs in a workspace of its own, fresh then again, so neither side inherits the other's
builds. What is not reset: the OS page cache (torch's and FlashInfer's files are read from disk
once per machine), so "fresh" here is a fresh JIT workspace, not a cold disk.

Per run: wall seconds from launch to exit, the warm's own split (startup/import, JIT, tuning,
writing), ``compiling_s`` (seconds one worker spent on modules compiled in the run) and each
kernel module (prebuilt, cached or compiled; seconds; the op that asked for it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from warm_vs_engine import engine_plan, run_ranks, run_warm  # noqa: E402

WORKLOADS = {
    # The README's warm example, as written (a TP4 target; on fewer GPUs its profiles are split over them).
    "readme-dense-fp8": ["--model", "nvidia/Llama-3.1-70B-Instruct-FP8", "--tp", "4"],
    "moe-bf16-cutlass": ["--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass"],
}


def _in_workspace(ws: Path, fn, *args, **kw):
    before = os.environ.get("FLASHINFER_WORKSPACE_BASE")
    os.environ["FLASHINFER_WORKSPACE_BASE"] = str(ws)
    try:
        return fn(*args, **kw)
    finally:
        if before is None:
            os.environ.pop("FLASHINFER_WORKSPACE_BASE", None)
        else:
            os.environ["FLASHINFER_WORKSPACE_BASE"] = before


def _warm_row(r: dict) -> dict:
    t = r["timings"]
    return {"wall_s": round(r["wall_s"], 2), "startup_import_s": t["startup_import_s"], "jit_s": t["jit_s"],
            "compiling_s": t.get("compiling_s"), "tuning_s": t["tuning_s"], "write_s": t["write_s"],
            "profiles": r["profiles"], "phases": r["phases"], "kernel_modules": t.get("kernel_modules", [])}


def measure(workloads: list[str], gpus: int, engine: bool, out: Path | None) -> dict:
    import torch
    import flashinfer

    results = {"machine": {"gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(), "cpus": os.cpu_count(),
                           "python": platform.python_version(), "torch": torch.__version__,
                           "flashinfer": flashinfer.__version__},
               "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]), "workloads": {}}
    work = Path(tempfile.mkdtemp(prefix="fi-first-"))
    for name in workloads:
        args = WORKLOADS[name]
        n = min(gpus, results["machine"]["gpus"])
        ws = work / f"{name}-ws"
        row: dict = {"args": args, "gpus": n}
        for run in ("fresh", "again"):
            r = _in_workspace(ws, run_warm, args, n, work / f"{name}-{run}")
            row[run] = _warm_row(r)
            print(f"[{name}] warm {run}: {row[run]['wall_s']:.1f} s (JIT {row[run]['jit_s']:.1f} s, compiling "
                  f"{row[run]['compiling_s']} s)", flush=True)
        if engine:
            plan = engine_plan(args, work / f"{name}-plan", flashinfer.__version__)
            plan_path = work / f"{name}.plan.json"
            plan_path.write_text(json.dumps(plan))
            ews = work / f"{name}-engine-ws"
            for run in ("fresh", "again"):
                e = _in_workspace(ews, run_ranks, plan_path, "cold", 1)
                row[f"engine_{run}"] = {"wall_s": round(e["wall_s"], 2), "pass_s": round(e["pass_s"], 2), "tuned": e["tuned"]}
                print(f"[{name}] engine boot pass {run}: {e['wall_s']:.1f} s (pass {e['pass_s']:.1f} s)", flush=True)
        results["workloads"][name] = row
        if out is not None:  # what is measured so far survives a run cut short
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=2))
    return results


def prebuild_ab(name: str, repeat: int, gpus: int, out: Path | None) -> dict:
    """Workers that start every module build at once (``prebuild``) against FlashInfer's own order
    (each module when an op first asks), each run in a fresh workspace, alternated on one machine
    after a discarded first run (it pays the machine's cold disk)."""
    import torch

    work = Path(tempfile.mkdtemp(prefix="fi-ab-"))
    n = min(gpus, torch.cuda.device_count())
    _in_workspace(work / "discard-ws", run_warm, WORKLOADS[name], n, work / "discard")
    rows: dict = {"on": [], "off": []}
    for rep in range(repeat):
        for mode in ("off", "on"):
            os.environ["FI_AUTOTUNE_PREBUILD"] = "1" if mode == "on" else "0"
            r = _warm_row(_in_workspace(work / f"{mode}{rep}-ws", run_warm, WORKLOADS[name], n, work / f"{mode}{rep}"))
            rows[mode].append(r)
            print(f"[{name}] prebuild {mode} rep {rep + 1}: {r['wall_s']:.1f} s (compiling {r['compiling_s']} s)", flush=True)
    os.environ.pop("FI_AUTOTUNE_PREBUILD", None)
    med = {m: statistics.median(r["wall_s"] for r in rows[m]) for m in rows}
    result = {"workload": name, "runs": rows, "median_wall_s": med, "ratio_on_off": round(med["on"] / med["off"], 3)}
    if out is not None:
        out.write_text(json.dumps(result, indent=2))
    print(f"prebuild on/off median wall: {med['on']:.1f} / {med['off']:.1f} s = {result['ratio_on_off']:.3f}")
    return result


def table(results: dict) -> str:
    m = results["machine"]
    lines = [f"{m['gpu']} x{m['gpus']}, {m['cpus']} CPUs, FlashInfer {m['flashinfer']}, torch {m['torch']}",
             f"{'workload':<18} {'run':<13} {'wall s':>7} {'import s':>9} {'JIT s':>6} {'compiling s':>12} "
             f"{'tuning s':>9} {'compiling share':>16}"]
    for name, w in results["workloads"].items():
        for run in ("fresh", "again"):
            r = w[run]
            share = (r["compiling_s"] or 0) / r["wall_s"]
            lines.append(f"{name:<18} {'warm ' + run:<13} {r['wall_s']:>7.1f} {r['startup_import_s']:>9.1f} {r['jit_s']:>6.1f} "
                         f"{r['compiling_s'] or 0:>12.1f} {r['tuning_s']:>9.1f} {share:>16.0%}")
        for run in ("fresh", "again"):
            e = w.get(f"engine_{run}")
            if e:
                lines.append(f"{name:<18} {'engine ' + run:<13} {e['wall_s']:>7.1f}   (boot pass {e['pass_s']:.1f} s, "
                             f"{e['tuned']} profiles tuned by one rank)")
        mods = w["fresh"]["kernel_modules"]
        if mods:
            lines.append("  modules (fresh): " + ", ".join(f"{k['module']} {k['how']} {k['seconds']:.1f} s [{k['op']}]"
                                                        for k in mods))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--gpus", type=int, default=8, help="GPUs the warm may use (at most what the machine has)")
    ap.add_argument("--no-engine", action="store_true", help="skip the engine's boot pass")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--table", type=Path, help="print the table of an earlier run and exit")
    ap.add_argument("--prebuild-ab", type=int, metavar="REPEATS",
                    help="only compare prebuild on/off, alternated, on the first workload")
    a = ap.parse_args()
    if a.prebuild_ab:
        prebuild_ab(a.workloads.split(",")[0], a.prebuild_ab, a.gpus, a.out)
        return
    if a.table:
        print(table(json.loads(a.table.read_text())))
        return
    results = measure(a.workloads.split(","), a.gpus, not a.no_engine, a.out)
    print(table(results))


if __name__ == "__main__":
    main()
