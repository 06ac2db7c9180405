"""The exhaustive tactic reference (issue 34): every valid (runner, tactic), then quick/careful/engine against it.

For one workload, on one GPU, in one run:

1. the picks: a quick warm, a careful warm (``--quality careful``) and an engine-style cold tune
   (``engine_rank.py --mode baseline``: every bucket in one ``autotune(True)`` pass, FlashInfer's
   defaults), each a fresh process;
2. enumeration: per (op, bucket), one FlashInfer tune with ``AutoTuner.choose_one`` and
   ``AutoTuner._profile_single_kernel`` wrapped: FlashInfer calls the latter once per tactic of every
   runner's ``get_valid_tactics`` (after its blocklist), so the wrapper sees exactly the (runner, tactic)
   pairs FlashInfer would consider; one that raises is invalid. FlashInfer's fallback (runners[0], -1)
   is added. Each candidate is a cache entry (the tune's key with the runner and its key extras
   replaced, the tune's measurement policy), loaded as a cache file - as an engine loads it;
3. per slot (gemm1, gemm2 of a MoE call; each GEMM), the other slots held at the tune's winner
   (later slots: at the best found): every candidate timed as the whole call (``race.py``: interleaved,
   new random order each round, CUDA-graph replays up to the engine's graph batch, eager with
   FlashInfer's delay kernel above, cold L2); the screen's top (within 3%, at least 4) races on in
   batches until the bootstrap says its fastest stays fastest (or within 0.5% of the fastest) with
   95% confidence, or ``--max-rounds``;
4. per (op, bucket), the best and the three picks head to head; per token count, each cache's whole
   call against every slot at its best.

Writes ``--out/tactic_exhaustive_<workload>.json`` (after every bucket: an interrupted run keeps what it
measured) and prints the table (``autotune_cache.tune.careful.settle``). ``--report FILE`` re-prints it.

    python benchmarks/tactic_exhaustive.py --workload moe-bf16 --out $OUT
    python benchmarks/tactic_exhaustive.py --report docs/results/tactic_exhaustive_moe-bf16.json.gz
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "benchmarks"))

from autotune_cache.tune.careful.settle import relative_iqr  # noqa: E402
from exhaustive_report import KINDS, aa_table, repeated_table, summarize, sweep_h2h_table, table  # noqa: E402
from autotune_cache.tune.careful.quality import DEFAULT_GRAPH_INSTANCES, DEFAULT_INPUT_DRAWS, DEFAULT_SPAN, bucket_span  # noqa: E402

WORKLOADS = {
    "moe-bf16": {"args": ["--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass"],
                 "label": "Qwen3-30B-A3B TP2 (flashinfer_cutlass MoE, bf16)"},
    "mixtral-bf16": {"args": ["--model", "mistralai/Mixtral-8x7B-v0.1", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass"],
                     "label": "Mixtral-8x7B TP2 (flashinfer_cutlass MoE, bf16)"},
    "dense-fp8": {"args": ["--model", "nvidia/Llama-3.1-70B-Instruct-FP8", "--tp", "4"],
                  "label": "Llama-3.1-70B-Instruct-FP8 TP4 (fp8_gemm)"},
    # issue 47: three layouts careful was not shaped on
    "moe-bf16-ep": {"args": ["--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--ep", "2",
                             "--moe-runner-backend", "flashinfer_cutlass"],
                    "label": "Qwen3-30B-A3B TP2 EP2 (flashinfer_cutlass MoE, bf16, 64 local experts)"},
    "dense-fp8-tp8": {"args": ["--model", "nvidia/Llama-3.1-70B-Instruct-FP8", "--tp", "8"],
                      "label": "Llama-3.1-70B-Instruct-FP8 TP8 (fp8_gemm)"},
    "glm-bf16-shared": {"args": ["--model", "zai-org/GLM-5.1", "--tp", "8", "--moe-runner-backend", "flashinfer_cutlass"],
                        "label": "GLM-5.1 TP8 (flashinfer_cutlass MoE, bf16, shared expert fused: 257 experts, top-9)"},
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- 1. the picks: fresh processes ------------------------------------------------------------


def _cli_env(tmp: Path) -> dict:
    """The CLI as ``python -m fi_autotune_cli`` without installing: the package dir is ``cli/``."""
    link = tmp / "fi_autotune_cli"
    if not link.exists():
        link.symlink_to(REPO / "cli")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp), str(REPO), os.environ.get("PYTHONPATH")]))}


def _last_json(text: str) -> dict:
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


def plan_of(w: dict, work: Path, env: dict) -> Path:
    p = subprocess.run([sys.executable, "-m", "fi_autotune_cli", "plan", *w["args"], "--arch", "sm90", "--json"],
                       cwd=REPO, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"plan failed: {p.stderr}")
    (worker,) = json.loads(p.stdout)["workers"]
    path = work / "plan.json"
    path.write_text(json.dumps(worker))
    return path


def workload_ops(workload: str, prefix: str):
    """A workload's plan, its distinct ops, CUDA device 0 (set current) and a work dir: where the race
    experiments (``race_inputs.py``, ``race_instances.py``) start."""
    import torch

    from autotune_cache.plan.request import TuneRequest
    from autotune_cache.tune.session.work import distinct_ops

    work = Path(tempfile.mkdtemp(prefix=prefix))
    plan_json = json.loads(plan_of(WORKLOADS[workload], work, _cli_env(work)).read_text())
    plan = TuneRequest.from_dict(plan_json["request"]).plan(Path(tempfile.mkdtemp()))
    ops, _ = distinct_ops(plan)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    return plan, ops, dev, work


def tune_kinds(kinds: list[str], w: dict, plan_path: Path, work: Path, env: dict, repeats: int) -> dict:
    out = {}
    for kind in kinds:
        root = work / kind
        if kind == "engine":
            save = work / "engine.json"
            cmd = [sys.executable, str(REPO / "benchmarks" / "engine_rank.py"), "--plan", str(plan_path), "--mode", "baseline",
                   "--save", str(save)]
        else:
            cmd = [sys.executable, "-m", "fi_autotune_cli", "warm", *w["args"], "--gpus", "1", "--cache-dir", str(root), "--json"]
            if kind in ("careful", "careful-winners"):
                cmd += ["--quality", "careful", "--repeats", str(repeats)]
            if kind == "careful-winners":
                cmd[cmd.index("--cache-dir") + 1] = str(root)
        kenv = {**env, "FI_AUTOTUNE_RACE_TOP_K": "0"} if kind == "careful-winners" else env
        t0 = time.perf_counter()
        with open(work / f"{kind}.out", "w+") as so, open(work / f"{kind}.err", "w+") as se:
            rc = subprocess.run(cmd, cwd=REPO, env=kenv, stdout=so, stderr=se).returncode
            so.seek(0)
            se.seek(0)
            stdout, stderr = so.read(), se.read()
        wall = time.perf_counter() - t0
        if rc != 0:
            log(f"{kind} failed (rc {rc}): {stderr[-2000:]}")
            out[kind] = {"error": stderr[-2000:], "wall_s": round(wall, 1)}
            continue
        r = _last_json(stdout)
        if kind == "engine":
            path, cost = save, {"tuning_gpu_s": r["pass_s"]}
        else:
            path = Path(r["rank_files"][0])
            t = r["timings"]
            cost = {"tuning_gpu_s": round(t["tuning_gpu_s"] + t.get("racing_gpu_s", 0.0), 3)}
        out[kind] = {"path": str(path), "wall_s": round(wall, 1), **cost}
        log(f"{kind}: {wall:.1f} s, {path}")
    return out


# --- 2. enumeration ---------------------------------------------------------------------------


class Enumerator:
    """While installed, records every (custom op, runner, key extras, tactic) FlashInfer profiles."""

    def __init__(self, tuner_cls):
        self.cls = tuner_cls
        self.records: list[dict] = []
        self.first: dict[str, tuple] = {}  # custom op -> (runners[0] class, its key extras)
        self._op: list[str] = []
        self._saved = None

    def __enter__(self):
        enum = self
        choose, profile = self.cls.choose_one, self.cls._profile_single_kernel
        self._saved = (choose, profile)

        def choose_one(self, custom_op, runners, tuning_config, inputs, **kwargs):
            if runners and custom_op not in enum.first:
                try:
                    enum.first[custom_op] = (runners[0].__class__.__name__, tuple(runners[0].get_cache_key_extras(inputs)))
                except Exception:  # noqa: BLE001 - the default candidate then takes the winner's key
                    pass
            enum._op.append(custom_op)
            try:
                return choose(self, custom_op, runners, tuning_config, inputs, **kwargs)
            finally:
                enum._op.pop()

        def _profile_single_kernel(self, runner, inputs, tactic, tuning_config, *args, **kwargs):
            rec = {"custom_op": enum._op[-1] if enum._op else None, "runner": runner.__class__.__name__,
                   "tactic": tactic, "ms": None, "error": None}
            try:
                rec["extras"] = tuple(runner.get_cache_key_extras(inputs))
            except Exception:  # noqa: BLE001
                rec["extras"] = None
            enum.records.append(rec)
            try:
                rec["ms"] = profile(self, runner, inputs, tactic, tuning_config, *args, **kwargs)
                return rec["ms"]
            except Exception as e:
                rec["error"] = f"{type(e).__name__}: {str(e)[:160]}"
                raise

        self.cls.choose_one, self.cls._profile_single_kernel = choose_one, _profile_single_kernel
        return self

    def __exit__(self, *exc):
        self.cls.choose_one, self.cls._profile_single_kernel = self._saved
        return False


def enumerate_slots(torch, layer, bucket: int, work: Path) -> list[dict]:
    """One FlashInfer tune of ``layer`` at ``bucket`` with the enumerator on: per slot (custom op),
    the tune's winner and every candidate as (key, value) cache entries."""
    from flashinfer.autotuner import AutoTuner, autotune
    from flashinfer.autotuner.autotuner import _tactic_to_json

    tuner = AutoTuner.get()
    tuner.clear_cache()
    with Enumerator(AutoTuner) as enum:
        with autotune(True, tuning_buckets=(bucket,)):
            layer(1)
        torch.cuda.synchronize()
    winners = list(tuner.profiling_cache)
    saved = work / f"enum-{bucket}.json"
    tuner.save_configs(str(saved))
    stored = json.loads(saved.read_text())
    tuner.clear_cache()
    slots = []
    for key in winners:
        op = key.custom_op
        value = stored.get(key.file_key)
        if value is None:
            continue
        policy = value[2:3]  # [policy] or []
        cands, seen, failed = [], set(), []
        first = enum.first.get(op)
        if first is not None:
            default_key = dataclasses.replace(key, runner_class_name=first[0], extras=first[1]).file_key
            cands.append({"key": default_key, "value": [first[0], -1, *policy], "label": f"{first[0]}:-1 (default)",
                          "flashinfer_ms": None})
            seen.add((first[0], repr(-1)))
        for rec in enum.records:
            if rec["custom_op"] != op:
                continue
            sig = (rec["runner"], repr(_tactic_to_json(rec["tactic"])))
            if rec["error"] is not None or rec["extras"] is None:
                failed.append({"runner": rec["runner"], "tactic": _tactic_to_json(rec["tactic"]), "error": rec["error"]})
                continue
            if sig in seen:
                continue
            seen.add(sig)
            k = dataclasses.replace(key, runner_class_name=rec["runner"], extras=rec["extras"]).file_key
            tac = _tactic_to_json(rec["tactic"])
            cands.append({"key": k, "value": [rec["runner"], tac, *policy], "label": f"{rec['runner']}:{tac}",
                          "flashinfer_ms": rec["ms"]})
        win = f"{value[0]}:{value[1]}"
        slots.append({"custom_op": op, "winner_key": key.file_key, "winner": [key.file_key, value], "winner_label": win,
                      "candidates": cands, "failed": failed})
    return slots


