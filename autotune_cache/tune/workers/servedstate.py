"""What ``fi-autotune workers start`` leaves behind, read back as typed records: ``state.json``
(each worker's pid, socket, GPU and log; the environment they were started in; whether all of
them answered yet) and the private directory of their sockets. No torch here.

The state is read strictly: a file that is not what ``start`` writes is an error said as such
(``StateError``), never taken for "no workers" (they may be running) and never trusted with a
process to signal or a directory to remove. It must be a regular file of at most
``MAX_STATE_BYTES`` (opened without blocking: a FIFO or a link to ``/dev/zero`` there is refused
before a byte is read), JSON of ``start``'s shape: the keys it writes and no others, pids in the
kernel's range (2 to ``PID_MAX``), distinct, indexes 0, 1, ..., a ``runtime_dir`` of the shape
``start`` makes (an absolute, normalised ``fia-*`` directory - never ``/``, never the state dir)
holding every socket. A pid is a served worker only while its command line is ``... --serve <its
socket> ...``; the socket directory is removed only when it is one this tool makes (``fia-*`` in
the temp dir, ours), file by known file.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from autotune_cache.safeopen import FileRefused, read_bounded

#: The prefix of the sockets' private directory under the system's temp dir.
RUNTIME_PREFIX = "fia-"
#: state.json larger than this is not one ``start`` wrote (its fingerprint holds at most the
#: environment a process can be given, ARG_MAX: 2 MiB on Linux).
MAX_STATE_BYTES = 8 << 20
#: The largest pid Linux gives (PID_MAX_LIMIT on 64-bit: /proc/sys/kernel/pid_max is at most this).
PID_MAX = 1 << 22
#: The keys ``start`` writes.
STATE_KEYS = frozenset({"workers", "fingerprint", "started", "idle_s", "runtime_dir", "ready"})


class StateError(Exception):
    """``state.json`` exists but is not what ``workers start`` writes."""


def state_dir() -> Path:
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("fi-autotune")) / "workers"


@dataclass(frozen=True)
class ServedWorker:
    index: int
    pid: int
    socket: str
    device: str
    log: str

    def alive(self) -> bool:
        """The process is there and is still this worker: its command line holds ``--serve`` and
        then exactly this socket (a pid can be reused; nothing else is ever signalled)."""
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            return False
        return any(a == b"--serve" and b == self.socket.encode() for a, b in zip(argv, argv[1:]))

    def exec_pending(self) -> bool:
        """Just spawned, its exec not done yet: the command line reads empty for that moment (the
        process is not a zombie). Only ``start``, waiting on what it spawned, asks this."""
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                if f.read():
                    return False
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


def _worker(d: object, i: int) -> ServedWorker:
    ok = (isinstance(d, dict) and set(d) == {"index", "pid", "socket", "device", "log"}
          and type(d["index"]) is int and type(d["pid"]) is int and 1 < d["pid"] <= PID_MAX and d["index"] == i
          and all(isinstance(d[k], str) for k in ("socket", "device", "log")) and os.path.isabs(d["socket"]))
    if not ok:
        raise StateError(f"workers[{i}] is not a served worker's record")
    return ServedWorker(**d)


def _check_runtime_dir(runtime: object, workers: tuple[ServedWorker, ...], base: Path) -> None:
    """``runtime_dir`` is of the shape ``start`` makes and holds every worker's socket."""
    if not (isinstance(runtime, str) and os.path.isabs(runtime) and os.path.normpath(runtime) == runtime
            and os.path.basename(runtime).startswith(RUNTIME_PREFIX)
            and os.path.realpath(runtime) not in (os.path.realpath(base), os.path.realpath("/"))):
        raise StateError(f"runtime_dir {str(runtime)[:200]!r} is not a sockets' directory `workers start` makes")
    if any(os.path.dirname(w.socket) != runtime for w in workers):
        raise StateError("a worker's socket is not in runtime_dir")
    if len({w.pid for w in workers}) != len(workers) or len({w.socket for w in workers}) != len(workers):
        raise StateError("two workers share a pid or a socket")


