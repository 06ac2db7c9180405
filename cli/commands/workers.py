"""``workers start|status|stop``: GPU workers that stay up between warms
(``autotune_cache.tune.workers.served``), so that a warm after the first skips the 5-7 s every
fresh worker spends importing torch and FlashInfer (docs/fleet.md)."""

from __future__ import annotations

import time

import click

from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.tune.workers import served

from ..output import Output
from ..params import json_option, parse_gpus
from ..serving import machine_of


@click.group("workers")
def workers_cmd():
    """GPU workers that stay up between warms (one per GPU).

    `start` imports torch and FlashInfer and creates each GPU's CUDA context once; every `warm`
    after it (and `warm --targets`) uses them when it runs in the same environment, and starts
    its own workers otherwise, saying why. They exit after --idle-timeout seconds unused.
    """


@workers_cmd.command("start")
@click.option("--gpus", default="all", show_default=True, help="How many local GPUs to serve (the first N visible).")
@click.option("--idle-timeout", type=click.FloatRange(min=1), default=served.IDLE_S, show_default=True,
              help="Seconds without a warm after which each worker exits.")
@json_option
@click.pass_context
def start_cmd(ctx, gpus, idle_timeout, as_json):
    """Start one worker per GPU and wait until each is ready."""
    out = Output(as_json, command="workers")
    machine = machine_of(ctx)
    n = parse_gpus(gpus)
    info = machine.usable_gpus(n, "`fi-autotune plan`")
    n = n or info.count
    t0 = time.perf_counter()
    existing = served.ServedPool.load()
    if existing is not None and existing.alive() and len(existing.workers) != n:
        raise UsageError(f"{len(existing.workers)} served workers already run: `fi-autotune workers stop` first")
    try:
        pool, started = served.start(n, machine.worker_argv, idle_timeout)
    except RuntimeError as e:
        raise FiAutotuneError(str(e)) from None
    wait = time.perf_counter() - t0
    out.emit(human=lambda: out.line(f"{'started' if started else 'already running:'} {len(pool.workers)} worker(s)"
                                    + (f" in {wait:.1f} s" if started else "") + f"; idle timeout {pool.idle_s:.0f} s"),
             data=lambda: {"action": "start", "started": started, "seconds": round(wait, 3), **_status(pool)})


@workers_cmd.command("status")
@json_option
def status_cmd(as_json):
    """The served workers: pid, GPU, alive. Exit 1 when none is running."""
    out = Output(as_json, command="workers")
    pool = served.ServedPool.load()
    data = {"action": "status", **(_status(pool) if pool is not None else {"workers": []})}

    def human() -> None:
        if pool is None:
            out.line("no served workers")
            return
        out.table(["WORKER", "PID", "GPU", "STATE", "LOG"], [[str(w.index), str(w.pid), w.device,
                                                               "alive" if w.alive() else "exited", w.log]
                                                              for w in pool.workers])
    out.emit(human=human, data=lambda: data)
    if pool is None or not pool.alive():
        raise click.exceptions.Exit(1)


@workers_cmd.command("stop")
@json_option
def stop_cmd(as_json):
    """Stop the served workers (a warm using them fails, as when its own worker is killed)."""
    out = Output(as_json, command="workers")
    stopped = served.stop()
    out.emit(human=lambda: out.line(f"stopped {len(stopped)} worker(s)" if stopped else "no served workers were running"),
             data=lambda: {"action": "stop", "stopped": stopped})


def _status(pool: served.ServedPool) -> dict:
    return {"workers": [w.to_dict() for w in pool.workers], "started_at": pool.started, "idle_s": pool.idle_s,
            "state": str(served.state_dir())}
