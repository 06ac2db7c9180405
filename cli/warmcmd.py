"""``warm`` and ``verify``: the GPU commands."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from autotune_cache.errors import ExitCode, FiAutotuneError, UsageError
from autotune_cache.plan.request import TuneRequest

from .output import Output
from .params import json_option, resolve_root, shard_option, targets_option
from .plancmd import (apply_serving_command, build_plan, reject_vllm_only, request_from, serving_command_argument,
                       serving_options, vllm_options, vllm_request)


def _gpus(value: str | None) -> int | None:
    if value in (None, "all"):
        return None
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"--gpus takes a number or 'all', got {value!r}") from None
    if n < 1:
        raise UsageError(f"--gpus must be >= 1, got {n}")
    return n


class _Progress:
    """One overall bar on a TTY; a line per 10% otherwise."""

    UNITS = {"tuning": "profile", "racing": "race"}

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.bar = None
        self.phase = None
        self.last_decile = -1

    def __call__(self, done: int, total: int, what: str, phase: str = "tuning") -> None:
        if not self.enabled:
            return
        unit = self.UNITS.get(phase, "item")
        if phase != self.phase:  # careful mode races after tuning: a bar (or decile count) each
            self.close()
            self.phase, self.last_decile = phase, -1
        if self.tty:
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=done, unit=unit, desc=phase, file=sys.stderr)
            self.bar.n = done
            self.bar.set_postfix_str(what[:40], refresh=True)
            return
        decile = 10 * done // max(total, 1)
        if decile != self.last_decile:
            self.last_decile = decile
            click.echo(f"fi-autotune: {phase} {done}/{total} {unit}s ({what})", err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@click.command("warm")
@serving_options
@click.option("--gpus", default="all", show_default=True, help="How many local GPUs to spread the work over.")
@click.option("--force", is_flag=True, help="Tune again even if a complete entry exists (and replace one tuned on another GPU model).")
@click.option("--layout", "layouts", default="sglang", show_default=True,
              help="Every reader to write the tuning for, comma-separated: sglang (rank files), flashinfer-v2 "
                   "(FlashInfer's managed store, under $FLASHINFER_AUTOTUNE_CACHE_DIR or ~/.cache/flashinfer/autotune, "
                   "from the sglang tuning), vllm (vLLM's rank files under $VLLM_CACHE_ROOT; vllm-dir: under "
                   "$VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR). vLLM's calls differ from SGLang's, so with both each is "
                   "tuned, in one run. --cache-dir is the root of sglang if listed, else of vllm.")
@vllm_options
@click.option("--quality", type=click.Choice(["quick", "careful"]), default="quick", show_default=True,
              help="quick: one FlashInfer tune per (op, bucket), as the engine does at startup. careful: --repeats "
                   "tunes, then their winners race FlashInfer's default head to head (interleaved, many runs, "
                   "median; CUDA graphs at decode sizes, cold L2); the default stays unless beaten by --threshold.")
@click.option("--repeats", type=click.IntRange(2, 20), default=3, show_default=True,
              help="careful: independent tunes per (op, bucket), spread over the GPUs.")
@click.option("--threshold", type=click.FloatRange(0, 1), default=None, metavar="FRACTION",
              help="careful: keep FlashInfer's default unless a tuned tactic is at least this much faster "
                   "[default: 0.01, i.e. 1%; docs/quality.md measures why].")
@click.option("--race-runs", type=click.IntRange(5, 10000), default=50, show_default=True,
              help="careful: timed runs per candidate in a race.")
@targets_option
@shard_option
@click.option("--push", "push_url", default=None, metavar="URL",
              help="Publish each entry to this store (s3://, gs://, file://) as soon as it is written.")
@json_option
@serving_command_argument
@click.pass_context
def warm_cmd(ctx, gpus, force, layouts, quality, repeats, threshold, race_runs, targets_file, shard, push_url,
             as_json, **kw):
    """Tune the plan on this machine's GPUs and write every rank file where the engine looks.

    The serving flags can also come from the serving command itself, after `--`. With
    --targets, a whole list of targets on one pool of workers: identical calls tuned once, each
    target written (and pushed) as soon as its last bucket is done (docs/fleet.md).
    """
    from autotune_cache.tune.quality import DEFAULT_THRESHOLD, QualitySettings

    import time

    from autotune_cache.tune.warm import WorkerPool, warm

    t0 = time.perf_counter()
    n = _gpus(gpus)
    for name in ("repeats", "threshold", "race_runs"):
        if quality == "quick" and ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            raise UsageError(f"--{name.replace('_', '-')} applies to --quality careful only")
    if threshold is not None and threshold != threshold:
        raise UsageError("--threshold nan: give a fraction between 0 and 1, e.g. 0.01")
    settings = QualitySettings(quality, repeats=repeats, race_rounds=race_runs,
                               threshold=DEFAULT_THRESHOLD if threshold is None else threshold)
    wanted = warm_layouts(layouts)
    vllm_layout = next((x for x in wanted if x.startswith("vllm")), None)
    if targets_file:
        from .targetscmd import reject_serving_flags, warm_targets

        reject_serving_flags(ctx)
        reject_vllm_only(kw)
        if quality != "quick" or ctx.get_parameter_source("layouts") == click.core.ParameterSource.COMMANDLINE:
            raise UsageError("with --targets: quick mode, and each target's layouts in the file")
        warm_targets(kw, n, force, targets_file, shard, push_url, Output(as_json), t0)
        return
    if shard:
        raise UsageError("--shard goes with --targets")
    store = _writable_store(push_url)
    kw = apply_serving_command(ctx, kw, Output(as_json))
    request = request_from(kw)
    if vllm_layout is None:
        reject_vllm_only(kw)
        if len(request.workers()) > 1:
            # Speculative decoding: the target and the draft worker tune into two entries, both
            # from one run on one pool of workers (each written when its buckets are done).
            if quality != "quick":
                raise UsageError("--quality careful tunes one entry at a time; with speculative decoding "
                                 "warm writes two (target and draft): use --quality quick")
            warm_workers(request, kw, n, force, push_url, wanted, Output(as_json), t0)
            return
    else:
        vllm_req = vllm_request(request, kw, vllm_layout)
        if "sglang" in wanted:
            if quality != "quick":
                raise UsageError("--quality careful tunes one engine's calls at a time: give --layout sglang or "
                                 f"--layout {vllm_layout}")
            warm_engines(request, vllm_req, kw, n, force, push_url, wanted, Output(as_json), t0)
            return
        request = vllm_req
    # Workers import torch and flashinfer and create their CUDA contexts while this process
    # plans; with --gpus N they start before even the GPU count is checked.
    pool = WorkerPool(n) if n is not None else None
    out = Output(as_json)
    try:
        info = gpus_for_warm(n, "`fi-autotune plan`")
        pool = pool or WorkerPool(info.count)
        progress = _Progress(not as_json)
        try:
            plan = build_plan(request, kw["cache_dir"], arch=info.arch)
            result = warm(plan, gpus=n, force=force, progress=progress, gpu_info=info, pool=pool, quality=settings)
        finally:
            progress.close()  # before main() prints an interruption (exit 130)
    finally:
        if pool is not None:
            pool.close()
    extra = {}
    if "flashinfer-v2" in wanted and result.status in ("written", "complete"):
        extra["flashinfer-v2"] = _also_v2(plan, out)
    pushed = push_entry(store, plan) if store is not None and result.status in ("written", "complete") else None
    result.timings["command_wall_s"] = round(time.perf_counter() - t0, 3)

    def human() -> None:
        for name, r in extra.items():
            out.line(f"{name}: {r.written} entries written, {r.unchanged} unchanged in {r.env_dir}")
        if pushed is not None:
            out.line(f"{'pushed' if pushed.pushed else 'unchanged in'} {store}: {plan.entry_id}")
        if result.status != "written":
            out.line(f"{result.message}: {result.key_dir}")
            return
        t = result.timings
        racing = f", racing {t['racing_s']:.1f} s" if "racing_s" in t else ""
        out.line(f"Tuned {result.profiles_tuned} of {result.profiles_total} profiles on {result.gpus} GPU(s) in "
                 f"{t['command_wall_s']:.1f} s (startup/import {t['startup_import_s']:.1f} s, JIT {t['jit_s']:.1f} s, "
                 f"tuning {t['tuning_s']:.1f} s{racing}, writing {t['write_s']:.2f} s)")
        if result.selection:
            out.line("Careful: " + describe_summary(result.selection))
        out.line(f"Wrote {len(result.rank_files)} rank files + manifest to {result.key_dir}")

    out.emit(human=human, data=lambda: {**result.to_dict(), "layouts": {k: v.to_dict() for k, v in extra.items()},
                                        **({"push": pushed.to_dict()} if pushed is not None else {})})


def warm_layouts(text: str) -> list[str]:
    """``--layout`` of warm, checked: which trees one tuning run writes."""
    wanted = [x.strip() for x in text.split(",") if x.strip()]
    known = ("sglang", "flashinfer-v2", "vllm", "vllm-dir")
    unknown = [x for x in wanted if x not in known]
    if unknown or not wanted:
        raise UsageError(f"--layout {text!r}: warm writes {', '.join(known)} (comma-separated)")
    if "vllm" in wanted and "vllm-dir" in wanted:
        raise UsageError("--layout: vllm or vllm-dir (vLLM reads one of them), not both")
    if "flashinfer-v2" in wanted and "sglang" not in wanted:
        raise UsageError("--layout flashinfer-v2 is written from the sglang tuning: --layout sglang,flashinfer-v2")
    return wanted


def warm_engines(request: TuneRequest, vllm_req: TuneRequest, kw: dict, n, force: bool, push_url, wanted: list[str],
                 out: Output, t0: float) -> None:
    """``--layout sglang,vllm``: both engines' calls (they differ in their keys) tuned in one run on
    one pool of workers - a fleet of two targets - each written as soon as its buckets are done."""
    from autotune_cache.tune.fleet import FleetItem

    from .targetscmd import run_fleet

    vllm_layout = vllm_req.vllm.layout

    def load(info):
        sglang_layouts = tuple(x for x in wanted if not x.startswith("vllm"))
        return [FleetItem("sglang", build_plan(request, kw["cache_dir"], arch=info.arch), sglang_layouts),
                FleetItem(vllm_layout, build_plan(vllm_req, None, arch=info.arch), (vllm_layout,))], None

    run_fleet(load, n, force, push_url, out, t0, "`fi-autotune plan`")


def warm_workers(request: TuneRequest, kw: dict, n, force: bool, push_url, wanted: list[str], out: Output,
                 t0: float) -> None:
    """A speculative-decoding command: the target's and the draft worker's entries, as a fleet of two."""
    from autotune_cache.tune.fleet import FleetItem

    from .targetscmd import run_fleet

    layouts = tuple(wanted)

    def load(info):
        return [FleetItem(r.worker, build_plan(r, kw["cache_dir"], arch=info.arch), layouts)
                for r in request.workers()], None

    run_fleet(load, n, force, push_url, out, t0, "`fi-autotune plan`")


def gpus_for_warm(n: int | None, plan_hint: str):
    """This machine's GPUs, or a usage error: none at all, or fewer than ``--gpus`` asks for."""
    from autotune_cache.tune.warm import detect_gpus

    info = detect_gpus()
    if info.count == 0:
        raise UsageError(f"no CUDA GPU found: warm needs one ({plan_hint} shows the plan without a GPU)")
    if n is not None and n > info.count:
        raise UsageError(f"--gpus {n}: this machine has {info.count} GPU(s)")
    return info


