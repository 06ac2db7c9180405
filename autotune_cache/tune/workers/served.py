"""Workers that stay up between warms (``fi-autotune workers start``): where they are, whether
this command may use them, and starting and stopping them. No torch here.

State (``servedstate.py``): ``<user cache>/fi-autotune/workers/state.json`` (pids, sockets, the
environment fingerprint they were started in, whether all answered), each worker's log beside
it, ``session.lock``, which a warm holds for as long as it uses them (two warms never share a
worker: the second starts its own), and ``start.lock`` (one ``start`` or ``stop`` at a time).
The sockets live in a private directory (mode 0700) under the system's temp dir, whose path
stays short enough for a UNIX socket.

A warm uses them only when every check passes, and otherwise says why and starts its own: the
same Python, fi-autotune sources, torch and FlashInfer versions, worker command and the
variables FlashInfer, torch and CUDA read (``fingerprint``), at least as many workers as it
wants, all alive, none busy. The worker checks the fingerprint again at every session
(``serve.py``): what a served worker tunes is what a worker this command started would tune.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Iterator

from autotune_cache.humanize import how_it_ended
from autotune_cache.tune.workers.gpus import devices
from autotune_cache.tune.workers.servedstate import (ServedPool, ServedWorker, StateError, make_runtime_dir,
                                                     remove_runtime_dir, state_dir)

#: Variables a worker's results can depend on: FlashInfer's, torch's and CUDA's own, this tool's,
#: and where libraries and the JIT cache are found. Anything else may differ between the shell
#: that started the workers and the one that uses them.
ENV_PREFIXES = ("FLASHINFER_", "FI_AUTOTUNE_", "CUDA_", "CUBLAS", "CUDNN_", "NVIDIA_", "TORCH", "PYTORCH_", "NCCL_",
                "TVM_", "CUTE_", "CUTLASS_", "TRITON_", "NVCC_", "OMP_", "MKL_", "OPENBLAS_", "PYTHON")
#: ... and FlashInfer's JIT build (compilers, flags, parallelism, scratch space), by name.
ENV_NAMES = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "HOME", "XDG_CACHE_HOME", "TMPDIR", "CC", "CXX", "CFLAGS",
             "CXXFLAGS", "LDFLAGS", "MAX_JOBS", "CPATH", "LIBRARY_PATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH")

#: Default idle time after which a served worker exits, and the longest one may ask for.
IDLE_S, MAX_IDLE_S = 1800.0, 1e7
#: How long a warm waits for each served worker to answer before it starts its own.
PING_S = 2.0


def _sources_stamp() -> str:
    """Changes when fi-autotune's own sources do (an upgrade, an edit): names, sizes, mtimes."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                st = os.stat(os.path.join(dirpath, name))
                h.update(f"{os.path.relpath(os.path.join(dirpath, name), root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def fingerprint(worker_argv: list[str] | tuple[str, ...]) -> dict:
    """What must be equal for a served worker to tune exactly as one this process starts would."""
    umask = os.umask(0)
    os.umask(umask)
    return {
        "python": sys.executable,
        "uid": os.getuid(),
        "umask": umask,
        "worker": list(worker_argv),
        "sources": _sources_stamp(),
        "versions": {d: _version(d) for d in ("torch", "flashinfer-python", "fi-autotune")},
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES},
    }


