"""``warm`` and ``verify``: the GPU commands.

Each parses its options into typed requests, calls one library function (``tune.session.session``:
``run_warm``, ``run_fleet``; ``tune.verify``) and prints the result. The machine - its GPUs and
the worker command - comes from click's context object when one is given (tests/standins/fake_gpu_cli.py
runs the real command on fake GPUs that way), else it is this machine.
"""

from __future__ import annotations

import time
from dataclasses import replace

import click

from autotune_cache import registry
from autotune_cache.engines.selection import warm_groups
from autotune_cache.errors import UsageError
from autotune_cache.tune.session.fleetplan import FleetOrder
from autotune_cache.tune.session.fleetrun import DEALS
from autotune_cache.tune.careful.settle import KEEP
from autotune_cache.tune.careful.quality import DEFAULT_INPUT_DRAWS, DEFAULT_SPAN, DEFAULT_THRESHOLD, MAX_ROUNDS, QualitySettings
from autotune_cache.tune.session.session import WarmOptions, WarmRun, run_warm
from autotune_cache.tune.session.publish import writable_store

from ..output import Output
from ..params import json_option, parse_gpus, shard_option, targets_option, timeout_option
from ..progress import Progress
from ..serving import (engine_option_values, engine_options, machine_of, serving_command_argument, serving_options,
                      warm_requests)
from ..targets import fleet_command, note_pool, reject_serving_flags, warm_targets

def _quality(ctx: click.Context, quality: str, repeats: int, threshold: float | None, race_runs: int) -> QualitySettings:
    for name in ("repeats", "threshold", "race_runs"):
        if quality == "quick" and ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            raise UsageError(f"--{name.replace('_', '-')} applies to --quality careful only")
    if threshold is not None and threshold != threshold:
        raise UsageError("--threshold nan: give a fraction between 0 and 1, e.g. 0.01")
    return QualitySettings(quality, repeats=repeats, race_rounds=race_runs,
                           threshold=DEFAULT_THRESHOLD if threshold is None else threshold)


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
@engine_options
@click.option("--quality", type=click.Choice(["quick", "careful"]), default="quick", show_default=True,
              help="quick: one FlashInfer tune per (op, bucket), as the engine does at startup. careful: --repeats "
                   "tunes, then every tactic they timed races FlashInfer's default head to head (interleaved, the "
                   "median per input draw; CUDA graphs at decode sizes, cold L2, the token inputs rotating over "
                   f"{DEFAULT_INPUT_DRAWS} draws, or for an eager bucket {DEFAULT_SPAN} token counts of the range its "
                   "entry serves; a short screen, then the close ones until the fastest is "
                   "settled), and each MoE call's best GEMM pairs race again; the default stays unless beaten by "
                   "--threshold.")
@click.option("--repeats", type=click.IntRange(2, 20), default=3, show_default=True,
              help="careful: independent tunes per (op, bucket), spread over the GPUs.")
@click.option("--threshold", type=click.FloatRange(0, 1), default=None, metavar="FRACTION",
              help="careful: keep FlashInfer's default unless a tuned tactic is at least this much faster "
                   f"[default: {DEFAULT_THRESHOLD}, i.e. {DEFAULT_THRESHOLD:.1%}; docs/quality.md measures why].")
@click.option("--race-runs", type=click.IntRange(5, 10000), default=50, show_default=True,
              help=f"careful: timed runs at least per candidate that passes a race's screen (those within {KEEP:.0%} of "
                   f"the fastest race on, up to {MAX_ROUNDS} runs, until the fastest is settled).")
@targets_option
@click.option("--deal", type=click.Choice(DEALS), default="targets", show_default=True,
              help="With --targets: targets = target by target in the file's order (the first targets are written "
                   "and pushed earliest); longest = the costliest work first across the whole fleet (no faster on "
                   "the measured batches: docs/fleet.md).")
@shard_option
@click.option("--push", "push_url", default=None, metavar="URL",
              help="Publish each entry to this store (s3://, gs://, file://) as soon as it is written.")
