"""The worker processes of one warm: one per GPU, each bound with CUDA_VISIBLE_DEVICES.

They start before the plan exists, so that their torch and flashinfer imports and CUDA contexts
overlap the parent's planning; each then gets its task file and its work items on stdin
(the protocol is in ``worker.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

#: The real worker (``worker.py``); a GPU-less CI passes a stand-in's command instead (``machine.Machine``).
WORKER_ARGV = (sys.executable, "-m", "autotune_cache.tune.workers.worker")


class WorkerPool:
    """One worker process per GPU, fed line by line on stdin; its stderr goes to a temporary log
    file (FlashInfer logs and progress bars must never fill a pipe)."""

    def __init__(self, n: int, argv: "list[str] | tuple[str, ...] | None" = None):
        argv = list(argv or WORKER_ARGV)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = [d.strip() for d in visible.split(",")] if visible else [str(i) for i in range(n)]
        self.procs: list[subprocess.Popen] = []
        self.logs = []
        for w in range(n):
            log = tempfile.TemporaryFile(mode="w+")
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": devices[w], "PYTHONUNBUFFERED": "1"}
            self.procs.append(subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, env=env, text=True, start_new_session=True))
            self.logs.append(log)

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