@dataclass
class Use:
    """A warm's claim on the served workers: their sockets, and the session lock it holds until
    ``release``. ``note``: why it is not using them (None: there are none, nothing to say)."""

    sockets: list[str]
    lock_fd: int | None = None
    note: str | None = None

    def release(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def differences(mine: dict, theirs: dict) -> list[str]:
    """The fingerprint's parts that differ, variables by name."""
    differ = sorted(k for k in set(mine) | set(theirs) if k != "env" and mine.get(k) != theirs.get(k))
    env_a, env_b = mine.get("env", {}), theirs.get("env", {})
    return differ + sorted(k for k in set(env_a) | set(env_b) if env_a.get(k) != env_b.get(k))


def claim(n: int, worker_argv: list[str] | tuple[str, ...], base: Path | None = None) -> Use:
    """The first ``n`` served workers, locked for this warm, if every check passes."""
    base = base or state_dir()
    own = "; this warm starts its own workers"
    try:
        pool = ServedPool.load(base)
    except StateError as e:
        return Use([], note=f"{e}{own}")
    if pool is None:
        return Use([])
    differ = differences(fingerprint(worker_argv), pool.fingerprint)
    if differ:
        return Use([], note=f"the served workers were started in another environment ({', '.join(differ[:6])} "
                            f"differ){own}")
    if not pool.ready:
        return Use([], note=f"the served workers are still starting (or their `workers start` was interrupted: "
                            f"`fi-autotune workers stop`){own}")
    if len(pool.workers) < n:
        return Use([], note=f"{len(pool.workers)} served worker(s), this warm wants {n}{own}")
    dead = [w.index for w in pool.workers[:n] if not w.alive()]
    if dead:
        return Use([], note=f"served worker(s) {', '.join(map(str, dead))} have exited (`fi-autotune workers "
                            f"status`){own}")
    fd = os.open(base / "session.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return Use([], note=f"the served workers are busy with another warm{own}")
    # Each answers now (not exiting on its idle timeout, not still finishing a killed warm's item).
    silent = [w.index for w in pool.workers[:n] if not w.ping(timeout=PING_S)]
    if silent:
        os.close(fd)
        return Use([], note=f"served worker(s) {', '.join(map(str, silent))} did not answer within {PING_S:.0f} s{own}")
    return Use([w.socket for w in pool.workers[:n]], fd)


@contextlib.contextmanager
def _starting(base: Path) -> Iterator[None]:
    """One ``start`` or ``stop`` at a time (two CI steps, a retry): the second waits for the first."""
    base.mkdir(parents=True, exist_ok=True)
    fd = os.open(base / "start.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def start(n: int, worker_argv: list[str] | tuple[str, ...], idle_s: float = IDLE_S, wait_s: float = 600.0,
          base: Path | None = None) -> tuple[ServedPool, bool]:
    """Start ``n`` served workers (detached: they outlive this command), and wait until each
    answers; ``(pool, False)`` if the same ones already run in this environment. RuntimeError:
    others run (another environment or count, some exited: stop them first), or a worker died
    while starting (its last log line; the others are stopped)."""
    base = base or state_dir()
    with _starting(base):
        existing = ServedPool.load(base)  # StateError: unreadable, said as such; nothing is started
        if existing is not None and existing.alive():
            differ = differences(fingerprint(worker_argv), existing.fingerprint)
            dead = [w.index for w in existing.workers if not w.alive()]
            why = (f"they were started in another environment ({', '.join(differ[:6])} differ)" if differ else
                   f"worker(s) {', '.join(map(str, dead))} have exited" if dead else
                   f"{len(existing.workers)} run, not {n}" if len(existing.workers) != n else "")
            if why:
                raise RuntimeError(f"served workers already run, but {why}: `fi-autotune workers stop` first")
            return existing, False
        if existing is not None:  # every worker of the last start has exited: its sockets' dir goes
            remove_runtime_dir(existing.runtime_dir, existing.workers)
        return _spawn(n, worker_argv, idle_s, wait_s, base), True


def _spawn(n: int, worker_argv, idle_s: float, wait_s: float, base: Path) -> ServedPool:
    runtime = make_runtime_dir()
    mine = fingerprint(worker_argv)
    # The workers compare each hello with this (their own environment differs from ours in
    # CUDA_VISIBLE_DEVICES: the fingerprint is the starting shell's, as every client computes it).
    prints = Path(runtime) / "fingerprint.json"
    prints.write_text(json.dumps(mine, sort_keys=True))
    workers, procs = [], []
    for w, dev in enumerate(devices(n)):
        sock, log = os.path.join(runtime, f"w{w}.sock"), str(base / f"worker{w}.log")
        with open(log, "wb") as f:  # this start's log only
            proc = subprocess.Popen([*worker_argv, "--serve", sock, "--idle", str(idle_s), "--fingerprint", str(prints)],
                                    stdin=subprocess.DEVNULL, stdout=f, stderr=f, start_new_session=True,
                                    env={**os.environ, "CUDA_VISIBLE_DEVICES": dev, "PYTHONUNBUFFERED": "1"})
        workers.append(ServedWorker(w, proc.pid, sock, dev, log))
        procs.append(proc)
    pool = ServedPool(tuple(workers), mine, time.time(), idle_s, runtime, ready=False)
    pool.save(base)  # before they answer: `stop` finds them even if this command is killed now
    deadline = time.monotonic() + wait_s
    waiting = list(workers)
    while waiting:
        for w in list(waiting):
            if os.path.exists(w.socket) and w.ping(timeout=1.0):
                waiting.remove(w)
            elif not (w.alive() or w.exec_pending()):
                _stop(base, pool)
                # how it ended too: a worker killed (OOM, kill -9) before its first line logs nothing
                raise RuntimeError(f"served worker {w.index} exited while starting "
                                   f"({how_it_ended(procs[w.index].poll())}): {_last_line(w.log)}")
        if waiting and time.monotonic() > deadline:
            _stop(base, pool)
            raise RuntimeError(f"served workers did not answer within {wait_s:.0f} s (logs in {base})")
        if waiting:
            time.sleep(0.1)
    ready = ServedPool(pool.workers, mine, pool.started, idle_s, runtime)
    ready.save(base)
    return ready


def _last_line(log: str) -> str:
    try:
        lines = [ln for ln in Path(log).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "no message"


def stop(base: Path | None = None, timeout: float = 10.0) -> list[int]:
    """Stop every served worker (TERM, then KILL) and forget them; the pids stopped. StateError
    where the state is unreadable, or where a worker whose recorded pid is not it still answers
    on its recorded socket (the state was edited): nothing is signalled or removed on a guess."""
    base = base or state_dir()
    with _starting(base):
        pool = ServedPool.load(base)
        if pool is None:
            return []
        strays = [w.index for w in pool.workers if not w.alive() and w.ping(timeout=PING_S)]
        if strays:
            raise StateError(f"served worker(s) {', '.join(map(str, strays))} answer on their sockets, but the pids "
                             f"state.json records are not theirs")
        return _stop(base, pool, timeout)


def _stop(base: Path, pool: ServedPool, timeout: float = 10.0) -> list[int]:
    stopped = []
    for w in pool.workers:
        if w.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGTERM)
            stopped.append(w.pid)
    deadline = time.monotonic() + timeout
    while any(w.alive() for w in pool.workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    for w in pool.workers:
        if w.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGKILL)
    remove_runtime_dir(pool.runtime_dir, pool.workers)
    with contextlib.suppress(FileNotFoundError):
        (base / "state.json").unlink()
    return stopped
