"""``run_cli``'s command through a zygote with no client process: the test process itself does what
tests/support/zygote_client.py does for a ``Popen`` or a shell, and ``subprocess.run`` around it.

The client is a fresh interpreter (``python -I -S``) per command: ~14 ms of CPU, and an
interpreter's start before the command is even asked for. About 1,800 commands a run go through
``run_cli``; each only needs what the client's ``subprocess.run`` gave it: the command's exit
status, its stdout and stderr as text, ``input`` on its stdin, a timeout that kills it. Here the
test process sends the zygote the request the client would have sent (the same bytes:
``zygote_client.request_bytes``, with the working directory, umask and environment the client
would have had), the ends of its own pipes as the command's fds 0, 1 and 2, and reads the pipes and
the zygote's ``P<pid>`` / ``X<status>`` lines itself. The command is the same process either way
(the zygote's child, in the test process's process group).
"""

from __future__ import annotations

import io
import os
import selectors
import socket
import subprocess
import sys
import threading
import time

from .zygote_client import NOT_STARTED, request_bytes

GONE = b"zygote_client: the zygote went away while the command ran; its exit status is lost\n"
LOCALE = ("LC_ALL", "LC_CTYPE", "LANG")
_coerced: dict[tuple, str | None] = {}
_coerced_lock = threading.Lock()


class NotHere(Exception):
    """The command cannot go through the zygote for a reason of this process's (a working directory
    that is not there, a kernel without ``Umask:`` in /proc): run it fresh, which fails or runs as it
    would have; the zygote itself is fine."""


def _encoding() -> str:
    """What ``subprocess.run(text=True)`` decodes with, and encodes ``input`` with (read at each
    call, as it reads it)."""
    return io.TextIOWrapper(io.BytesIO(), encoding=io.text_encoding(None)).encoding


def _check(args: list[str], env: dict, cwd) -> None:
    """What ``subprocess`` refuses before it starts anything, refused the same way: a NUL (the
    request's separator) in an argument, a variable or the directory, ``=`` in a variable's name."""
    for value in (*args, *env.values(), cwd):
        if b"\0" in os.fsencode(value):
            raise ValueError("embedded null byte")
    for name in env:
        if b"=" in os.fsencode(name):
            raise ValueError("illegal environment variable name")
        if b"\0" in os.fsencode(name):
            raise ValueError("embedded null byte")


def _umask() -> int | None:
    """This process's umask, read without setting it (other threads may be creating files)."""
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"Umask:"):
                return int(line.split()[1], 8)
    return None


def _client_env(env: dict) -> dict:
    """The environment the client's ``os.environ`` would hold: ``env``, plus the ``LC_CTYPE`` the
    interpreter sets at its start where the locale is C (PEP 538's coercion; ``-I`` ignores
    ``PYTHONCOERCECLOCALE``). Asked of that interpreter once per locale, not guessed."""
    key = tuple(env.get(k) for k in LOCALE)
    with _coerced_lock:
        if key not in _coerced:
            probe = subprocess.run([sys.executable, "-I", "-S", "-c", "import os; print(os.environ.get('LC_CTYPE'))"],
                                   env={k: v for k, v in zip(LOCALE, key) if v is not None}, capture_output=True,
                                   text=True, check=True, timeout=60)
            _coerced[key] = probe.stdout.strip()
        ctype = _coerced[key]
    if ctype == "None" or ctype == env.get("LC_CTYPE"):
        return env
    return {**env, "LC_CTYPE": ctype}


def _text(data: bytes, encoding: str) -> str:
    return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


