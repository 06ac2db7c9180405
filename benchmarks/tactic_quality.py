"""How good are the tactics a cache holds? Engine-style tunes vs fi-autotune quick and careful.

For one workload, in one run, on this machine's GPUs (one process per GPU at a time):

1. ``--k`` engine-style tunes: a fresh process each, FlashInfer's defaults, every bucket of every
   op tuned in one pass as SGLang's startup does (``engine_rank.py --mode baseline``; on an idle
   GPU, which flatters the engine: at startup the GPU is busy loading a server);
2. ``--k`` fi-autotune quick tunes (``warm --gpus 1``) and ``--k`` careful tunes
   (``warm --quality careful --gpus 1``), fresh processes, interleaved with (1);
3. a re-measurement: for every (op, bucket), each distinct tactic assignment any of the 3k caches
   chose races head to head (``quality_measure.py``: interleaved, random order each round,
   CUDA-graph replays at decode sizes, cold L2, median of ``--rounds`` runs); the fastest is
   "best". For a MoE workload, each whole cache is also timed on the MoE layer at decode batch
   sizes 1-512.

Reported per kind: the share of (op, bucket) within 2% of best, run-to-run agreement (same
tactic, or within 1%), the geometric-mean slowdown against best, the MoE layer latency, and the
cost (GPU-seconds of tuning). ``--report`` re-prints tables and draws the plot from result files.

    python benchmarks/tactic_quality.py --workload moe-bf16 --k 5 --out results/
    python benchmarks/tactic_quality.py --report results/tactic_quality_*.json --plot docs/quality.png
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = {
    "dense-fp8": {"args": ["--model", "nvidia/Llama-3.1-70B-Instruct-FP8", "--tp", "4"],
                  "label": "Llama-3.1-70B-Instruct-FP8 TP4 (fp8_gemm)", "layer_bs": []},
    "moe-bf16": {"args": ["--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass"],
                 "label": "Qwen3-30B-A3B TP2 (flashinfer_cutlass MoE)", "layer_bs": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]},
}
KINDS = ("engine", "quick", "careful")


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len([x for x in out.stdout.splitlines() if x.startswith("GPU ")])


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fi_autotune_cli", *args]


def run_pool(jobs: list[dict], gpus: int, log, logdir: Path) -> None:
    """Run jobs (dicts with "cmd") one per GPU at a time; fill in rc, stdout, stderr, wall_s, gpu.
    Output goes to files, never pipes: a child that logs more than a pipe holds (FlashInfer logs
    every cache load) would block on its write while we wait for it to exit."""
    pending = list(jobs)
    running: dict[int, tuple] = {}
    logdir.mkdir(parents=True, exist_ok=True)
    while pending or running:
        for g in range(gpus):
            if g not in running and pending:
                job = pending.pop(0)
                env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(g)}
                out, err = open(logdir / f"{job['name']}.out", "w+"), open(logdir / f"{job['name']}.err", "w+")
                p = subprocess.Popen(job["cmd"], cwd=REPO, env=env, stdout=out, stderr=err, text=True)
                running[g] = (job, p, time.perf_counter(), out, err)
        time.sleep(0.2)
        for g, (job, p, t0, out, err) in list(running.items()):
            if p.poll() is None:
                continue
            out.seek(0)
            err.seek(0)
            job.update(rc=p.returncode, stdout=out.read(), stderr=err.read()[-3000:], wall_s=round(time.perf_counter() - t0, 2), gpu=g)
            out.close()
            err.close()
            log(f"{job['name']}: rc={p.returncode} {job['wall_s']} s on GPU {g}")
            del running[g]


def last_json(text: str) -> dict:
    """A command's JSON result: its whole stdout (``--json``), else its last JSON line."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    raise ValueError("no JSON in the output")