@timeout_option
@json_option
@serving_command_argument
@click.pass_context
def warm_cmd(ctx, gpus, force, layouts, quality, repeats, threshold, race_runs, targets_file, deal, shard, push_url,
             as_json, **kw):
    """Tune the plan on this machine's GPUs and write every rank file where the engine looks.

    The serving flags can also come from the serving command itself, after `--`. With
    --targets, a whole list of targets on one pool of workers: identical calls tuned once, each
    target written (and pushed) as soon as its last bucket is done (docs/fleet.md).
    """
    t0 = time.perf_counter()
    n = parse_gpus(gpus)
    out = Output(as_json)
    settings = _quality(ctx, quality, repeats, threshold, race_runs)
    groups = warm_groups(layouts)
    opts = WarmOptions(n, force, None, machine_of(ctx), deal=deal)
    if targets_file:
        reject_serving_flags(ctx)
        registry.default_engine().refuse_foreign_options(engine_option_values(dict(kw)))
        if quality != "quick" or ctx.get_parameter_source("layouts") == click.core.ParameterSource.COMMANDLINE:
            raise UsageError("with --targets: quick mode, and each target's layouts in the file")
        warm_targets(kw, opts, targets_file, shard, push_url, out, t0)
        return
    if shard:
        raise UsageError("--shard goes with --targets")
    opts = replace(opts, store=writable_store(push_url))
    served = warm_requests(ctx, kw, out)
    groups = served.groups
    units = [(g, r) for g, request in zip(groups, served.requests) for r in request.workers()]
    if len(units) > 1:
        # Two engines' calls (they differ in their keys), or a speculative target and its draft
        # worker: one run on one pool of workers, each entry written when its buckets are done.
        if quality != "quick":
            raise UsageError("--quality careful tunes one engine's calls at a time: give --layout "
                             + " or --layout ".join(g.layout for g in groups) if len(groups) > 1 else
                             "--quality careful tunes one entry at a time; with speculative decoding warm writes "
                             "two (target and draft): use --quality quick")
        fleet_command(FleetOrder(served.rooting, entries=tuple(units)), opts, push_url, out, t0)
        return
    ((group, request),) = units
    progress = Progress(not as_json)
    try:
        run = run_warm(request, served.rooting, opts, layouts=group.layouts, quality=settings, progress=progress)
    finally:
        progress.close()  # before main() prints an interruption (exit 130)
    run.result.timings["command_wall_s"] = round(time.perf_counter() - t0, 3)
    _emit_warm(out, run, opts)


def _emit_warm(out: Output, run: WarmRun, opts: WarmOptions) -> None:
    result, extra, pushed = run.result, run.published.converted, run.published.pushed
    for w in run.plan.version_warnings:  # the tuning may not be what the server uses
        out.warn(w)

    def human() -> None:
        for name, r in extra.items():
            out.line(f"{name}: {r.written} entries written, {r.unchanged} unchanged in {r.env_dir}")
        if pushed is not None:
            out.line(f"{'pushed' if pushed.pushed else 'unchanged in'} {opts.store}: {run.plan.entry_id}")
        if result.status != "written":
            out.line(f"{result.message}: {result.key_dir}")
            return
        t = result.timings
        racing = f", racing {t['racing_s']:.1f} s" if "racing_s" in t else ""
        served = " on served workers" if t.get("pool", {}).get("source") == "served" else ""
        out.line(f"Tuned {result.profiles_tuned} of {result.profiles_total} profiles on {result.gpus} GPU(s){served} in "
                 f"{t['command_wall_s']:.1f} s (startup/import {t['startup_import_s']:.1f} s, JIT {t['jit_s']:.1f} s, "
                 f"tuning {t['tuning_s']:.1f} s{racing}, writing {t['write_s']:.2f} s)")
        compiled = [m for m in t.get("kernel_modules", ()) if m["how"] == "compiled"]
        if compiled:  # a fresh machine's JIT: what prebuilt kernels would save (docs/warm.md)
            out.line(f"Compiled {len(compiled)} FlashInfer kernel module(s), {t['compiling_s']:.1f} s of the JIT: "
                     + ", ".join(f"{m['module']} {m['seconds']:.1f} s" for m in compiled))
        if result.selection:
            out.line("Careful: " + describe_summary(result.selection))
        if result.rank_files:
            out.line(f"Wrote {len(result.rank_files)} rank files + manifest to {result.key_dir}")
        else:  # FlashInfer's managed store: one entry per key
            out.line(f"Published into FlashInfer's managed store: {result.message.removeprefix('published ')}")

    note_pool(out, result.timings)
    # ``workers``: the one entry as a several-entry run lists each (warm --targets, speculative
    # decoding), so `jq '.workers[].status'` reads every warm alike.
    worker = {"name": "target", "target": None, "worker": "target", "id": run.plan.id_str,
              "key_dir": result.key_dir, "status": result.status, "message": result.message,
              "profiles": result.profiles_total, "layouts": [run.plan.layout, *extra]}
    out.emit(human=human, data=lambda: {**result.to_dict(), "workers": [worker],
                                        "layouts": {k: v.to_dict() for k, v in extra.items()},
                                        **({"push": pushed.to_dict()} if pushed is not None else {})})


def describe_summary(s: dict) -> str:
    """One line over a careful run's per-bucket choices (``quality.selection_summary``)."""
    margin = s.get("median_margin_over_default")
    return (f"{s['buckets']} (op, bucket): {s['tuned_written']} tuned tactics written"
            + (f" (median {margin:.1%} faster than the default)" if margin is not None else "")
            + f", {s['default_kept_by_floor']} kept the default (under the threshold), {s['default_fastest']} default "
              f"fastest; tunes unanimous on {s['tunes_unanimous']}")
