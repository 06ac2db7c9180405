"""Loopback servers for the store tests: a free port, and waiting until a server listens."""

from __future__ import annotations

import socket
import subprocess
import threading
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


class LoopbackServer:
    """A socket server thread on loopback: per connection, once its request arrived,
    ``answer(server, conn, request)`` (None: say nothing at all, and keep the connection open)."""

    def __init__(self, answer=None):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.answer, self.stop, self.conns = answer, threading.Event(), []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)
            if self.answer is not None:
                threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn) -> None:
        try:
            request = conn.recv(65536)
            self.answer(self, conn, request)
        except OSError:
            pass

    def close(self) -> None:
        self.stop.set()
        for c in self.conns:
            c.close()
        self.sock.close()