def _writable_store(url: str | None):
    """The --push store, checked before any tuning (a typo costs nothing then)."""
    if url is None:
        return None
    from autotune_cache.tree.store import Store, is_store_url

    if not is_store_url(url):
        raise UsageError(f"--push {url!r}: give a store URL (s3://, gs://, file://)")
    store = Store(url)
    store.check_writable()
    return store


def push_entry(store, plan):
    """One written entry to the store (bundle first, then its record)."""
    from autotune_cache.tree.scan import scan_entry
    from autotune_cache.tree.store import bundle_of

    layout = plan.layout_obj
    entry = scan_entry(layout, plan.key_dir, plan.entry_id)
    return store.push(layout, [(entry, bundle_of(layout, entry))])


def describe_summary(s: dict) -> str:
    """One line over a careful run's per-bucket choices (``warm.selection_summary``)."""
    margin = s.get("median_margin_over_default")
    return (f"{s['buckets']} (op, bucket): {s['tuned_written']} tuned tactics written"
            + (f" (median {margin:.1%} faster than the default)" if margin is not None else "")
            + f", {s['default_kept_by_floor']} kept the default (under the threshold), {s['default_fastest']} default "
              f"fastest; tunes unanimous on {s['tunes_unanimous']}")


def _also_v2(plan, out: Output):
    """The tuning just committed (or already there), written into FlashInfer's own store too."""
    from autotune_cache.registry import get_layout
    from autotune_cache.tree.scan import scan_entry

    from autotune_cache.tree.convert import convert_entry

    entry = scan_entry(get_layout("sglang"), plan.key_dir, plan.entry_id)
    result, _ = convert_entry(entry, "flashinfer-v2", get_layout("flashinfer-v2").default_root().path)
    return result


