"""Crash-safe file primitives and locks. Everything that writes to a tree goes through here.

Readers (engines included) never take a lock, so every file and every entry must appear whole
or not at all: files are written to a temp name, fsynced and renamed; entries are assembled in
a staging dir and swapped in with one rename (``txn.py``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
import stat as stat_mod
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from autotune_cache.errors import EntryLocked, FiAutotuneError, os_error_message
from autotune_cache.tree.crashsafe.faults import crashpoint, exchange_allowed
from autotune_cache.tree.layouts.own_names import OUR_PREFIX

if TYPE_CHECKING:  # filelock is imported where a lock is taken: ls never takes one (12 ms)
    import filelock


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def ensure_dirs(top: Path, parts: tuple[str, ...] | list[str]) -> Path:
    """``mkdir -p top/parts...`` refusing to go through a symlink or a non-directory.

    ``top`` itself may be a symlink (a cache root on another disk is the user's choice); every
    directory below it is inside the tree, where a symlink would send our writes somewhere
    ``ls`` and ``prune`` never look. Tolerates a pruner removing an empty directory in between.
    """
    path = Path(top)
    for part in parts:
        path = path / part
        for _ in range(20):
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                try:
                    os.mkdir(path, 0o755)
                except FileExistsError:
                    continue
                except FileNotFoundError:
                    raise  # the parent vanished: the caller retries from the top
                continue
            if stat_mod.S_ISLNK(st.st_mode):
                raise FiAutotuneError(f"{path} is a symlink inside the cache tree: refusing to write through it")
            if not stat_mod.S_ISDIR(st.st_mode):
                raise FiAutotuneError(f"{path} exists and is not a directory")
            break
    return path


def ensure_tree_dirs(top: Path, parts: tuple[str, ...] | list[str]) -> Path:
    """``ensure_dirs`` that starts again when a concurrent prune removes a parent mid-way."""
    return retry_vanished_dir(lambda: ensure_dirs(top, parts))


def write_new_file(path: Path, data: bytes, mode: int = 0o644) -> os.stat_result:
    """Create ``path`` (which must not exist), write, fsync; return its stat."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        return os.fstat(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644, tmp_name: str | None = None,
                       step: str = "atomic.temp_written") -> None:
    """Replace ``path`` with ``data`` so that no reader can ever see a prefix of it. The temp
    file beside it is ``tmp_name`` (a store's names carry their owner), else ours; a write that
    fails (a full disk) removes it. ``step``: its ``crashpoint`` once the temp file is whole."""
    path = Path(path)
    tmp = path.parent / (tmp_name or f"{OUR_PREFIX}{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        write_new_file(tmp, data, mode)
        crashpoint(step)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def remove_our_temps(directory: Path) -> int:
    """Remove our own temp files (``atomic_write_bytes``'s ``.fi-autotune-*.tmp``) in
    ``directory``; how many. Call it only holding the lock that every writer of ``directory``
    holds while its temp file exists (the entry's lock): each one found is then a killed
    writer's, whatever its age. An engine's own temp files (FlashInfer's ``.autotune_*.tmp``,
    written with no lock) are never touched here: only their age can say they are dead."""
    removed = 0
    try:
        children = list(os.scandir(directory))
    except OSError:
        return 0
    for child in children:
        if not (child.name.startswith(OUR_PREFIX) and child.name.endswith(".tmp")):
            continue
        with contextlib.suppress(OSError):
            if child.is_file(follow_symlinks=False):
                os.unlink(child.path)
                removed += 1
    return removed


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange_paths(a: Path, b: Path) -> bool:
    """Atomically swap two directories (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns False where the libc or the filesystem cannot do it (NFS, some FUSE mounts); the
    caller then uses two renames under the journal instead.
    """
    import ctypes
    import ctypes.util

    if not exchange_allowed():  # a test launcher's: take the two-rename path
        return False
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
    """Hold SIGINT/SIGTERM until the block ends, so Ctrl-C cannot split a multi-step commit.

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


def _lock_file(path: Path, timeout: float) -> filelock.BaseFileLock:
    """A held ``filelock`` on ``path``; its parents are made (never through a symlink)."""
    import filelock

    lock = filelock.FileLock(str(path), timeout=timeout)
    lock.acquire()
    return lock


def make_lock_dirs(top: Path, path: Path) -> None:
    ensure_tree_dirs(top, Path(path).parent.relative_to(top).parts)


@contextlib.contextmanager
def file_lock(top: Path, path: Path, what: str, timeout: float = -1) -> Iterator[None]:
    """Hold the lock file ``path`` (under the tree's ``top``) for the block.

    ``timeout=0`` fails at once with EntryLocked; a tree we cannot write to is one clear error.
    """
    import filelock

    try:
        lock = retry_vanished_dir(lambda: (make_lock_dirs(top, path), _lock_file(path, timeout))[1])
    except filelock.Timeout:
        raise EntryLocked(f"{what} is locked by another writer") from None
    except OSError as e:
        raise FiAutotuneError(f"cannot lock {what}: {os_error_message(e)}") from None
    try:
        yield
    finally:
        lock.release()


def retry_vanished_dir(make):
    """``make()`` again when its directory vanished between creating it and opening a file in
    it: another process removed it as empty (a prune, or a refused import taking away the
    dirs it made)."""
    for attempt in range(20):
        try:
            return make()
        except FileNotFoundError:
            if attempt == 19:
                raise
    raise AssertionError("unreachable")


def try_lock(path: Path) -> filelock.BaseFileLock | None:
    """The lock if nobody holds it (its owner is gone), else None; never waits, never creates
    parent dirs, None where the file cannot be opened (a read-only tree)."""
    import filelock

    lock = filelock.FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except (filelock.Timeout, OSError):
        return None
    return lock


@contextlib.contextmanager
def peek_lock(path: Path) -> Iterator[bool | None]:
    """A reader's ``try_lock``: True (holding the lock while the block runs) if nobody holds
    the lock file at ``path``, False if somebody does, None if it cannot tell. It creates and
    removes nothing: the file is opened read-only, never with ``O_CREAT`` (an ``flock`` needs
    no write access), so ``ls`` or a dry run leaves the tree as it found it. A missing file is
    free (its owner made it before anything that names it, and only it removes it, once it is
    done); a file that cannot be opened, or is not a regular file, cannot tell."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        yield True
        return
    except OSError:
        yield None
        return
    try:
        if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
            free = None
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                free = True
            except OSError:
                free = False  # held: its owner runs
        yield free
    finally:
        os.close(fd)
