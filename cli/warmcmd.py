"""``warm`` and ``verify``: the GPU commands."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from autotune_cache.errors import FiAutotuneError, UsageError

from .main import cli, json_option, resolve_root
from .output import Output
from .plancmd import build_plan, serving_options


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

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.bar = None
        self.last_decile = -1

    def __call__(self, done: int, total: int, what: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=done, unit="profile", desc="tuning", file=sys.stderr)
            self.bar.n = done
            self.bar.set_postfix_str(what[:40], refresh=True)
            return
        decile = 10 * done // max(total, 1)
        if decile != self.last_decile:
            self.last_decile = decile
            click.echo(f"fi-autotune: {done}/{total} profiles ({what})", err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@cli.command("warm")
@serving_options
@click.option("--gpus", default="all", show_default=True, help="How many local GPUs to spread the work over.")
@click.option("--force", is_flag=True, help="Tune again even if a complete entry exists.")
@json_option
def warm_cmd(gpus, force, as_json, **kw):
    """Tune the plan on this machine's GPUs and write every rank file where the engine looks."""
    import time

    from autotune_cache.warm import Interrupted, WorkerPool, detect_gpus, warm

    t0 = time.perf_counter()
    n = _gpus(gpus)
    # Workers import torch and flashinfer and create their CUDA contexts while this process
    # plans; with --gpus N they start before even the GPU count is checked.
    pool = WorkerPool(n) if n is not None else None
    try:
        info = detect_gpus()
        if info.count == 0:
            raise UsageError("no CUDA GPU found: warm needs one (`fi-autotune plan` shows the plan without a GPU)")
        if n is not None and n > info.count:
            raise UsageError(f"--gpus {n}: this machine has {info.count} GPU(s)")
        pool = pool or WorkerPool(info.count)
        out = Output(as_json)
        progress = _Progress(not as_json)
        try:
            plan = build_plan(kw, arch=kw["arch"] or info.arch)
            result = warm(plan.to_dict() | {"plan_args": kw}, gpus=n, force=force, progress=progress, gpu_info=info, pool=pool)
        except Interrupted as e:
            progress.close()
            click.echo(f"fi-autotune: {e}", err=True)
            raise click.exceptions.Exit(130)
        finally:
            progress.close()
    finally:
        if pool is not None:
            pool.close()
    result.timings["command_wall_s"] = round(time.perf_counter() - t0, 3)
    if as_json:
        out.json(result.to_dict())
        return
    if result.status != "written":
        out.line(f"{result.message}: {result.key_dir}")
        return
    t = result.timings
    out.line(f"Tuned {result.profiles_tuned} of {result.profiles_total} profiles on {result.gpus} GPU(s) in {t['command_wall_s']:.1f} s "
             f"(startup/import {t['startup_import_s']:.1f} s, JIT {t['jit_s']:.1f} s, tuning {t['tuning_s']:.1f} s, "
             f"writing {t['write_s']:.2f} s)")
    out.line(f"Wrote {len(result.rank_files)} rank files + manifest to {result.key_dir}")


@cli.command("verify")
@click.argument("ref", required=False, metavar="[KEY|PATH]")
@serving_options(model_required=False)
@json_option
@click.pass_context
def verify_cmd(ctx, ref, as_json, **kw):
    """Replay the engine's startup pass against a cache on this GPU; exit 1 unless every lookup hits.

    Name the entry by KEY or key dir PATH (flags from the manifest warm wrote), by --model alone
    (the entry warm wrote for that model), or by --model with the server's flags (any entry those
    flags map to, engine-written ones included).
    """
    from autotune_cache.scan import scan_cache
    from autotune_cache.verify import verify

    root = resolve_root(kw["cache_dir"])
    flags_given = [k for k in kw if k not in ("model", "cache_dir")
                   and ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE]
    if ref is None and kw["model"] is None:
        raise UsageError("give a KEY, a key dir PATH or --model")
    if ref is None and flags_given:
        plan = build_plan(kw).to_dict()
        key_dir = Path(plan["key_dir"])
        if not key_dir.is_dir():
            raise FiAutotuneError(f"no cache entry at {key_dir} (key {plan['key']} for these flags)")
    else:
        info = scan_cache(root)
        entries = info.find(ref) if ref is not None else [e for e in info.entries if e.model == kw["model"]]
        what = ref or kw["model"]
        if not entries:
            raise FiAutotuneError(f"no cache entry for {what!r} under {root}")
        if len(entries) > 1:
            raise UsageError(f"{what!r} matches {len(entries)} entries: name one by path ({', '.join(e.id for e in entries)})")
        entry = entries[0]
        if entry.manifest is None or "plan_args" not in entry.manifest.extra:
            raise UsageError(f"{entry.id} was not written by fi-autotune warm: give --model and the server's flags")
        args = dict(entry.manifest.extra["plan_args"])
        args["cache_dir"] = str(root)
        plan = build_plan(args).to_dict()
        if plan["key"] != entry.key:
            raise FiAutotuneError(f"the recorded flags now map to key {plan['key']}, not {entry.key}")
        key_dir = entry.path
    report = verify(plan, key_dir)
    out = Output(as_json)
    if as_json:
        out.json(report.to_dict())
    else:
        for w in report.workloads:
            state = "metadata accepted" if w.metadata_accepted else "METADATA REJECTED by FlashInfer here"
            out.line(f"{Path(w.rank_file).name} (x{w.ranks} ranks): {w.hits}/{w.lookups} lookups hit, "
                     f"{w.retuned} would be tuned again, replay {w.replay_s:.2f} s, {state}")
        pct = 100.0 * report.hits / report.lookups if report.lookups else 0.0
        out.line(f"{'OK' if report.ok else 'INCOMPLETE'}: {report.hits}/{report.lookups} hits ({pct:.1f}%)")
    if not report.ok:
        raise click.exceptions.Exit(1)