def _request_of(entry) -> TuneRequest:
    """The request warm recorded in an entry's manifest (format 2), or its raw flags (format 1)."""
    m = entry.manifest
    if m is None:
        raise UsageError(f"{entry.id} was not written by fi-autotune warm: give --model and the server's flags")
    try:
        if m.request is not None:
            return TuneRequest.from_dict(m.request)
        if "plan_args" in m.extra:
            return TuneRequest.from_plan_args(dict(m.extra["plan_args"]))
    except (KeyError, TypeError, ValueError) as e:
        raise FiAutotuneError(f"{entry.id}: its manifest's request cannot be replayed here ({e}); "
                              "give --model and the server's flags") from None
    raise UsageError(f"{entry.id} was not written by fi-autotune warm: give --model and the server's flags")


@click.command("verify")
@click.argument("ref", required=False, metavar="[ID]")
@serving_options(model_required=False)
@json_option
@click.pass_context
def verify_cmd(ctx, ref, as_json, **kw):
    """Replay the engine's startup pass against a cache on this GPU; exit 1 unless every lookup hits.

    Name the entry by its ID (as `ls` prints it; a unique key or the entry's directory work too;
    flags from the manifest warm wrote), by --model alone (the entry warm wrote for that model),
    or by --model with the server's flags (any entry those flags map to, engine-written ones included).
    """
    from autotune_cache.tree.scan import scan_cache
    from autotune_cache.tune.verify import verify

    flags_given = [k for k in kw if k not in ("model", "cache_dir")
                   and ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE]
    if ref is None and kw["model"] is None:
        raise UsageError("give an entry ID or --model")
    if ref is None and flags_given:
        plan = build_plan(request_from(kw), kw["cache_dir"])
        key_dir = plan.key_dir
        if not key_dir.is_dir():
            raise FiAutotuneError(f"no cache entry at {key_dir} (id {plan.entry_id} for these flags)")
    else:
        root = resolve_root(kw["cache_dir"], must_exist=True).path
        info = scan_cache(root)
        if ref is not None:
            entries = info.resolve([ref])
        else:
            entries = [e for e in info.entries if e.model == kw["model"]]
            if not entries:
                raise FiAutotuneError(f"no cache entry for {kw['model']!r} under {root}")
            if len(entries) > 1:
                raise UsageError(f"{kw['model']!r} has {len(entries)} entries; give one id: "
                                 + ", ".join(str(e.id) for e in entries))
        entry = entries[0]
        plan = build_plan(_request_of(entry), str(root))
        if plan.key != entry.key:
            raise FiAutotuneError(f"the recorded request now maps to key {plan.key}, not {entry.key}")
        key_dir = entry.path
    report = verify(plan, key_dir)
    out = Output(as_json)

    def human() -> None:
        for w in report.workloads:
            state = "metadata accepted" if w.metadata_accepted else "METADATA REJECTED by FlashInfer here"
            out.line(f"{Path(w.rank_file).name} (x{w.ranks} ranks): {w.hits}/{w.lookups} lookups hit, "
                     f"{w.retuned} would be tuned again, replay {w.replay_s:.2f} s, {state}")
        pct = 100.0 * report.hits / report.lookups if report.lookups else 0.0
        out.line(f"{'OK' if report.ok else 'INCOMPLETE'}: {report.hits}/{report.lookups} hits ({pct:.1f}%)")

    out.emit(human=human, data=report.to_dict)
    if not report.ok:
        raise click.exceptions.Exit(int(ExitCode.FAILURE))
