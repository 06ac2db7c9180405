"""A fleet as one ``warm --targets`` against the same targets as separate ``warm`` runs.

Same GPUs, same run, interleaved, ``--repeat`` times each, fresh trees and work dirs every time
(nothing resumes). Per mode and GPU count: total wall time, tuning GPU-seconds, the floor (the
time FlashInfer spends inside its per-tactic measurements, FI_AUTOTUNE_FLOOR=1), the overhead
(wall x GPUs over the floor, minus one) and the scaling efficiency floor / (wall x GPUs). The
targets share work on purpose (the MoE of one model under two served paths), so the merged
saving shows too.

    python benchmarks/fleet.py --gpus 1,4 --repeat 3 --out benchmarks/results/fleet.json
    python benchmarks/fleet.py --gpus 1,2 --modes fleet,fleet-longest --repeat 2   # the two deals
    python benchmarks/fleet.py --gpus 2 --modes fleet,fleet-served --repeat 3      # fresh vs served workers

Not part of fi-autotune; needs GPUs (sm90) and FlashInfer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# JSON (a targets file may be either): the GPU image carries no PyYAML.
TARGETS = {
    "defaults": {"arch": "sm90"},
    "targets": [
        {"name": "dense-fp8", "model": "nvidia/Llama-3.1-70B-Instruct-FP8", "tp": [4, 8]},
        {"name": "moe-bf16", "model": "Qwen/Qwen3-30B-A3B", "moe_runner_backend": "flashinfer_cutlass", "tp": [2, 4]},
        {"name": "moe-bf16-image", "model": "Qwen/Qwen3-30B-A3B", "model_path": "/models/Qwen3-30B-A3B",
         "moe_runner_backend": "flashinfer_cutlass", "tp": 2},
        {"name": "moe-bf16-dp", "model": "Qwen/Qwen3-30B-A3B", "moe_runner_backend": "flashinfer_cutlass", "tp": 4, "dp": 4},
    ],
}


def flags(fields: dict) -> list[str]:
    out = []
    for k, v in fields.items():
        if k in ("name", "arch"):
            continue
        out += [f"--{k.replace('_', '-')}", str(v)]
    return out


def run(cmd: list[str], env: dict) -> tuple[dict, float]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])}... failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout), wall


def served_env(base: Path) -> dict:
    """fleet-served: one cache home for every run (the served workers' state lives there, and a
    served worker serves only the environment it was started in); its work dirs are emptied
    before each run, so nothing resumes."""
    return {**os.environ, "FI_AUTOTUNE_FLOOR": "1", "XDG_CACHE_HOME": str(base / "xdg-served")}


def workers(action: str, gpus: int, base: Path) -> dict:
    cmd = [sys.executable, "-m", "fi_autotune_cli", "workers", action, "--json"] + (["--gpus", str(gpus)] if action == "start" else [])
    p = subprocess.run(cmd, cwd=REPO, env=served_env(base), capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"workers {action} failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout)


def once(mode: str, gpus: int, targets_file: Path, targets, tmp: Path) -> dict:
    env = {**os.environ, "FI_AUTOTUNE_FLOOR": "1", "XDG_CACHE_HOME": str(tmp / "xdg")}
    if mode == "fleet-served":
        env = served_env(targets_file.parent)
        shutil.rmtree(Path(env["XDG_CACHE_HOME"]) / "fi-autotune" / "work", ignore_errors=True)
    cli = [sys.executable, "-m", "fi_autotune_cli", "warm", "--gpus", str(gpus), "--cache-dir", str(tmp / "root"), "--json"]
    if mode.startswith("fleet"):  # fleet: the default deal (targets); fleet-longest: --deal longest; fleet-served: workers start first
        deal = ["--deal", "longest"] if mode == "fleet-longest" else []
        launch = time.time()
        data, wall = run([*cli, "--targets", str(targets_file), *deal], env)
        t = data["timings"]
        if mode == "fleet-served" and t.get("pool", {}).get("source") != "served":
            raise SystemExit(f"fleet-served ran on its own workers: {t.get('pool')}")
        return {"wall_s": wall, "tuning_gpu_s": t.get("tuning_gpu_s", 0.0), "floor_gpu_s": t.get("floor_gpu_s", 0.0),
                "profiles": data["profiles_tuned"], "profiles_one_by_one": data["profiles_total"],
                "pool": t.get("pool", {}).get("source"), **timeline(t, launch, wall)}
    tot = {"wall_s": 0.0, "tuning_gpu_s": 0.0, "floor_gpu_s": 0.0, "profiles": 0}
    for t in targets:
        data, wall = run([*cli, *flags(t.fields)], env)
        tot["wall_s"] += wall
        tot["tuning_gpu_s"] += data["timings"].get("tuning_gpu_s", 0.0)
        tot["floor_gpu_s"] += data["timings"].get("floor_gpu_s", 0.0)
        tot["profiles"] += data["profiles_tuned"]
    return tot


def timeline(t: dict, launch: float, wall: float) -> dict:
    """The fleet's time line from the benchmark's launch of the command (seconds): the command's
    own start, planned, each worker's stamps (``timings.gpu_workers``), each target written; the fixed
    start is launch to the first profile of the first worker (process start, imports, CUDA
    context, module loads), the tail is the last worker's last profile minus the first's."""
    tl = t.get("timeline", {})
    shift = tl.get("started", launch) - launch  # the command's t0 after the launch
    workers = [{k: (round(v + shift, 3) if k in ("imported", "cuda", "ready", "first_profile", "last_profile", "finished")
                    else v) for k, v in w.items()} for w in t.get("gpu_workers", [])]
    out = {"timeline": {k: round(v - launch, 3) for k, v in tl.items()}, "workers": workers,
           "targets_written": {k: round(v + shift, 3) for k, v in t.get("targets_written", {}).items()}}
    firsts = [w["first_profile"] for w in workers if "first_profile" in w]
    lasts = [w["last_profile"] for w in workers if "last_profile" in w]
    if firsts:
        out["fixed_start_s"] = min(firsts)
        out["fixed_start_last_worker_s"] = max(firsts)
    if lasts:
        out["tail_s"] = round(max(lasts) - min(lasts), 3)
        out["after_last_profile_s"] = round(wall - max(lasts), 3)
    return out


def table(rows: list[dict]) -> str:
    """Median of the repeats per (mode, GPUs); overhead = wall x GPUs over the floor, minus one;
    scaling efficiency = floor / (wall x GPUs), the issue's definition."""
    lines = ["| mode | GPUs | wall s (median) [min-max] | tuning GPU-s | floor GPU-s | overhead | scaling eff. | profiles tuned "
             "| fixed start s (first / last worker) | tail s | after last profile s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for gpus in sorted({r["gpus"] for r in rows}):
        for mode in ("separate", "fleet", "fleet-longest", "fleet-served"):
            sel = [r for r in rows if r["gpus"] == gpus and r["mode"] == mode]
            if not sel:
                continue
            walls = [r["wall_s"] for r in sel]
            wall = statistics.median(walls)
            floor = statistics.median(r["floor_gpu_s"] for r in sel)
            over = f"{wall * gpus / floor - 1:+.0%}" if floor else "-"
            eff = f"{floor / (wall * gpus):.2f}" if floor else "-"
            def med(k: str) -> str:
                vals = [r[k] for r in sel if k in r]
                return f"{statistics.median(vals):.2f}" if vals else "-"
            lines.append(f"| {mode} | {gpus} | {wall:.1f} [{min(walls):.1f}-{max(walls):.1f}] | "
                         f"{statistics.median(r['tuning_gpu_s'] for r in sel):.1f} | {floor:.1f} | {over} | {eff} | "
                         f"{sel[0]['profiles']} | {med('fixed_start_s')} / {med('fixed_start_last_worker_s')} | "
                         f"{med('tail_s')} | {med('after_last_profile_s')} |")
        sep = [r["wall_s"] for r in rows if r["gpus"] == gpus and r["mode"] == "separate"]
        fl = [r["wall_s"] for r in rows if r["gpus"] == gpus and r["mode"] == "fleet"]
        if sep and fl:
            lines.append(f"| fleet vs separate | {gpus} | {statistics.median(sep) / statistics.median(fl):.2f}x faster | | | | | | | | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", default="1", help="comma-separated GPU counts, e.g. 1,4")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", default="separate,fleet",
                    help="comma-separated: separate (one warm per target), fleet (warm --targets: target by "
                         "target), fleet-longest (warm --targets --deal longest: costliest work first), "
                         "fleet-served (warm --targets on workers `fi-autotune workers start` started before, untimed)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "fleet.json")
    ap.add_argument("--report", type=Path, nargs="*", help="result files to re-print together (no GPU)")
    ap.add_argument("--no-prerun", action="store_true", help="skip the untimed run that builds or loads the kernel modules")
    args = ap.parse_args()
    if args.report:
        print(table([row for p in args.report for row in json.loads(p.read_text())["rows"]]))
        return
    sys.path.insert(0, str(REPO))
    from autotune_cache.plan.targets import parse_targets

    targets = parse_targets(TARGETS, "fleet")
    counts = [int(x) for x in args.gpus.split(",")]
    rows: list[dict] = []
    result = {"targets": [t.to_dict() for t in targets], "rows": rows, "date": time.strftime("%Y-%m-%d")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        targets_file = Path(d) / "targets.json"
        targets_file.write_text(json.dumps(TARGETS))
        if not args.no_prerun:  # first-time JIT builds and module loads stay out of every timed run
            with tempfile.TemporaryDirectory(dir=d) as tmp:
                res = once("fleet", max(counts), targets_file, targets, Path(tmp))
            result["prerun"] = res
            print(json.dumps({"prerun": res}), flush=True)
        for gpus in counts:
            modes = args.modes.split(",")
            if "fleet-served" in modes:
                started = workers("start", gpus, Path(d))
                result.setdefault("served_start", []).append({"gpus": gpus, "seconds": started["seconds"]})
                print(json.dumps({"workers_start": started["seconds"], "gpus": gpus}), flush=True)
            for r in range(args.repeat):
                for mode in (modes if r % 2 == 0 else modes[::-1]):  # interleaved, alternating order
                    with tempfile.TemporaryDirectory(dir=d) as tmp:
                        res = once(mode, gpus, targets_file, targets, Path(tmp))
                    rows.append({"mode": mode, "gpus": gpus, "repeat": r, **res})
                    print(json.dumps(rows[-1]), flush=True)
                    args.out.write_text(json.dumps(result, indent=1))  # a run cut short keeps what it measured
            if "fleet-served" in modes:
                workers("stop", gpus, Path(d))
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
