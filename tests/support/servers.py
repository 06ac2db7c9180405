"""Loopback servers for the store tests: a free port, and waiting until a server listens."""

from __future__ import annotations

import socket
import subprocess
import time

# The S3 secret every store test uses; no command may ever print it.
SECRET = "fi-autotune-test-secret-do-not-print"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(port: int, proc: subprocess.Popen, timeout: float = 30, log=None) -> None:
    """Return once ``proc`` accepts connections on ``port`` (polls the socket, not a fixed sleep)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            said = log.read_text()[-2000:] if log is not None else (proc.stderr.read()[-2000:] if proc.stderr else "")
            raise RuntimeError(f"server exited: {said}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")
