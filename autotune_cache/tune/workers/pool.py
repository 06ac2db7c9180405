"""The worker processes of one warm: one per GPU, each bound with CUDA_VISIBLE_DEVICES.

They start before the plan exists, so that their torch and flashinfer imports and CUDA contexts
overlap the parent's planning; each then gets its task file and its work items on stdin
(the protocol is in ``worker.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

from autotune_cache.tune.workers.served import Use
from autotune_cache.tune.workers.gpus import devices as worker_devices

#: The real worker (``worker.py``); a GPU-less CI passes a stand-in's command instead (``machine.Machine``).
WORKER_ARGV = (sys.executable, "-m", "autotune_cache.tune.workers.worker")


class WorkerPool:
    """One worker process per GPU, fed line by line on stdin; its stderr goes to a temporary log
    file (FlashInfer logs and progress bars must never fill a pipe).

    ``served``: the served workers this pool uses (``served.claim``), one ``attach`` process
    standing in for each; ``note`` says why a warm that found served workers did not use them."""

    def __init__(self, n: int, argv: "list[str] | tuple[str, ...] | None" = None, *, served: "Use | None" = None):
        argv = list(argv or WORKER_ARGV)
        self.served, self.note = (served, None) if served is not None and served.sockets else (None, served and served.note)
        devices = worker_devices(n) if self.served is None else []  # a usage error before any process starts
        self.procs: list[subprocess.Popen] = []
        self.logs = []
        for w in range(n):
            log = tempfile.TemporaryFile(mode="w+")
            if self.served:  # the stand-in says hello with this command's own environment (its fingerprint)
                env = dict(os.environ)
                cmd = [sys.executable, "-m", "autotune_cache.tune.workers.attach", self.served.sockets[w], json.dumps(argv)]
            else:
                env = {**os.environ, "CUDA_VISIBLE_DEVICES": devices[w], "PYTHONUNBUFFERED": "1"}
                cmd = argv
            self.procs.append(subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, env=env, text=True, start_new_session=True))
            self.logs.append(log)

    @property
    def source(self) -> str:
        """``served`` (by ``fi-autotune workers``) or ``started`` (by this command)."""
        return "served" if self.served else "started"

    def send(self, w: int, line: str | None) -> None:
        """One line to worker ``w`` (its task path, then work items); None closes its stdin."""
        stdin = self.procs[w].stdin
        try:
            if line is None:
                stdin.close()
            else:
                stdin.write(f"{line}\n")
                stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # it died already; the supervisor reports it

    def log_text(self, w: int) -> str:
        self.logs[w].flush()
        self.logs[w].seek(0)
        return self.logs[w].read()

    def close(self) -> None:
        for p in self.procs:
            if p.stdin and not p.stdin.closed:
                try:
                    p.stdin.close()
                except OSError:
                    pass
            kill(p)
        for log in self.logs:
            log.close()
        if self.served:
            self.served.release()


def kill(proc: subprocess.Popen) -> None:
    """Stop a worker and its process group: TERM, then KILL after 10 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