def existing_caches(work: Path, k: int) -> tuple[list[str], list[str], list[dict]]:
    """--measure-only: the caches an earlier (interrupted) run of this workload left in its work dir."""
    caches, labels, costs = [], [], []
    for kind in KINDS:
        for i in range(k):
            if kind == "engine":
                path = work / f"engine{i}.json"
                cost = {}
            else:
                found = sorted((work / f"{kind}{i}").glob("flashinfer/autotune/*/*/*/rank_*.json"))
                if not found:
                    continue
                path = found[0]
                m = json.loads((path.parent / "fi-autotune.manifest.json").read_text())["stats"]
                cost = {"tuning_gpu_s": round(m["tuning_gpu_s"] + m.get("racing_gpu_s", 0.0), 3), "tune_s": m["tuning_gpu_s"],
                        "race_s": m.get("racing_gpu_s", 0.0), "wall_s": m.get("workers_wall_s")}
            if path.exists():
                caches.append(str(path))
                labels.append(f"{kind}{i}")
                costs.append({"cache": f"{kind}{i}", "kind": kind, **cost})
    return caches, labels, costs


def measure(workload: str, k: int, repeats: int, rounds: int, out: Path, gpus: int, measure_only: bool = False) -> dict:
    w = WORKLOADS[workload]
    out.mkdir(parents=True, exist_ok=True)
    work = out / f"work-{workload}"
    work.mkdir(exist_ok=True)
    log_path = out / f"tactic_quality_{workload}.log"

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        with open(log_path, "a") as f:
            f.write(line + "\n")

    t_start = time.perf_counter()
    plan_path = work / "plan.json"
    plan_proc = subprocess.run(cli("plan", *w["args"], "--arch", "sm90", "--json"), cwd=REPO, capture_output=True, text=True)
    assert plan_proc.returncode == 0, plan_proc.stderr
    (plan,) = json.loads(plan_proc.stdout)["workers"]  # the one worker's plan, as engine_rank.py reads it
    plan_path.write_text(json.dumps(plan))
    ops = plan["workloads"][0]["ops"]

    def job(kind: str, i: int) -> dict:
        root = work / f"{kind}{i}"
        if kind == "engine":
            cmd = [sys.executable, str(REPO / "benchmarks" / "engine_rank.py"), "--plan", str(plan_path),
                   "--mode", "baseline", "--save", str(work / f"engine{i}.json")]
        elif kind == "quick":
            cmd = cli("warm", *w["args"], "--gpus", "1", "--cache-dir", str(root), "--json")
        else:
            cmd = cli("warm", *w["args"], "--gpus", "1", "--cache-dir", str(root), "--json",
                      "--quality", "careful", "--repeats", str(repeats))
        return {"name": f"{kind}{i}", "kind": kind, "i": i, "cmd": cmd}

    if measure_only:
        caches, labels, costs = existing_caches(work, k)
        failed = []
        log(f"measure only: {len(caches)} caches found")
    else:
        caches, labels, costs, failed = tune_all(job, k, gpus, log, work / "logs")
    t_tuned = time.perf_counter()
    return remeasure(w, workload, plan_path, ops, caches, labels, costs, failed, k, repeats, rounds, out, work, gpus,
                     log, t_start, t_tuned)


def tune_all(job, k: int, gpus: int, log, logdir: Path):
    # The first quick tune runs alone: it builds (or loads) the kernel modules every later process reuses.
    first = [job("quick", 0)]
    run_pool(first, 1, log, logdir)
    rest = [job(kind, i) for i in range(k) for kind in KINDS if (kind, i) != ("quick", 0)]
    run_pool(rest, gpus, log, logdir)
    jobs = first + rest
    failed = [j for j in jobs if j["rc"] != 0]
    for j in failed:
        log(f"FAILED {j['name']}: {j['stderr'][-1500:]}")
    caches, labels, costs = [], [], []
    for j in sorted(jobs, key=lambda j: (KINDS.index(j["kind"]), j["i"])):
        if j["rc"] != 0:
            continue
        if j["kind"] == "engine":
            path = Path(j["cmd"][j["cmd"].index("--save") + 1])
            r = last_json(j["stdout"])
            cost = {"tuning_gpu_s": r["pass_s"], "wall_s": j["wall_s"]}
        else:
            r = last_json(j["stdout"])
            path = Path(r["rank_files"][0])
            t = r["timings"]
            cost = {"tuning_gpu_s": round(t["tuning_gpu_s"] + t.get("racing_gpu_s", 0.0), 3),
                    "tune_s": t["tuning_gpu_s"], "race_s": t.get("racing_gpu_s", 0.0), "wall_s": j["wall_s"],
                    "selection": r.get("selection") or None}
        caches.append(str(path))
        labels.append(j["name"])
        costs.append({"cache": j["name"], "kind": j["kind"], **cost})
    return caches, labels, costs, failed


