"""A worker that stays up: one process per GPU that imports torch and FlashInfer, creates its CUDA
context once, then serves one warm after another over a UNIX socket (``fi-autotune workers
start``). Each connection is one *session*: exactly the protocol a spawned worker speaks on its
stdin and stdout (``worker.py``), so the parent's pool, dealer and supervisor do not know the
difference; ``attach.py`` is the small process that stands in the pool for a served worker.

Why: a fresh worker spends 5-7 s on an H100 host importing torch and FlashInfer before its first
profile (docs/fleet.md), the fixed start of every ``warm``. Served, that is paid once per machine
(a CI job, a Slurm allocation, a pod), and every warm after the first starts tuning at once.

A session begins with ``hello {"fingerprint": ..., "cwd": ...}``: the worker serves only a client
whose environment would have started an identical worker (same Python, user, umask, fi-autotune
sources, worker command, and the variables FlashInfer, torch, CUDA and the JIT build read:
``served.fingerprint``), and runs the session in the client's working directory, as a worker the
client started would; otherwise it answers ``{"event": "refused", ...}``. ``ping`` instead of a
fingerprint is answered and closed (``workers status``). A session ends when the client closes its
side (what a spawned worker sees as stdin closing); the worker's last line is
``{"event": "exit", "code": N}``, the exit status a spawned worker would have had. Between
sessions the worker forgets everything a warm gave it (``worker.serve_session``): nothing but
the imported modules and the CUDA context carries over. A session that fails (an error event, a
non-zero status) ends the worker too: a sticky CUDA error would poison the next. With no session
for ``idle_s`` seconds it exits and removes its socket: only a session counts as use - a ping
(``workers status``, a readiness probe), a refused hello or a client that connects and says
nothing never keeps it alive, and a client gets at most ``HANDSHAKE_S`` (or ``idle_s``, if
shorter) to say its first line.

No torch here: the stand-in worker the tests run (tests/standins/fake_worker.py) serves through
the same loop."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import traceback
from typing import Callable

#: The first line of every connection, and the answer's events.
HELLO, PING = "hello", "ping"
#: Seconds a connection has to send its first line (``attach`` sends it at once).
HANDSHAKE_S = 10.0


def _answer(wfile, event: str, **fields) -> None:
    wfile.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
    wfile.flush()


def _handshake(line: str, fingerprint: dict, wfile) -> str | None:
    """The client's working directory when this connection is to be served as a session; None
    for a ping, a refusal or nonsense (answered and closed)."""
    word, _, rest = line.strip().partition(" ")
    if word == PING:
        _answer(wfile, "pong", pid=os.getpid())
        return None
    if word != HELLO:
        _answer(wfile, "refused", reason=f"expected {HELLO!r}, got {word[:40]!r}")
        return None
    try:
        hello = json.loads(rest)
        theirs, cwd = hello["fingerprint"], hello["cwd"]
    except (ValueError, KeyError, TypeError):
        _answer(wfile, "refused", reason="the hello line is not a fingerprint and a directory")
        return None
    if theirs != fingerprint:
        differ = sorted(k for k in set(theirs) | set(fingerprint) if theirs.get(k) != fingerprint.get(k))
        _answer(wfile, "refused", reason="started in another environment: " + ", ".join(differ[:8]) + " differ")
        return None
    if not isinstance(cwd, str) or not os.path.isdir(cwd):
        _answer(wfile, "refused", reason=f"the client's working directory {str(cwd)[:200]!r} is not one here")
        return None
    _answer(wfile, "welcome", pid=os.getpid())
    return cwd


def listen(path: str) -> socket.socket:
    """The worker's socket, readable by its user only (a session writes where its task says)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(8)
    return sock


def serve_args(argv: list[str]) -> tuple[str, float, dict] | None:
    """``--serve SOCKET --idle SECONDS --fingerprint FILE`` (what ``served.start`` passes), or None:
    a spawned worker's command line."""
    if "--serve" not in argv:
        return None
    opts = dict(zip(argv[::2], argv[1::2]))
    with open(opts["--fingerprint"]) as f:
        return opts["--serve"], float(opts["--idle"]), json.load(f)


def _one_session(conn: socket.socket, fingerprint: dict, session: Callable[[], int],
                 handshake_s: float = HANDSHAKE_S) -> int | None:
    """One connection: the handshake, then ``session()`` with ``sys.stdin``/``sys.stdout`` bound
    to it. Its exit status (0 for a client that went away mid-session), or None where no session
    ran (a ping, a refusal, a client that hung up, spoke garbage or said nothing for
    ``handshake_s``); a session that raises (a full disk, a bad task, a bug) has failed - status
    1, its traceback in the worker's log - as a spawned worker would have exited with one."""
    rfile = conn.makefile("r", encoding="utf-8", newline="\n")
    wfile = conn.makefile("w", encoding="utf-8", newline="\n")
    stdin, stdout = sys.stdin, sys.stdout
    try:
        try:
            conn.settimeout(handshake_s)
            line = rfile.readline()
            conn.settimeout(None)
            cwd = _handshake(line, fingerprint, wfile)
        except (OSError, ValueError):  # it hung up (or spoke garbage, or nothing) before a session began
            return None
        if cwd is None:
            return None
        home = os.getcwd()
        sys.stdin, sys.stdout = rfile, wfile
        try:
            os.chdir(cwd)  # where a worker that warm started would run: relative paths resolve alike
            code = int(session() or 0)
        except (BrokenPipeError, ConnectionResetError):
            return 0  # the client went away: its session is over, the next one starts clean
        except BaseException:  # noqa: BLE001 - the session failed; the worker stops serving
            traceback.print_exc(file=sys.__stderr__)
            code = 1
        finally:
            sys.stdin, sys.stdout = stdin, stdout
            os.chdir(home)
        with contextlib.suppress(OSError, ValueError):
            _answer(wfile, "exit", code=code)
        return code
    finally:
        for f in (rfile, wfile):
            with contextlib.suppress(OSError, ValueError):
                f.close()


def serve_sessions(path: str, idle_s: float, fingerprint: dict, session: Callable[[], int]) -> int:
    """Accept sessions on ``path`` one at a time until ``idle_s`` seconds pass without one; each
    runs ``session()`` with ``sys.stdin``/``sys.stdout`` bound to the connection. 0 at idle exit."""
    sock = listen(path)
    print(json.dumps({"event": "serving", "socket": path, "pid": os.getpid(), "t": time.time()}), flush=True)
    last_used = time.monotonic()
    try:
        while True:
            left = idle_s - (time.monotonic() - last_used)
            if left <= 0:
                return 0
            sock.settimeout(left)
            try:
                conn, _ = sock.accept()
            except socket.timeout:
                return 0
            with conn:
                code = _one_session(conn, fingerprint, session, min(HANDSHAKE_S, idle_s))
            if code is None:  # no session ran: the idle clock goes on
                continue
            last_used = time.monotonic()
            if code:  # a failed session may leave the GPU unusable (a sticky CUDA error): stop serving
                return code
    finally:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
