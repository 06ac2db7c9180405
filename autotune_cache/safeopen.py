"""Opening a file a user named, or one found in a tree, for reading: never a hang, never an
unbounded read.

A path may name anything: a FIFO with no writer (a plain ``open`` blocks in the kernel for ever),
a character device (``/dev/zero`` reads until memory runs out), a directory, a socket, a sparse
giant. ``open_bounded`` opens with ``O_NONBLOCK`` (so opening a FIFO returns at once), asks
``fstat`` what the descriptor is before the first byte is read, and refuses whatever is not a
regular file unless the caller reads a stream (``stream_ok``: ``doctor -`` on stdin, a pipe). A
regular file larger than the caller's cap is refused before it is read; the reader it returns
stops with ``FileTooLarge`` past the cap anyway (a file that grows while being read, a
``/proc`` file whose size says 0). ``O_NONBLOCK`` is cleared once the file is known to be
regular: reads then behave as usual.

Callers choose the error their command shows (``doctor``: a usage error, exit 2; ``workers``: a
state error, exit 1; the digest index: no index). ``FileRefused`` carries one line naming the
path and what it is; ``OSError`` (no such file, permission) passes through as from ``open``.
"""

from __future__ import annotations

import errno
import fcntl
import io
import os
import stat

from autotune_cache.errors import FiAutotuneError


class FileRefused(FiAutotuneError):
    """A path that names something this command does not read: a FIFO, a device, a socket."""

    def __init__(self, message: str, path: object, kind: str):
        super().__init__(message)
        self.path = path
        self.kind = kind


class FileTooLarge(FileRefused):
    """A file (or stream) over the caller's cap, found before or while reading it."""


def kind_of(mode: int) -> str:
    """What a file is, in words: ``regular file``, ``FIFO``, ``character device``..."""
    for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISLNK, "symbolic link")):
        if test(mode):
            return name
    return "special file"


def _size_words(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


class CappedReader(io.RawIOBase):
    """A binary reader that raises ``FileTooLarge`` once more than ``cap`` bytes came through."""

    def __init__(self, raw, cap: int, path: object, what: str):
        super().__init__()
        self._raw, self.cap, self.path, self.what, self.count = raw, cap, path, what, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self._raw.readinto(b)
        self.count += n or 0
        if self.count > self.cap:
            raise FileTooLarge(f"{self.path}: {self.what} is over {_size_words(self.cap)}", self.path, "too large")
        return n

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def open_checked_fd(path: os.PathLike | str, cap: int | None, *, what: str = "file", stream_ok: bool = False,
                    nofollow: bool = False) -> int:
    """A descriptor of ``path`` for reading, blocking again, once ``fstat`` said what it is: a
    directory raises ``IsADirectoryError`` (as ``open`` does); a FIFO, device or socket
    ``FileRefused`` unless ``stream_ok``; a regular file over ``cap`` (None: no cap, for a file
    read with ``pread`` piece by piece) ``FileTooLarge``. ``what`` names the file in those lines."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags | (os.O_NOFOLLOW if nofollow else 0))
    try:
        st = os.fstat(fd)
        kind = kind_of(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(st.st_mode) and not stream_ok:
            raise FileRefused(f"{path} is a {kind}, not a regular file: refused as a {what}", path, kind)
        if cap is not None and stat.S_ISREG(st.st_mode) and st.st_size > cap:
            raise FileTooLarge(f"{path}: {what} is over {_size_words(cap)} ({st.st_size} bytes)", path, "too large")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_bounded(path: os.PathLike | str, cap: int, *, what: str = "file", stream_ok: bool = False,
                 nofollow: bool = False) -> io.BufferedReader:
    """``path`` opened for reading, checked before its first byte (``open_checked_fd``): a
    buffered binary reader that raises ``FileTooLarge`` past ``cap`` bytes."""
    fd = open_checked_fd(path, cap, what=what, stream_ok=stream_ok, nofollow=nofollow)
    try:
        raw = io.FileIO(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise
    return io.BufferedReader(CappedReader(raw, cap, path, what))


def read_bounded(path: os.PathLike | str, cap: int, *, what: str = "file", nofollow: bool = False) -> bytes:
    """The whole of a small regular file (state, a manifest, an env file), at most ``cap`` bytes;
    see ``open_bounded`` for what is refused."""
    with open_bounded(path, cap, what=what, nofollow=nofollow) as f:
        return f.read()
