"""Crash-safe writes and the per-key-dir writer lock.

Readers (engines included) never take a lock, so every file must appear whole or not at all:
write a temp file in the same directory, flush, fsync, ``os.replace``, fsync the directory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
import threading
from pathlib import Path
from typing import Iterator

import filelock

from . import layout
from .errors import EntryLocked


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def makedirs(path: Path) -> None:
    """``mkdir -p`` that tolerates a pruner removing an empty parent in between."""
    for _ in range(20):
        try:
            path.mkdir(parents=True, exist_ok=True)
            return
        except FileNotFoundError:
            continue
    path.mkdir(parents=True, exist_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that no reader can ever see a prefix of it."""
    path = Path(path)
    for attempt in range(20):
        makedirs(path.parent)
        tmp = path.parent / f"{layout.OUR_TEMP_PREFIX}{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:
            if attempt == 19:
                raise
            continue  # parent pruned between mkdir and open: make it again
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        fsync_dir(path.parent)
        return


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange_paths(a: Path, b: Path) -> bool:
    """Atomically swap two directories (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns False where the libc or the filesystem cannot do it; the caller then falls back
    to replacing files one by one.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(a))


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends, so Ctrl-C cannot split a multi-file commit.

    Only the main thread can install handlers; elsewhere this is a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {}

    def _remember(signum, frame):  # noqa: ARG001
        received.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, _remember)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in received[:1]:
            os.kill(os.getpid(), sig)


@contextlib.contextmanager
def key_lock(root: Path, flashinfer_version: str, arch: str, key: str, timeout: float = -1) -> Iterator[None]:
    """The writer lock for one key dir. ``timeout=0`` fails at once with EntryLocked."""
    path = layout.lock_path(root, flashinfer_version, arch, key)
    makedirs(path.parent)
    lock = filelock.FileLock(str(path), timeout=timeout)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise EntryLocked(f"{flashinfer_version}/{arch}/{key} is locked by another writer") from None
    try:
        yield
    finally:
        lock.release()