# --- 3. timing --------------------------------------------------------------------------------


def span_of(args, op: dict, bucket: int, graph: bool) -> list[int] | None:
    """An eager bucket's token counts, as careful's races take them (``--span``): the entry serves them all."""
    return None if graph else bucket_span(op.get("bucket_rule"), bucket, args.span)


def sweep_slot(race, layer, bucket: int, graph: bool, slot: dict, fixed: dict, work: Path, args, seed: int,
               span: list[int] | None = None) -> dict:
    """Every candidate of one slot timed as the whole call (the other slots at ``fixed``): a screen,
    then the top racing on until the bootstrap says the ranking's top is settled."""
    cands = slot["candidates"]
    assignments = [{**fixed, c["key"]: c["value"]} for c in cands]
    t0 = time.perf_counter()
    r = race(layer, bucket, assignments, None, rounds=args.screen_rounds, warmup=3, cold_l2=True, graph=graph,
             workdir=work, seed=seed, keep_samples=True, screen_rounds=args.screen_rounds,
             batch_rounds=args.batch_rounds, max_rounds=args.max_rounds, keep=args.keep, keep_min=args.keep_min,
             confidence=args.confidence, input_draws=args.input_draws, graph_instances=args.instances, span=span)
    samples, errors, used_graph, settled = r["samples_ms"], r["errors"], r["graph"], r["settle"]
    draws = r.get("samples_draw") or [None] * len(samples)
    rounds, top = settled["rounds"], settled["top"]
    meds = r["medians_ms"]  # settle.center: with input draws, the mean of each draw's median
    best = min(top, key=lambda i: (meds[i], i)) if top else None
    ranking = sorted((i for i in range(len(cands)) if math.isfinite(meds[i])), key=lambda i: meds[i])
    return {
        "candidates": len(cands), "failed_to_run": sum(e is not None for e in errors), "graph": bool(used_graph),
        "rounds": rounds, "shortlist": len(top), "best": best, "best_label": cands[best]["label"] if best is not None else None,
        "best_ms": meds[best] if best is not None else None,
        "best_relative_iqr": relative_iqr(samples[best], draws[best]) if best is not None else None,
        "p_top1": settled["p_top1"], "p_within_tie": settled["p_within_tie"], "runner_up_gap": settled["runner_up_gap"],
        "stable": settled["stable"], "medians_ms": meds, "ranking_idx": ranking,
        "ranking": [{"label": cands[i]["label"], "median_ms": round(meds[i], 6), "runs": len(samples[i]),
                     "flashinfer_ms": cands[i]["flashinfer_ms"]} for i in ranking],
        "errors": {cands[i]["label"]: e for i, e in enumerate(errors) if e},
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _sig(value: list) -> tuple:
    """A cache value's (runner, tactic), the policy left out."""
    return (value[0], repr(value[1]))


def pick_of(cache: dict | None, slot_id: tuple, cands: list[dict]) -> dict:
    """What a kind's cache holds for one slot (none: FlashInfer's fallback, as the engine would run)."""
    from autotune_cache.tree.diff import pick_slots

    entries = pick_slots(cache or {}, {slot_id})
    if not entries:
        d = cands[0]
        return {"key": d["key"], "value": d["value"], "label": d["label"], "missing": True}
    (k, v), = list(entries.items())[:1]
    return {"key": k, "value": list(v), "label": f"{v[0]}:{v[1]}"}


def _load(path: Path) -> dict:
    """A result file as ``_write`` left it, or gzipped as docs/results keeps it."""
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())


