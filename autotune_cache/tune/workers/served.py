"""Workers that stay up between warms (``fi-autotune workers start``): where they are, whether
this command may use them, and starting and stopping them. No torch here.

State: ``<user cache>/fi-autotune/workers/state.json`` (pids, sockets, the command each worker
runs, the environment fingerprint they were started in), each worker's log beside it, and
``session.lock``, which a warm holds for as long as it uses them: two warms never share a
worker (the second starts its own). The sockets live in a private directory (mode 0700) under
the system's temp dir, whose path stays short enough for a UNIX socket.

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
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

#: Variables a worker's results can depend on: FlashInfer's, torch's and CUDA's own, this tool's,
#: and where libraries and the JIT cache are found. Anything else may differ between the shell
#: that started the workers and the one that uses them.
ENV_PREFIXES = ("FLASHINFER_", "FI_AUTOTUNE_", "CUDA_", "CUBLAS", "CUDNN_", "NVIDIA_", "TORCH", "PYTORCH_", "NCCL_",
                "TVM_", "CUTE_", "CUTLASS_", "TRITON_")
ENV_NAMES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "HOME", "XDG_CACHE_HOME")

#: Default idle time after which a served worker exits.
IDLE_S = 1800.0


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
    return {
        "python": sys.executable,
        "worker": list(worker_argv),
        "sources": _sources_stamp(),
        "versions": {d: _version(d) for d in ("torch", "flashinfer-python", "fi-autotune")},
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES},
    }


def state_dir() -> Path:
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("fi-autotune")) / "workers"


def devices(n: int) -> list[str]:
    """Worker ``w``'s CUDA_VISIBLE_DEVICES: the w-th visible device (``pool.WorkerPool`` too)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    found = [d.strip() for d in visible.split(",")] if visible else [str(i) for i in range(n)]
    return found[:n]


@dataclass(frozen=True)
class ServedWorker:
    index: int
    pid: int
    socket: str
    device: str
    log: str

    def alive(self) -> bool:
        """The process is there and is still this worker (a pid can be reused). Its command line
        reads empty for a moment after it is spawned (before its exec completes): alive then,
        unless it is a zombie."""
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                cmdline = f.read()
            if cmdline:
                return self.socket.encode() in cmdline
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
        except (OSError, IndexError):
            return False

    def ping(self, timeout: float = 5.0) -> bool:
        """Whether it answers on its socket now (a busy one answers once its session ends)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(self.socket)
                s.sendall(b"ping\n")
                return b"pong" in s.recv(4096)
        except OSError:
            return False

    def to_dict(self) -> dict:
        return {"index": self.index, "pid": self.pid, "socket": self.socket, "device": self.device, "log": self.log,
                "alive": self.alive()}


@dataclass(frozen=True)
class ServedPool:
    """What ``state.json`` records."""

    workers: tuple[ServedWorker, ...]
    fingerprint: dict
    started: float
    idle_s: float
    runtime_dir: str

    @classmethod
    def load(cls, base: Path | None = None) -> "ServedPool | None":
        try:
            d = json.loads(((base or state_dir()) / "state.json").read_text())
            return cls(tuple(ServedWorker(**w) for w in d["workers"]), d["fingerprint"], d["started"], d["idle_s"],
                       d["runtime_dir"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, base: Path) -> None:
        tmp = base / f"state.json.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"workers": [w.__dict__ for w in self.workers], "fingerprint": self.fingerprint,
                                   "started": self.started, "idle_s": self.idle_s, "runtime_dir": self.runtime_dir},
                                  indent=1))
        os.replace(tmp, base / "state.json")

    def alive(self) -> list[ServedWorker]:
        return [w for w in self.workers if w.alive()]


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


def claim(n: int, worker_argv: list[str] | tuple[str, ...], base: Path | None = None) -> Use:
    """The first ``n`` served workers, locked for this warm, if every check passes."""
    base = base or state_dir()
    pool = ServedPool.load(base)
    if pool is None:
        return Use([])
    own = "; this warm starts its own workers"
    mine = fingerprint(worker_argv)
    if pool.fingerprint != mine:
        differ = sorted(k for k in set(mine) | set(pool.fingerprint) if mine.get(k) != pool.fingerprint.get(k))
        if "env" in differ:
            keys = set(mine["env"]) | set(pool.fingerprint.get("env", {}))
            differ += sorted(k for k in keys if mine["env"].get(k) != pool.fingerprint.get("env", {}).get(k))
            differ.remove("env")
        return Use([], note=f"the served workers were started in another environment ({', '.join(differ[:6])} "
                            f"differ){own}")
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
    return Use([w.socket for w in pool.workers[:n]], fd)


def start(n: int, worker_argv: list[str] | tuple[str, ...], idle_s: float = IDLE_S, wait_s: float = 600.0,
          base: Path | None = None) -> tuple[ServedPool, bool]:
    """Start ``n`` served workers (detached: they outlive this command), and wait until each
    answers; ``(pool, False)`` if compatible ones already run. Raises RuntimeError with the
    worker's last log line if one dies while starting, and stops the others."""
    base = base or state_dir()
    base.mkdir(parents=True, exist_ok=True)
    existing = ServedPool.load(base)
    if existing is not None and existing.alive():
        return existing, False
    if existing is not None:  # every worker of the last start has exited: its sockets' dir goes
        shutil.rmtree(existing.runtime_dir, ignore_errors=True)
    runtime = tempfile.mkdtemp(prefix="fia-")
    mine = fingerprint(worker_argv)
    # The workers compare each hello with this (their own environment differs from ours in
    # CUDA_VISIBLE_DEVICES: the fingerprint is the starting shell's, as every client computes it).
    prints = Path(runtime) / "fingerprint.json"
    prints.write_text(json.dumps(mine, sort_keys=True))
    workers = []
    for w, dev in enumerate(devices(n)):
        sock, log = os.path.join(runtime, f"w{w}.sock"), str(base / f"worker{w}.log")
        with open(log, "ab") as f:
            proc = subprocess.Popen([*worker_argv, "--serve", sock, "--idle", str(idle_s), "--fingerprint", str(prints)],
                                    stdin=subprocess.DEVNULL,
                                    stdout=f, stderr=f, start_new_session=True,
                                    env={**os.environ, "CUDA_VISIBLE_DEVICES": dev, "PYTHONUNBUFFERED": "1"})
        workers.append(ServedWorker(w, proc.pid, sock, dev, log))
    pool = ServedPool(tuple(workers), mine, time.time(), idle_s, runtime)
    pool.save(base)
    deadline = time.monotonic() + wait_s
    waiting = list(workers)
    while waiting:
        for w in list(waiting):
            if os.path.exists(w.socket) and w.ping(timeout=1.0):
                waiting.remove(w)
            elif not w.alive():
                stop(base)
                raise RuntimeError(f"served worker {w.index} exited while starting: {_last_line(w.log)}")
        if waiting and time.monotonic() > deadline:
            stop(base)
            raise RuntimeError(f"served workers did not answer within {wait_s:.0f} s (logs in {base})")
        if waiting:
            time.sleep(0.1)
    return pool, True


def _last_line(log: str) -> str:
    try:
        lines = [ln for ln in Path(log).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "no message"


def stop(base: Path | None = None, timeout: float = 10.0) -> list[int]:
    """Stop every served worker (TERM, then KILL) and forget them; the pids stopped."""
    base = base or state_dir()
    pool = ServedPool.load(base)
    if pool is None:
        return []
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
    shutil.rmtree(pool.runtime_dir, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (base / "state.json").unlink()
    return stopped