def call(socket_path: str, args: list[str], *, env: dict, input: str | None, timeout: float | None, cwd,
         script: str, cmd: list[str]) -> subprocess.CompletedProcess | None:
    """``subprocess.run([client, *args], capture_output=True, text=True, ...)`` as the client would
    answer it, ``cmd`` its ``args``; None where the zygote did not start the command (gone, or this
    environment is not its own: the caller runs it fresh, as for the client's ``NOT_STARTED``).
    ``NotHere``: run it fresh, the zygote is not at fault (a missing ``cwd`` then fails as
    ``subprocess`` fails on it)."""
    _check(args, env, cwd)
    umask = _umask()
    if umask is None or not os.path.isdir(cwd):
        raise NotHere(cwd)
    deadline = None if timeout is None else time.monotonic() + timeout
    encoding = _encoding()
    request = request_bytes(args, script, os.path.realpath(cwd), umask, _client_env(env))
    ours: list[int] = []
    theirs: list[int] = []
    conn = None
    try:
        out_r, out_w = os.pipe()
        ours.append(out_r)
        theirs.append(out_w)
        err_r, err_w = os.pipe()
        ours.append(err_r)
        theirs.append(err_w)
        if input is not None:
            in_r, in_w = os.pipe()
            ours.append(in_w)
            theirs.append(in_r)
        else:
            in_r, in_w = 0, None  # no input: this process's stdin, as the client inherited it
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(socket_path)  # a UNIX socket: at once, or refused
            socket.send_fds(conn, [len(request).to_bytes(4, "big")], [in_r, out_w, err_w])
            conn.sendall(request)
        except OSError:
            return None
        finally:
            for fd in theirs:
                os.close(fd)
            theirs = []
        lines = _Lines(conn)
        try:
            started = lines.next(deadline)
        except (TimeoutError, BlockingIOError):
            raise subprocess.TimeoutExpired(cmd, timeout) from None  # as subprocess.run's, whatever the zygote does
        except OSError:
            started = b""
        if not started.startswith(b"P"):
            return None
        given = (input or "").encode(encoding) if in_w is not None else None
        stdout, stderr, status = _pump(ours, lines, given, deadline, cmd, timeout)
        if status is None:
            code, stderr = NOT_STARTED, stderr + GONE
        else:
            code = os.waitstatus_to_exitcode(status)
        return subprocess.CompletedProcess(cmd, code, _text(stdout, encoding), _text(stderr, encoding))
    finally:
        if conn is not None:
            conn.close()  # before the command ends (a timeout, an error here): the zygote kills it
        for fd in ours + theirs:
            try:
                os.close(fd)
            except OSError:
                pass


class _Lines:
    """The zygote's ``P<pid>`` and ``X<status>`` lines, read from the connection as they come."""

    def __init__(self, conn: socket.socket):
        self.conn, self.buf, self.eof = conn, b"", False

    def ready(self) -> bytes | None:
        """A whole line read already, or None."""
        if b"\n" in self.buf:
            line, _, self.buf = self.buf.partition(b"\n")
            return line
        return b"" if self.eof else None

    def feed(self) -> None:
        chunk = self.conn.recv(4096)
        self.buf += chunk
        self.eof = not chunk

    def next(self, deadline: float | None) -> bytes:
        while (line := self.ready()) is None:
            self.conn.settimeout(None if deadline is None else max(0.0, deadline - time.monotonic()))
            self.feed()
        return line


def _pump(ours: list[int], lines: _Lines, data: bytes | None, deadline: float | None, cmd, timeout):
    """stdout and stderr until both end, ``data`` into stdin, and the zygote's ``X<status>`` (None
    where the zygote went away first): what ``communicate`` and the client's wait give."""
    out_r, err_r = ours[0], ours[1]
    got = {out_r: [], err_r: []}
    sel = selectors.DefaultSelector()
    sel.register(out_r, selectors.EVENT_READ)
    sel.register(err_r, selectors.EVENT_READ)
    lines.conn.setblocking(False)
    sel.register(lines.conn, selectors.EVENT_READ)
    in_w, sent = (ours[2], 0) if data is not None else (None, 0)
    if in_w is not None:
        if data:
            os.set_blocking(in_w, False)
            sel.register(in_w, selectors.EVENT_WRITE)
        else:
            os.close(in_w)
            ours.remove(in_w)
            in_w = None
    open_pipes, status, done = 2, None, False
    try:
        while open_pipes or not done:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                raise subprocess.TimeoutExpired(cmd, timeout, output=b"".join(got[out_r]) or None,
                                                stderr=b"".join(got[err_r]) or None)
            for key, _ in sel.select(wait):
                fd = key.fd
                if fd == in_w:
                    try:
                        sent += os.write(in_w, data[sent:sent + 65536])
                    except BrokenPipeError:
                        sent = len(data)  # the command stopped reading: as communicate, not an error
                    if sent >= len(data):
                        sel.unregister(in_w)
                        os.close(in_w)
                        ours.remove(in_w)
                        in_w = None
                elif fd in got:
                    chunk = os.read(fd, 65536)
                    if chunk:
                        got[fd].append(chunk)
                    else:
                        sel.unregister(fd)
                        open_pipes -= 1
                else:
                    try:
                        lines.feed()
                    except BlockingIOError:
                        continue
                    except OSError:  # the zygote is gone (a reset, not an end): as its end
                        lines.eof = True
                    while (line := lines.ready()) is not None:
                        if line.startswith(b"X"):
                            status = int(line[1:])
                        if not line or line.startswith(b"X"):
                            done = True
                            sel.unregister(lines.conn)
                            break
    finally:
        sel.close()
    return b"".join(got[out_r]), b"".join(got[err_r]), status