def _results(ap, paths: list[Path]) -> list[dict]:
    """The result files ``--report``, ``--aa`` and ``--sweep-vs-h2h`` read, or one usage error naming
    the first that is not one (missing, not a regular file - a FIFO would block the read - or not JSON)."""
    out = []
    for p in paths:
        if not p.is_file():
            ap.error(f"{p}: no such result file")
        try:
            r = _load(p)
        except (OSError, ValueError, EOFError) as e:
            ap.error(f"{p}: not a result file ({type(e).__name__})")
        if not isinstance(r, dict):
            ap.error(f"{p}: not a result file (JSON, but not an object)")
        out.append(r)
    return out


def _resume_source(args) -> Path:
    src = args.resume / f"tactic_exhaustive_{args.workload}.json"
    return src if src.exists() else src.with_name(src.name + ".gz")


def resumed(args) -> tuple[dict, dict, set]:
    """A previous run (``--resume DIR``) to go on with: its picks' caches (not tuned again: a new tune would
    be another pick), its result, and the (op, bucket) it measured. Its files are copied to ``--out``.
    With ``--remeasure`` the picks are kept and everything is measured again, under this run's settings
    (the earlier run's are kept under ``remeasure_of``)."""
    import shutil

    src = _resume_source(args)
    result = _load(src)
    picks = {}
    for kind, meta in result["picks"].items():
        cache = args.resume / f"cache_{args.workload}_{kind}.json"
        if cache.exists():
            picks[kind] = {**meta, "path": str(cache)}
    result["picks"] = {k: v for k, v in result["picks"].items() if k in picks}  # what is measured from here on
    if args.out.resolve() != args.resume.resolve():
        for f in args.resume.glob(f"*_{args.workload}_*.json"):
            shutil.copy2(f, args.out / f.name)
    result.pop("skipped", None)
    if args.remeasure:  # the same picks, a new reference: how far the reference repeats itself
        result["remeasure_of"] = {"path": str(src), "date": result.get("date"), "settings": result.get("settings"),
                                  "gpu": result.get("gpu")}
        earlier = result.get("settings") or {}
        result.update(items=[], layer=[], date=time.strftime("%Y-%m-%d"),  # how the picks were tuned stays theirs
                      settings={**_settings(args), "race_context": bool(earlier.get("race_context"))})
        result.pop("measure_s", None)
    else:
        result["resumed"] = result.get("resumed", 0) + 1
        result["measure_s_earlier"] = result.get("measure_s", 0.0)
    done = {(it["op"], it["bucket"]) for it in result["items"]}
    log(f"resuming {src}: {len(done)} (op, bucket) measured, picks {sorted(picks)}")
    return picks, result, done


