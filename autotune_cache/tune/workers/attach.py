"""``python -m autotune_cache.tune.workers.attach SOCKET WORKER_ARGV_JSON``: a served worker (``serve.py``) as the
pool sees a spawned one.

The pool starts this small process (no torch: it is up in a few tens of milliseconds) in the
worker's place. It says hello with this environment's fingerprint, then copies the pool's lines
to the worker and the worker's events back, and exits with the status the worker reports for the
session - so the dealer, the supervisor and their failure paths run unchanged. Killing it (a
failure elsewhere, Ctrl-C) closes the connection, which ends the session as closing a spawned
worker's stdin does; the served worker itself goes on serving the next warm.

Exit statuses of its own: 69 when the worker cannot be reached or refuses the session (the
reason on stderr, which the pool keeps as the worker's log), 70 when the connection drops
before the worker reported how its session ended."""

from __future__ import annotations

import json
import os
import selectors
import socket
import sys

from autotune_cache.tune.workers.served import fingerprint

UNREACHABLE, DROPPED = 69, 70

#: How long a worker may take to answer the hello (it finishes a session a killed client left first).
HELLO_TIMEOUT_S = 120.0


def _fail(code: int, message: str) -> int:
    sys.stderr.write(f"served worker: {message}\n")
    sys.stderr.flush()
    return code


def _pump(conn: socket.socket, first: bytes) -> int:
    """Copy stdin to the worker and the worker's lines to stdout until it reports its exit."""
    out = sys.stdout.buffer
    sel = selectors.DefaultSelector()
    sel.register(conn, selectors.EVENT_READ, "worker")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "pool")
    pending = first
    while True:
        *lines, pending = pending.split(b"\n")
        for line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                ev = None
            if isinstance(ev, dict) and ev.get("event") == "exit":
                return int(ev.get("code", 1))
            out.write(line + b"\n")
        out.flush()
        for key, _ in sel.select():
            if key.data == "worker":
                chunk = conn.recv(1 << 16)
                if not chunk:
                    return _fail(DROPPED, "the connection closed before the worker reported its exit "
                                          "(it died: see `fi-autotune workers status`)")
                pending += chunk
            else:
                data = os.read(sys.stdin.fileno(), 1 << 16)
                if not data:  # the pool closed our stdin: the session ends as a spawned worker's would
                    sel.unregister(key.fileobj)
                    conn.shutdown(socket.SHUT_WR)
                else:
                    conn.sendall(data)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        return _fail(2, "usage: python -m autotune_cache.tune.workers.attach SOCKET WORKER_ARGV_JSON")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(HELLO_TIMEOUT_S)
        conn.connect(argv[0])
        hello = {"fingerprint": fingerprint(json.loads(argv[1])), "cwd": os.getcwd()}
        conn.sendall(f"hello {json.dumps(hello, sort_keys=True)}\n".encode())
        buf = b""
        while b"\n" not in buf:
            chunk = conn.recv(1 << 16)
            if not chunk:
                return _fail(UNREACHABLE, f"{argv[0]} closed the connection before answering")
            buf += chunk
    except OSError as e:
        return _fail(UNREACHABLE, f"cannot reach {argv[0]}: {e.strerror or e}")
    line, _, rest = buf.partition(b"\n")
    try:
        answer = json.loads(line)
    except ValueError:
        return _fail(UNREACHABLE, f"{argv[0]} answered something else than a worker would")
    if answer.get("event") != "welcome":
        return _fail(UNREACHABLE, f"the worker refused the session: {answer.get('reason', answer)}")
    conn.settimeout(None)
    try:
        return _pump(conn, rest)
    except (BrokenPipeError, ConnectionResetError):
        return _fail(DROPPED, "the connection to the worker broke")
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