def _read_state(path: Path) -> object:
    """state.json's JSON, read bounded; None where there is none."""
    try:
        return json.loads(read_bounded(path, MAX_STATE_BYTES, what="workers' state file"))
    except FileNotFoundError:
        return None
    except FileRefused as e:
        raise StateError(str(e)) from None
    except (OSError, ValueError) as e:
        raise StateError(f"{path} is unreadable ({e})") from None
    except RecursionError:
        raise StateError(f"{path} is unreadable (JSON nested too deeply)") from None


@dataclass(frozen=True)
class ServedPool:
    """What ``state.json`` records. ``ready``: every worker answered ``start`` (until then a
    warm does not use them)."""

    workers: tuple[ServedWorker, ...]
    fingerprint: dict
    started: float
    idle_s: float
    runtime_dir: str
    ready: bool = True

    @classmethod
    def load(cls, base: Path) -> "ServedPool | None":
        """The state in ``base``; None where there is none; StateError where it is unreadable."""
        path = base / "state.json"
        d = _read_state(path)
        if d is None:
            return None
        try:
            if not isinstance(d, dict) or not isinstance(d.get("workers"), list) or not d["workers"]:
                raise StateError("no workers listed")
            if not set(d) <= STATE_KEYS:
                raise StateError(f"keys it never writes: {', '.join(sorted(map(str, set(d) - STATE_KEYS)))[:200]}")
            workers = tuple(_worker(w, i) for i, w in enumerate(d["workers"]))
            numbers = [d.get(k) for k in ("started", "idle_s")]
            if not all(type(x) in (int, float) and math.isfinite(x) for x in numbers):
                raise StateError("started or idle_s is not a number")
            if not isinstance(d.get("fingerprint"), dict) or not isinstance(d.get("runtime_dir"), str):
                raise StateError("fingerprint or runtime_dir missing")
            if type(d.get("ready", True)) is not bool:
                raise StateError("ready is not true or false")
            _check_runtime_dir(d["runtime_dir"], workers, base)
            return cls(workers, d["fingerprint"], float(d["started"]), float(d["idle_s"]), d["runtime_dir"],
                       d.get("ready", True) is True)
        except StateError as e:
            raise StateError(f"{path} is not what `fi-autotune workers start` writes ({e})") from None

    def save(self, base: Path) -> None:
        tmp = base / f"state.json.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"workers": [w.__dict__ for w in self.workers], "fingerprint": self.fingerprint,
                                   "started": self.started, "idle_s": self.idle_s, "runtime_dir": self.runtime_dir,
                                   "ready": self.ready}, indent=1))
        os.replace(tmp, base / "state.json")

    def alive(self) -> list[ServedWorker]:
        return [w for w in self.workers if w.alive()]


def make_runtime_dir() -> str:
    """The sockets' directory: private (mkdtemp: mode 0700), with a path short enough for them."""
    return tempfile.mkdtemp(prefix=RUNTIME_PREFIX)


def remove_runtime_dir(path: str, workers: tuple[ServedWorker, ...]) -> None:
    """Remove a sockets' directory this tool made - ``fia-*`` directly in the temp dir, owned by
    this user - by the files it puts there; anything else in it, or any other directory, stays."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except OSError:
        return
    if (not p.name.startswith(RUNTIME_PREFIX) or os.path.realpath(p.parent) != os.path.realpath(tempfile.gettempdir())
            or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700):
        return
    for name in ["fingerprint.json", *(os.path.basename(w.socket) for w in workers
                                       if os.path.dirname(w.socket) == str(p))]:
        with contextlib.suppress(OSError):
            os.unlink(p / name)
    with contextlib.suppress(OSError):
        os.rmdir(p)