def resume_mismatch(args) -> str | None:
    """Why ``--resume`` (without ``--remeasure``) cannot go on with the run: it was timed with other
    input draws or CUDA graphs per candidate, and buckets measured two ways would not compare."""
    earlier = _load(_resume_source(args)).get("settings") or {}
    for key, flag in (("instances", "--instances"), ("input_draws", "--input-draws"), ("span", "--span")):
        had = earlier.get(key, 1)  # a file from before the setting existed ran with one
        if getattr(args, key) != had:
            return (f"--resume {args.resume}: that run used {flag} {had}; give {flag} {had} to go on with it, "
                    "or --remeasure to measure it all again")
    return None


def _settings(args) -> dict:
    return {k: getattr(args, k) for k in ("repeats", "screen_rounds", "batch_rounds", "max_rounds", "pick_rounds", "keep",
                                          "keep_min", "confidence", "buckets", "input_draws", "instances", "span")}


def measure(args, w: dict, plan_path: Path, picks: dict, out_path: Path, result: dict, done: set = frozenset()) -> dict:
    import torch
    from flashinfer.autotuner import autotune

    from autotune_cache.autotuner.rankfile import RESERVED_KEYS
    from autotune_cache.plan.request import TuneRequest
    from autotune_cache.tree.diff import slot_of
    from autotune_cache.tune.careful.race import race
    from autotune_cache.tune.workers.skeleton import OpLayer
    from autotune_cache.tune.session.work import distinct_ops

    plan_json = json.loads(plan_path.read_text())
    plan = TuneRequest.from_dict(plan_json["request"]).plan(Path(tempfile.mkdtemp()))
    ops, _ = distinct_ops(plan)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    result["gpu"] = torch.cuda.get_device_name(dev)
    graph_max = plan.resolution.decode_batch * plan.resolution.attn_dp_size
    result["graph_max_tokens"] = graph_max
    caches = {}
    for kind, p in picks.items():
        if p.get("path"):
            caches[kind] = {k: v for k, v in json.loads(Path(p["path"]).read_text()).items() if k not in RESERVED_KEYS}
    work = Path(tempfile.mkdtemp(prefix="exhaustive-"))
    t_start = time.perf_counter()
    wanted = set(int(b) for b in args.buckets.split(",")) if args.buckets else None
    for i, op in enumerate(ops):
        layer = OpLayer(op, dev, seed=i)
        with autotune(False):
            layer(1)
        torch.cuda.synchronize()
        many = len(ops) > 1
        for b in sorted(op["buckets"]):
            if (wanted is not None and b not in wanted) or (op["id"], b) in done:
                continue
            if args.deadline_s and time.perf_counter() - T0 > args.deadline_s:
                result.setdefault("skipped", []).append(f"{op['id']}@{b}")
                log(f"deadline: {op['id']} @ {b} not measured")
                continue
            graph = b <= graph_max
            span = span_of(args, op, b, graph)
            t0 = time.perf_counter()
            slots = enumerate_slots(torch, layer, b, work)
            t_enum = time.perf_counter() - t0
            anchor = {s["custom_op"]: dict([s["winner"]]) for s in slots}
            rows = []
            for si, s in enumerate(slots):
                fixed = {k: v for o, e in anchor.items() if o != s["custom_op"] for k, v in e.items()}
                sw = sweep_slot(race, layer, b, graph, s, fixed, work, args, seed=7919 * i + 31 * b + si, span=span)
                ranking = sw.pop("ranking_idx")
                best = s["candidates"][sw["best"]] if sw["best"] is not None else None
                if best is not None:
                    anchor[s["custom_op"]] = {best["key"]: best["value"]}
                short = s["custom_op"].rsplit("::", 1)[-1]
                sid = slot_of(s["winner_key"])
                slot_id = (sid.custom_op, sid.profile)
                row = {"op": op["id"], "op_index": i, "slot": f"{op['id']}:{short}" if many else short,
                       "custom_op": s["custom_op"], "bucket": b, "enumeration_s": round(t_enum, 2),
                       "flashinfer_winner": s["winner_label"], "failed_in_tune": s["failed"], **sw,
                       **({"span": span} if span else {}),
                       "_slot_id": slot_id, "_best": best, "_s": s, "_swept_with": fixed,
                       "_next": [s["candidates"][j] for j in ranking if j != sw["best"]][:args.h2h_next]}
                row.pop("medians_ms")
                row["picks"] = {}
                for kind in KINDS:
                    if kind not in caches:
                        continue
                    pk = pick_of(caches[kind], slot_id, s["candidates"])
                    idx = next((j for j, c in enumerate(s["candidates"])
                                if c["value"][0] == pk["value"][0] and repr(c["value"][1]) == repr(pk["value"][1])), None)
                    row["picks"][kind] = {"label": pk["label"], "in_candidates": idx is not None,
                                          "exhaustive_ms": sw["medians_ms"][idx] if idx is not None else None,
                                          "is_best": idx is not None and idx == sw["best"],
                                          **({"missing": True} if pk.get("missing") else {}), "_pick": pk}
                rows.append(row)
            # 4. head to head: the best and each kind's pick, the other slots at their best
            for si, row in enumerate(rows):
                s, best, swept_with = row.pop("_s"), row.pop("_best"), row.pop("_swept_with")
                pks = {k: p.pop("_pick") for k, p in row["picks"].items()}
                if best is None or not pks:
                    row.pop("_next", None)
                    continue
                fixed = {k: v for o, e in anchor.items() if o != s["custom_op"] for k, v in e.items()}
                labels, assignments, index = [_sig(best["value"])], [{**fixed, best["key"]: best["value"]}], {}
                # the exhaustive race's next two race again too, now with the other slots at their
                # best: slots interact (a MoE call's gemm1 and gemm2), and "best" is the fastest here
                for c in row.pop("_next"):
                    labels.append(_sig(c["value"]))
                    assignments.append({**fixed, c["key"]: c["value"]})
                n_ref = len(assignments)
                for kind, pk in pks.items():
                    if _sig(pk["value"]) == _sig(best["value"]):
                        index[kind] = 0
                        continue
                    same = next((j for j, lab in enumerate(labels) if lab == _sig(pk["value"])), None)
                    if same is not None:
                        index[kind] = same
                        continue
                    index[kind] = len(assignments)
                    labels.append(_sig(pk["value"]))
                    assignments.append({**fixed, pk["key"]: pk["value"]})
                if len(assignments) > n_ref or n_ref > 1:
                    hr, drifts = None, []
                    for attempt in range(H2H_ATTEMPTS):
                        r_ = race(layer, b, assignments, None, rounds=args.pick_rounds, warmup=5, cold_l2=True,
                                  graph=graph, input_draws=args.input_draws, graph_instances=args.instances, workdir=work,
                                  seed=104729 + 31 * b + si + 7 * attempt, span=span)
                        # the same assignment as the sweep's best only where the other slots are as the sweep had
                        # them (a MoE's gemm1 is swept before gemm2 found its best): else no drift to judge
                        same = fixed == swept_with and row["best_ms"]
                        drifts.append(r_["medians_ms"][0] / row["best_ms"] - 1 if same else 0.0)
                        if hr is None or abs(drifts[-1]) < abs(drifts[hr[1]]):
                            hr = (r_, attempt)
                        if abs(drifts[-1]) <= H2H_DRIFT:
                            break
                    hr, kept = hr
                    m = hr["medians_ms"]
                    ref = min(range(n_ref), key=lambda j: m[j])
                    row["head_to_head"] = {"best": m[ref], "best_label": f"{labels[ref][0]}:{labels[ref][1]}",
                                           "sweep_best_ms": m[0], **{k: m[j] for k, j in index.items()},
                                           "graph": hr["graph"], "rounds": args.pick_rounds,
                                           **({"drifts": [round(d, 4) for d in drifts], "kept": kept}
                                              if len(drifts) > 1 else {})}
                else:
                    row["head_to_head"] = {"best": None, "note": "every pick is the best"}
                    for kind in index:
                        row["picks"][kind]["is_best"] = True
            # the layer at this token count: each cache's entries for every slot vs every slot at its best
            if caches:
                slot_ids = {row.pop("_slot_id") for row in rows}
                from autotune_cache.tree.diff import pick_slots
                labels = ["best"] + [k for k in KINDS if k in caches]
                assignments = [{k: v for e in anchor.values() for k, v in e.items()}]
                for kind in labels[1:]:
                    assignments.append(pick_slots(caches[kind], slot_ids))
                lr = race(layer, b, assignments, None, rounds=args.pick_rounds, warmup=5, cold_l2=True, graph=graph,
                          input_draws=args.input_draws, graph_instances=args.instances, workdir=work, seed=15485863 + b,
                          span=span)
                result["layer"].append({"op": op["id"], "tokens": b, "graph": lr["graph"],
                                        **{("best_ms" if lab == "best" else lab): lr["medians_ms"][j] for j, lab in enumerate(labels)},
                                        "relative_iqr": lr["relative_iqr"]})
            else:
                for row in rows:
                    row.pop("_slot_id", None)
            result["items"].extend(rows)
            result["measure_s"] = round(result.get("measure_s_earlier", 0.0) + time.perf_counter() - t_start, 1)
            _write(result, out_path)
            log(f"{op['id']} @ {b}: " + ", ".join(f"{r['slot']} {r['candidates']} tactics best {r['best_label']} "
                                                    f"P={r['p_top1']} rounds={r['rounds']} ({r['seconds']} s)" for r in rows))
    return result


