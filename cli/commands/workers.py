"""``workers start|status|stop``: GPU workers that stay up between warms
(``autotune_cache.tune.workers.served``), so that a warm after the first skips the 5-7 s every
fresh worker spends importing torch and FlashInfer (docs/fleet.md)."""

from __future__ import annotations

import math
import time

import click

from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.tune.workers import served
from autotune_cache.tune.workers.servedstate import ServedPool, StateError, state_dir

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
@click.option("--idle-timeout", type=float, default=served.IDLE_S, show_default=True,
              help="Seconds without a warm after which each worker exits (1 to 10000000).")
@json_option
@click.pass_context
def start_cmd(ctx, gpus, idle_timeout, as_json):
    """Start one worker per GPU and wait until each is ready."""
    out = Output(as_json, command="workers")
    if not (math.isfinite(idle_timeout) and 1 <= idle_timeout <= served.MAX_IDLE_S):
        raise UsageError(f"--idle-timeout takes seconds from 1 to {served.MAX_IDLE_S:.0f}, got {idle_timeout}")
    machine = machine_of(ctx)
    n = parse_gpus(gpus)
    info = machine.usable_gpus(n, None)
    n = n or info.count
    t0 = time.perf_counter()
    try:
        pool, started = served.start(n, machine.worker_argv, idle_timeout)
    except (RuntimeError, StateError) as e:
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
    pool = _load()
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
    try:
        stopped = served.stop()
    except StateError as e:
        raise FiAutotuneError(f"{e}: nothing was stopped", hint="stop the processes its workers' logs name, "
                              "then remove the file") from None
    out.emit(human=lambda: out.line(f"stopped {len(stopped)} worker(s)" if stopped else "no served workers were running"),
             data=lambda: {"action": "stop", "stopped": stopped})


def _load() -> ServedPool | None:
    try:
        return ServedPool.load(state_dir())
    except StateError as e:
        raise FiAutotuneError(str(e)) from None


def _status(pool: ServedPool) -> dict:
    return {"workers": [w.to_dict() for w in pool.workers], "started_at": pool.started, "idle_s": pool.idle_s,
            "state": str(state_dir())}