def remeasure(w, workload, plan_path, ops, caches, labels, costs, failed, k, repeats, rounds, out, work, gpus, log,
              t_start, t_tuned) -> dict:
    # Re-measure every (op, bucket) across the GPUs; the layer latency goes to the smallest share.
    items = [f"{i}:{b}" for i, op in enumerate(ops) for b in op["buckets"]]
    shards = [items[g::gpus] for g in range(gpus)]
    mjobs = []
    for g, share in enumerate(shards):
        cmd = [sys.executable, str(REPO / "benchmarks" / "quality_measure.py"), "--plan", str(plan_path),
               "--caches", *caches, "--items", ",".join(share), "--rounds", str(rounds), "--out", str(work / f"measure{g}.json")]
        if g == gpus - 1 and w["layer_bs"]:
            cmd += ["--layer-bs", ",".join(map(str, w["layer_bs"])), "--layer-op", "0"]
        mjobs.append({"name": f"measure{g}", "cmd": cmd})
    run_pool(mjobs, gpus, log, work / "logs")
    for j in mjobs:
        if j["rc"] != 0:
            raise SystemExit(f"{j['name']} failed: {j['stderr']}")
    measured = [json.loads((work / f"measure{g}.json").read_text()) for g in range(gpus)]
    result = {
        "workload": workload, "label": w["label"], "k": k, "repeats": repeats, "rounds": rounds, "gpus": gpus,
        "gpu": measured[0]["gpu"], "caches": labels, "costs": costs, "failed": [j["name"] for j in failed],
        "items": sorted((x for m in measured for x in m["items"]), key=lambda x: (x["op_index"], x["bucket"])),
        "layer": sorted((x for m in measured for x in m["layer"]), key=lambda x: x["bs"]),
        "tuning_wall_s": round(t_tuned - t_start, 1), "measure_wall_s": round(time.perf_counter() - t_tuned, 1),
        "date": time.strftime("%Y-%m-%d"),
    }
    result["summary"] = summarize(result)
    if any(c.startswith("careful") for c in labels):
        result["floor_sweep"] = floor_sweep(result, work)
    path = out / f"tactic_quality_{workload}.json"
    path.write_text(json.dumps(result, indent=1))
    log(f"wrote {path}")
    return result


# --- analysis (no GPU) ------------------------------------------------------------------------

SWEEP_THRESHOLDS = (0.0, 0.01, 0.02, 0.03, 0.04, 0.05)