#: A head-to-head whose timing of the sweep's best is off the sweep's own by more than this ran in
#: another GPU state, not another ranking: on 4 x H100 with four runs at once, three of 368 head-to-heads
#: timed a 14.4 us fp8 GEMM 14-68% slower than the sweep had (every candidate with it), and their ratios
#: then read +3.6% and +6.7% for picks the sweep put 0.1% and 0.8% from best. Such a race is run again (at most
#: ``H2H_ATTEMPTS`` in all) and the one closest to the sweep kept; every attempt's drift is recorded.
H2H_DRIFT = 0.10
H2H_ATTEMPTS = 3


def _write(result: dict, path: Path) -> None:
    result["summary"] = summarize(result)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=_jsonable))
    os.replace(tmp, path)


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, tuple):
        return list(x)
    return str(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS))
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--kinds", default=None, help=f"picks to tune and compare (default {','.join(KINDS)}; empty: the "
                                                  "reference alone; not with --resume, whose picks are the earlier run's)")
    ap.add_argument("--repeats", type=int, default=3, help="careful: tunes per (op, bucket)")
    ap.add_argument("--buckets", default="", help="only these buckets (comma-separated)")
    ap.add_argument("--screen-rounds", type=int, default=20)
    ap.add_argument("--batch-rounds", type=int, default=60)
    ap.add_argument("--max-rounds", type=int, default=300)
    ap.add_argument("--pick-rounds", type=int, default=100)
    ap.add_argument("--input-draws", type=int, default=DEFAULT_INPUT_DRAWS,
                    help="every race's token inputs rotate over this many draws (careful's FI_AUTOTUNE_RACE_INPUTS "
                         "is set to the same for its warm; default: careful's own)")
    ap.add_argument("--instances", type=int, default=DEFAULT_GRAPH_INSTANCES,
                    help="CUDA graphs per candidate in every graph race, each timed every round (careful's "
                         "FI_AUTOTUNE_GRAPH_INSTANCES is set to the same for its warm; default: careful's own)")
    ap.add_argument("--span", type=int, default=DEFAULT_SPAN,
                    help="token counts over an eager bucket's range every race times (careful's FI_AUTOTUNE_SPAN "
                         "is set to the same for its warm; default: careful's own; 1: the bucket's own count)")
    ap.add_argument("--race-context", action="store_true",
                    help="careful races in context: the workload's other ops run untimed before every timed run "
                         "(FI_AUTOTUNE_RACE_CONTEXT=1 for its warm); the reference itself races without")
    ap.add_argument("--h2h-next", type=int, default=2, help="the exhaustive race's next N race again with the picks")
    ap.add_argument("--keep", type=float, default=0.03)
    ap.add_argument("--keep-min", type=int, default=4)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--deadline-s", type=float, default=0,
                    help="start no bucket after this many seconds since the script started (the rest are listed as skipped)")
    ap.add_argument("--resume", type=Path, default=None,
                    help="a previous run's --out dir: its picks (cache_<workload>_<kind>.json) are reused instead of "
                         "tuned again, and the (op, bucket) it measured are kept, not measured again")
    ap.add_argument("--remeasure", action="store_true",
                    help="with --resume: measure every (op, bucket) again (the same picks, a second reference run)")
    ap.add_argument("--report", type=Path, nargs="*")
    ap.add_argument("--aa", type=Path, nargs="*", help="result files: how far identical candidates in one race read apart")
    ap.add_argument("--sweep-vs-h2h", type=Path, nargs="*",
                    help="result files: how far a pick's gap in the head-to-head is from its gap in the sweep")
    args = ap.parse_args()
    if args.aa:
        print(aa_table(_results(ap, args.aa)))
        return
    if args.sweep_vs_h2h:
        print(sweep_h2h_table(_results(ap, args.sweep_vs_h2h)))
        return
    if args.report:
        runs = []
        for r in _results(ap, args.report):
            r["summary"] = summarize(r)
            print(table(r))
            runs.append(r)
        if len(runs) > 1 and len({r.get("workload") for r in runs}) == 1:  # reference runs of one workload?
            print()
            try:
                print(repeated_table(runs))
            except ValueError as e:
                print(f"(not read as repeated runs of the same picks: {e})")
        return
    if not args.workload:
        ap.error("--workload or --report")
    if min(args.span, args.instances, args.input_draws) < 1:
        ap.error("--span, --instances and --input-draws take 1 or more (1: the bucket's count, one graph, one draw)")
    if args.resume and args.kinds is not None:
        ap.error("--kinds with --resume: the picks are the resumed run's")
    if args.resume and args.race_context:
        ap.error("--race-context with --resume: the picks are the resumed run's, tuned as it tuned them")
    if args.remeasure and not args.resume:
        ap.error("--remeasure goes with --resume DIR")
    if args.resume and not _resume_source(args).is_file():
        ap.error(f"--resume {args.resume}: no tactic_exhaustive_{args.workload}.json(.gz) there")
    if args.resume and not args.remeasure and (why := resume_mismatch(args)):
        ap.error(why)
    if args.remeasure and args.out.resolve() == args.resume.resolve():
        ap.error("--remeasure into the --resume dir would overwrite the run it measures again: give another --out")
    w = WORKLOADS[args.workload]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"exh-{args.workload}-"))
    env = {**_cli_env(work), "FI_AUTOTUNE_RACE_INPUTS": str(args.input_draws),
           "FI_AUTOTUNE_GRAPH_INSTANCES": str(args.instances), "FI_AUTOTUNE_SPAN": str(args.span),
           "FI_AUTOTUNE_RACE_CONTEXT": "1" if args.race_context else "0"}
    plan_path = plan_of(w, work, env)
    kinds = [k for k in (",".join(KINDS) if args.kinds is None else args.kinds).split(",") if k]
    t0 = time.perf_counter()
    out_path = args.out / f"tactic_exhaustive_{args.workload}.json"
    if args.resume:
        picks, result, done = resumed(args)
        measure(args, w, plan_path, picks, out_path, result, done)
        _write(result, out_path)
        print(table(result))
        return
    picks = tune_kinds(kinds, w, plan_path, work, env, args.repeats)
    result = {"workload": args.workload, "label": w["label"], "date": time.strftime("%Y-%m-%d"),
              "settings": {**_settings(args), "race_context": args.race_context},
              "picks": {k: {kk: vv for kk, vv in v.items() if kk != "path"} for k, v in picks.items()},
              "picks_wall_s": round(time.perf_counter() - t0, 1), "items": [], "layer": []}
    for kind, p in picks.items():
        if p.get("path"):
            (args.out / f"cache_{args.workload}_{kind}.json").write_text(Path(p["path"]).read_text())
            manifest = Path(p["path"]).parent / "fi-autotune.manifest.json"
            if kind.startswith("careful") and manifest.exists():  # the races: every candidate's median
                (args.out / f"manifest_{args.workload}_{kind}.json").write_text(manifest.read_text())
    measure(args, w, plan_path, picks, out_path, result)
    _write(result, out_path)
    print(table(result))


if __name__ == "__main__":
    main()
