"""The test process's side of the CLI fork server (tests/support/zygote.py): which zygote runs a
command, starting zygotes, running a command through one (``run``: from this process,
tests/support/zygote_call.py), and the command line of the client that stands for the command
where a process must (``popen``, ``cli_on_path``).

``POOL.zygote_for(env)`` answers the zygote that runs a command in ``env``, or None where the
command must run fresh (``FIA_TEST_FRESH_CLI=1``, an environment whose ``PYTHON*``
variables differ from this process's, too many distinct environments, a zygote that failed).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from . import zygote as Z
from . import zygote_call

REPO = Path(__file__).resolve().parents[2]
CLIENT = Path(__file__).with_name("zygote_client.py")
MAX_ZYGOTES = 4  # per test process, one per signature(env); a fifth replaces the least recently used
MAX_STARTS = 40  # zygotes started in all by one test process; beyond that, every command fresh
START_TIMEOUT = 60.0


def fresh_everywhere() -> bool:
    return os.environ.get("FIA_TEST_FRESH_CLI") == "1"


class Zygote:
    def __init__(self, env: dict, socket_path: str):
        self.socket_path = socket_path
        self.dead = False
        self.inflight = 0  # commands running through it now (threads): never stopped while > 0
        ready_r, ready_w = os.pipe()
        self.parent_r, self.parent_w = os.pipe()  # the zygote's EOF when this process ends
        self.log = open(Path(socket_path).with_suffix(".log"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from tests.support.zygote import serve; serve()", socket_path, str(ready_w), str(self.parent_r)],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, pass_fds=(ready_w, self.parent_r),
        )
        os.close(ready_w)
        os.close(self.parent_r)
        line = b""
        try:
            while not line.endswith(b"\n"):
                r, _, _ = select.select([ready_r], [], [], START_TIMEOUT)
                chunk = os.read(ready_r, 65536) if r else b""
                if not chunk:
                    break
                line += chunk
        finally:
            os.close(ready_r)
        if not line.startswith(b"ready "):
            self.dead = True
            self.stop()
            self.reads: list[str] = []
            return
        self.reads = json.loads(line[len(b"ready "):])

    def stop(self) -> None:
        self.dead = True
        try:
            os.close(self.parent_w)
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _repo_path(name: str, value: str) -> bool:
    """``PYTHONPATH`` naming this checkout alone (what the stand-in GPUs' workers need to import
    ``devtools``): a zygote started with it has it, as a fresh process would (it is part of the
    zygote's signature), so it needs no fresh interpreter."""
    return name == "PYTHONPATH" and value == str(REPO)


class Pool:
    def __init__(self):
        self.lock = threading.Lock()
        self.zygotes: dict[tuple, Zygote] = {}
        self.reads: list[str] | None = None  # what a zygote read at import (the same for each)
        self.dir: str | None = None
        self.failed = False
        self.started = 0  # zygotes started by this process (each its own socket name)
        self.own_python_env = {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}

    def zygote_for(self, env: dict) -> Zygote | None:
        if fresh_everywhere() or self.failed:
            return None
        if {k: v for k, v in env.items() if k.startswith("PYTHON") and not _repo_path(k, v)} != \
                {k: v for k, v in self.own_python_env.items() if not _repo_path(k, v)}:
            return None  # an interpreter flag for this run: fresh, as asked
        with self.lock:
            if self.reads is not None:
                key = Z.signature(env, self.reads)
                z = self.zygotes.get(key)
                if z is not None and not z.dead and z.proc.poll() is None:
                    self.zygotes[key] = self.zygotes.pop(key)  # most recently used last
                    z.inflight += 1
                    return z
                if z is not None:
                    z.stop()
                    del self.zygotes[key]
                if len(self.zygotes) >= MAX_ZYGOTES:
                    # the least recently used one not running a command (its environment was a test's own)
                    idle = [k for k, o in self.zygotes.items() if o.inflight == 0]
                    if not idle:
                        return None
                    self.zygotes.pop(idle[0]).stop()
            if self.dir is None:
                self.dir = tempfile.mkdtemp(prefix="fia-zygote-")
                atexit.register(self.close)
            if self.started >= MAX_STARTS:
                return None
            self.started += 1
            z = Zygote(env, os.path.join(self.dir, f"z{self.started}.sock"))
            if z.dead:
                self.failed = True  # it cannot start here: every command runs fresh
                return None
            z.env = env
            if self.reads is None or not set(z.reads) <= set(self.reads):
                # what this zygote read at import (a read can depend on another variable's value)
                self.reads = sorted(set(self.reads or ()) | set(z.reads))
                self.zygotes = {Z.signature(o.env, self.reads): o for o in self.zygotes.values()}
            key = Z.signature(env, self.reads)
            old = self.zygotes.get(key)
            if old is not None:
                old.stop()
            self.zygotes[key] = z
            z.inflight += 1
            return z

    def done(self, z: Zygote) -> None:
        with self.lock:
            z.inflight -= 1

    def close(self) -> None:
        with self.lock:
            for z in self.zygotes.values():
                z.stop()
            self.zygotes.clear()
            if self.dir:
                shutil.rmtree(self.dir, ignore_errors=True)
                self.dir = None


POOL = Pool()


def client_argv(z: Zygote, marker_fd: int, script: str = "") -> list[str]:
    """The client's command line, to which the command's own arguments are appended; ``script``:
    the command is ``python SCRIPT`` instead of ``python -m fi_autotune_cli``."""
    return [sys.executable, "-I", "-S", str(CLIENT), z.socket_path, str(marker_fd), *([script] if script else []), "--"]


def run(args, *, env: dict, input, timeout, cwd, fresh_argv: list[str], script: str = "",
        **kw) -> subprocess.CompletedProcess:
    """``subprocess.run`` of the command through a zygote (or fresh where none serves ``env``):
    ``fresh_argv + args`` as a fresh process would run it (``script``: ``fresh_argv`` is
    ``python SCRIPT``; ``kw``: more of ``subprocess.run``'s arguments, fresh)."""
    z = POOL.zygote_for(env) if not kw else None
    if z is not None:
        theirs = True  # None from the zygote: gone, or it refused this environment
        try:
            proc = zygote_call.call(z.socket_path, list(args), env=env, input=input, timeout=timeout, cwd=cwd,
                                    script=script, cmd=[*fresh_argv, *args])
        except zygote_call.NotHere:
            proc, theirs = None, False  # this process's reason: fresh, and the zygote serves the next one
        finally:
            POOL.done(z)
        if proc is not None:
            proc.via_zygote = True
            return proc
        if theirs:
            z.dead = True  # it is gone: this command, and the next ones for this environment, run fresh
    proc = subprocess.run([*fresh_argv, *args], capture_output=True, text=True, env=env, input=input, timeout=timeout,
                          cwd=cwd, **kw)
    proc.via_zygote = False
    return proc


def popen(args, *, env: dict, cwd, **kw) -> subprocess.Popen:
    """The client as a ``Popen`` (tests of the zygote itself: signals); a zygote must serve ``env``."""
    z = POOL.zygote_for(env)
    if z is None:
        raise RuntimeError("no zygote serves this environment")
    marker = os.open(os.devnull, os.O_WRONLY)
    try:
        return subprocess.Popen([*client_argv(z, marker), *args], env=env, cwd=cwd, pass_fds=(marker,), **kw)
    finally:
        POOL.done(z)  # (a test of the zygote: nothing evicts it meanwhile)
        os.close(marker)


#: ``fi-autotune`` on a shell's PATH, forked by a zygote (cli_on_path): the installed console script
#: run as ``python SCRIPT ARGS`` in a zygote child; where the zygote does not take the command (gone,
#: or the shell exported an environment whose import-time reads differ), that console script, fresh.
SHIM = """#!/bin/sh
marker="{dir}/started.$$"
: > "$marker"
"{python}" -I -S "{client}" "{socket}" 9 "{script}" -- "$@" 9>>"$marker"
rc=$?
if [ -s "$marker" ]; then rm -f "$marker"; exit $rc; fi
rm -f "$marker"
exec {fresh} "$@"
"""


@contextlib.contextmanager
def cli_on_path(env: dict, scripts: dict[str, Path] | None = None):
    """``env`` with a ``fi-autotune`` first on its ``PATH`` whose commands a zygote forks (the shell
    recipes and the docs' examples run that command dozens of times, each a fresh interpreter
    otherwise): the same console script (``.venv/bin/fi-autotune``, its ``sys.argv[0]`` and
    ``sys.path[0]``), a real process with the shell's fds, environment and working directory.
    ``scripts``: variable -> a Python script (a stand-in the shell runs as ``"$VAR" ARGS``), each
    set to a command that a zygote forks as ``python SCRIPT ARGS``, or that runs it fresh.
    ``env`` unchanged where no zygote serves it (its ``PYTHON*`` variables, ``FIA_TEST_FRESH_CLI=1``)
    or the console script is not installed beside this interpreter; each script's variable then
    runs it fresh."""
    script = Path(sys.executable).parent / "fi-autotune"
    z = POOL.zygote_for(env) if script.is_file() else None
    bindir = Path(tempfile.mkdtemp(prefix="bin-", dir=POOL.dir if z is not None else None))
    try:
        shims = {}
        for var, path in (scripts or {}).items():
            shim = bindir / var
            fresh = f'"{sys.executable}" "{path}"'
            shim.write_text(SHIM.format(dir=bindir, python=sys.executable, client=CLIENT, socket=z.socket_path,
                                        script=path, fresh=fresh) if z is not None else f'#!/bin/sh\nexec {fresh} "$@"\n')
            shim.chmod(0o755)
            shims[var] = str(shim)
        if z is None:
            yield {**env, **shims}
            return
        shim = bindir / "fi-autotune"
        shim.write_text(SHIM.format(dir=bindir, python=sys.executable, client=CLIENT, socket=z.socket_path,
                                    script=script, fresh=f'"{script}"'))
        shim.chmod(0o755)
        yield {**env, **shims, "PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}"}
    finally:
        if z is not None:
            POOL.done(z)  # not stopped (least recently used) while the shell may still use it
        shutil.rmtree(bindir, ignore_errors=True)