def floor_sweep(r: dict, work: Path, thresholds=SWEEP_THRESHOLDS) -> dict:
    """What careful mode would have written under other floor thresholds, judged by the
    re-measurement. Each careful cache's manifest keeps its race (every candidate's median), so
    the choice under threshold t is replayed exactly as ``quality.choose`` makes it; the choice's
    time is the re-measured time of the cache that holds that same assignment. A choice that no
    cache holds was not re-measured: it is counted as unknown, never guessed."""
    sys.path.insert(0, str(REPO))
    from autotune_cache.tree.diff import op_slots, slot_of
    from autotune_cache.tune.careful.quality import DEFAULT_TACTIC, Candidate, choose
    from autotune_cache.autotuner.rankfile import RESERVED_KEYS

    ops = json.loads((work / "plan.json").read_text())["workloads"][0]["ops"]
    paths, labels, costs = existing_caches(work, r["k"])
    tunes = {c["cache"]: c.get("tune_s") for c in costs}
    if labels != r["caches"] or any(c.get("tune_s") is not None and tunes.get(c["cache"]) != c["tune_s"] for c in r.get("costs", [])):
        raise SystemExit(f"{work} holds other caches than the result file (another run's work dir?)")
    files = [{k: v for k, v in json.loads(Path(p).read_text()).items() if k not in RESERVED_KEYS} for p in paths]
    file_slots = [{k: (lambda s: (s.custom_op, s.profile))(slot_of(k)) for k in f} for f in files]  # parse each key once

    def describe(entries: dict) -> str:  # a cache's entries, named as the careful manifest names candidates
        default = bool(entries) and all(v[1] == DEFAULT_TACTIC for v in entries.values())
        return Candidate({k: (k, v) for k, v in entries.items()}, default=default).describe()

    careful = [i for i, lab in enumerate(labels) if lab.startswith("careful")]
    races = [json.loads((Path(paths[i]).parent / "fi-autotune.manifest.json").read_text())["extra"]["selection"]["ops"]
             for i in careful]
    measured = []  # (item, fastest time, assignment description -> re-measured time), once per item
    unmeasured = 0
    for x in r["items"]:
        ms = x["per_cache_ms"]
        if any(m is None for m in ms):
            unmeasured += 1  # an assignment that failed to run: every careful choice here is unknown
            continue
        slots = op_slots(ops[x["op_index"]], x["bucket"])
        picked = [{k: v for k, v in f.items() if slot[k] in slots} for f, slot in zip(files, file_slots)]
        measured.append((x, min(ms), {describe(p): ms[j] for j, p in enumerate(picked)}))
    rows = []
    for t in thresholds:
        ratios, unknown, kept = [], unmeasured * len(careful), 0
        per_cache: list[list[float | None]] = [[] for _ in careful]
        for x, best, held in measured:
            for c, race in enumerate(races):
                rec = race.get(x["op"], {}).get(str(x["bucket"]))
                if not rec or not rec.get("candidates"):  # not raced (no tune stored anything): unknown
                    per_cache[c].append(None)
                    unknown += 1
                    continue
                # warm's own rule, on the medians its manifest kept (rounded to 10 ns)
                cands = [Candidate({}, default=lab.startswith("default")) for lab in rec["candidates"]]
                sel = choose(cands, [math.inf if m is None else m for m in rec["medians_ms"]], t)
                kept += sel.kept_default
                ms_pick = held.get(rec["candidates"][sel.winner])
                per_cache[c].append(ms_pick)
                if ms_pick is None:
                    unknown += 1
                else:
                    ratios.append(ms_pick / best)
        agree = []
        for a, b in itertools.combinations(range(len(careful)), 2):
            pairs = [(u, v) for u, v in zip(per_cache[a], per_cache[b]) if u is not None and v is not None]
            agree.append(sum(abs(u / v - 1) <= 0.01 for u, v in pairs) / len(pairs) if pairs else float("nan"))
        rows.append({"threshold": t, "choices": len(ratios) + unknown, "unknown": unknown, "default_kept": kept,
                     "within_2pct_of_best": sum(q <= 1.02 for q in ratios) / len(ratios) if ratios else None,
                     "agreement_within_1pct": statistics.mean(agree) if agree else None,
                     "geomean_slowdown": _geomean(ratios) - 1 if ratios else None,
                     "over_5pct_slower": sum(q > 1.05 for q in ratios), "worst_ratio": max(ratios) if ratios else None})
    return {"rows": rows}


def sweep_table(r: dict) -> str:
    rows = r.get("floor_sweep", {}).get("rows")
    if not rows:
        return ""
    lines = [f"\nFloor threshold sweep, {r['workload']} (careful caches' own races replayed at each threshold; "
             "times from the re-measurement)",
             "| threshold | default kept | within 2% of best | agreement (within 1%) | geomean slowdown | >5% slower | worst | not re-measured |",
             "|---|---|---|---|---|---|---|---|"]
    for x in rows:
        pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
        lines.append(f"| {x['threshold']:.0%} | {x['default_kept']} of {x['choices']} | {pct(x['within_2pct_of_best'])} | "
                     f"{pct(x['agreement_within_1pct'])} | "
                     f"{'-' if x['geomean_slowdown'] is None else format(x['geomean_slowdown'], '+.2%')} | "
                     f"{x['over_5pct_slower']} | {'-' if x['worst_ratio'] is None else format(x['worst_ratio'], '.3f') + 'x'} | "
                     f"{x['unknown']} |")
    return "\n".join(lines)


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(r: dict) -> dict:
    kinds = [c.rstrip("0123456789") for c in r["caches"]]
    by_kind = {k: [i for i, kk in enumerate(kinds) if kk == k] for k in KINDS}
    items = [x for x in r["items"] if all(t is not None for t in x["per_cache_ms"])]
    out: dict = {"items": len(items), "items_unmeasurable": len(r["items"]) - len(items), "kinds": {}}
    iqr = [v for x in items for v in x["relative_iqr"] if v is not None]
    out["race_relative_iqr_median"] = statistics.median(iqr) if iqr else None
    for kind, idx in by_kind.items():
        if not idx:
            continue
        within, ratios, slower = [], [], []
        for c in idx:
            rs = [x["per_cache_ms"][c] / min(x["per_cache_ms"]) for x in items]
            ratios += rs
            within.append(sum(q <= 1.02 for q in rs) / len(rs) if rs else float("nan"))
            slower.append(sum(q > 1.05 for q in rs))
        agree, same = [], []
        for a, b in itertools.combinations(idx, 2):
            ok = s = 0
            for x in items:
                ta, tb = x["per_cache_ms"][a], x["per_cache_ms"][b]
                is_same = x["assignment_of_cache"][a] == x["assignment_of_cache"][b]
                s += is_same
                ok += is_same or abs(ta / tb - 1) <= 0.01
            agree.append(ok / len(items))
            same.append(s / len(items))
        costs = [c for c in r["costs"] if c["kind"] == kind]
        out["kinds"][kind] = {
            "caches": len(idx),
            "within_2pct_of_best": statistics.mean(within), "within_2pct_min": min(within),
            "agreement": statistics.mean(agree) if agree else None, "same_tactic": statistics.mean(same) if same else None,
            "geomean_slowdown": _geomean(ratios) - 1, "worst_ratio": max(ratios) if ratios else None,
            "items_over_5pct_slower_per_cache": statistics.mean(slower),
            "tuning_gpu_s": _median(c.get("tuning_gpu_s") for c in costs),
            "wall_s": _median(c.get("wall_s") for c in costs),
        }
    if r["layer"]:
        rows = []
        for x in r["layer"]:
            ms = x["per_cache_ms"]
            best = min(m for m in ms if m is not None and math.isfinite(m))
            row = {"bs": x["bs"], "best_ms": best}
            for kind, idx in by_kind.items():
                vals = [ms[c] for c in idx if ms[c] is not None and math.isfinite(ms[c])]
                if vals:
                    row[kind] = {"median_ms": statistics.median(vals), "max_ms": max(vals), "min_ms": min(vals)}
            rows.append(row)
        out["layer"] = rows
    return out


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(results: list[dict]) -> str:
    lines = []
    for r in results:
        s = r["summary"]
        lines.append(f"\n{r['label']} - {r['gpu']}, k={r['k']} caches per kind, careful = {r['repeats']} tunes + race, "
                     f"re-measured {s['items']} (op, bucket) x {r['rounds']} runs (race spread: median relative IQR "
                     f"{s['race_relative_iqr_median']:.2%})")
        lines.append("| kind | within 2% of best | (worst cache) | run-to-run agreement | same tactic | geomean slowdown "
                     "| worst (op, bucket) | >5% slower per cache | tuning GPU-s | wall s |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for kind in KINDS:
            k = s["kinds"].get(kind)
            if not k:
                continue
            agree = "-" if k["agreement"] is None else f"{k['agreement']:.1%}"
            same = "-" if k["same_tactic"] is None else f"{k['same_tactic']:.1%}"
            lines.append(f"| {kind} | {k['within_2pct_of_best']:.1%} | {k['within_2pct_min']:.1%} | {agree} | {same} | "
                         f"{k['geomean_slowdown']:+.2%} | {k['worst_ratio']:.2f}x | {k['items_over_5pct_slower_per_cache']:.1f} | "
                         f"{_fmt(k['tuning_gpu_s'])} | {_fmt(k['wall_s'])} |")
        if s.get("layer"):
            lines.append("\nMoE layer latency (median of the k caches of a kind, vs the fastest cache at that batch size)")
            lines.append("| batch | best us | " + " | ".join(KINDS) + " |")
            lines.append("|---|---|" + "---|" * len(KINDS))
            for row in s["layer"]:
                cells = [f"{row[k]['median_ms'] / row['best_ms'] - 1:+.1%} (max {row[k]['max_ms'] / row['best_ms'] - 1:+.1%})"
                         if k in row else "-" for k in KINDS]
                lines.append(f"| {row['bs']} | {row['best_ms'] * 1000:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layer = [r for r in results if r["summary"].get("layer")]
    fig, axes = plt.subplots(1, 2 + bool(layer), figsize=(6 * (2 + bool(layer)), 4.2))
    colors = {"engine": "#c44e52", "quick": "#8172b2", "careful": "#55a868"}
    width = 0.8 / len(KINDS)
    for ax, metric, title in ((axes[0], "within_2pct_of_best", "(op, bucket) within 2% of best"),
                              (axes[1], "agreement", "run-to-run agreement (same or within 1%)")):
        for j, kind in enumerate(KINDS):
            vals = [r["summary"]["kinds"].get(kind, {}).get(metric) or 0 for r in results]
            ax.bar([i + j * width for i in range(len(results))], [100 * v for v in vals], width, label=kind, color=colors[kind])
        ax.set_xticks([i + width for i in range(len(results))], [r["workload"] for r in results])
        ax.set_ylim(70, 101)  # the differences live in the top 30 points
        ax.set_ylabel("%")
        ax.set_title(title)
        ax.axhline(95 if metric == "within_2pct_of_best" else 90, color="grey", ls=":", lw=1)
        ax.legend(loc="lower right")
    if layer:
        ax = axes[2]
        r = layer[0]
        rows = r["summary"]["layer"]
        for kind in KINDS:
            xs = [row["bs"] for row in rows if kind in row]
            med = [100 * (row[kind]["median_ms"] / row["best_ms"] - 1) for row in rows if kind in row]
            mx = [100 * (row[kind]["max_ms"] / row["best_ms"] - 1) for row in rows if kind in row]
            ax.plot(xs, med, marker="o", color=colors[kind], label=f"{kind} (median)")
            ax.plot(xs, mx, ls="--", color=colors[kind], alpha=0.6, label=f"{kind} (worst cache)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("decode batch size")
        ax.set_ylabel("% slower than the fastest cache")
        ax.set_title(f"MoE layer latency, {r['workload']}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS))
    ap.add_argument("--k", type=int, default=5, help="tunes of each kind")
    ap.add_argument("--repeats", type=int, default=3, help="careful: tunes per (op, bucket)")
    ap.add_argument("--rounds", type=int, default=100, help="timed runs per candidate in the re-measurement")
    ap.add_argument("--gpus", type=int, default=0, help="default: every GPU here")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--report", type=Path, nargs="*", help="result files to re-print (no GPU)")
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--sweep-work", type=Path, help="with --report: recompute the floor sweep from this --out dir's work dirs")
    ap.add_argument("--measure-only", action="store_true", help="re-measure the caches an earlier run left in --out")
    args = ap.parse_args()
    if args.report:
        results = [json.loads(p.read_text()) for p in args.report]
        for r in results:
            r["summary"] = summarize(r)
        print(table(results))
        for r in results:
            if args.sweep_work:
                r["floor_sweep"] = floor_sweep(r, args.sweep_work / f"work-{r['workload']}")
            print(sweep_table(r))
        if args.plot:
            plot(results, args.plot)
        return
    if not args.workload:
        ap.error("--workload or --report")
    r = measure(args.workload, args.k, args.repeats, args.rounds, args.out, args.gpus or gpu_count(), args.measure_only)
    print(table([r]))
    print(sweep_table(r))
    if args.plot:
        plot([r], args.plot)


if __name__ == "__main__":
    main()
