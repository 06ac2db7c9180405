"""Failures and the exit code each one maps to: the one table the CLI consults.

Every error a command can meet becomes one of these before it reaches the user, so the CLI
prints one line and exits with ``exit_code``; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What ``fi-autotune`` returns (documented in README and ``fi-autotune --help``)."""

    OK = 0
    FAILURE = 1  # the command could not do its job: I/O error, refused overwrite, bad archive, an id
    # that names no entry or several (a lookup failure, as docker's)
    USAGE = 2  # the request itself is wrong: bad flag value, impossible topology, a duration without unit
    INTERRUPTED = 130  # Ctrl-C / SIGINT (128 + 2), as shells report it


class FiAutotuneError(Exception):
    """A command could not do its job (exit 1)."""

    exit_code = ExitCode.FAILURE

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class UsageError(FiAutotuneError):
    """The request itself is wrong (exit 2): unknown schema, impossible topology, bad size."""

    exit_code = ExitCode.USAGE


class AmbiguousEntry(FiAutotuneError):
    """A reference (a key, a key prefix) that names several entries: a lookup failure like an
    unknown one (exit 1, as docker's), never a guess between them."""


class RootMissing(FiAutotuneError):
    """The cache root does not exist: an error for a command that reads it, "nothing to do"
    for ``prune`` (a cron job on a fresh node)."""


class EntryLocked(FiAutotuneError):
    """Another writer holds the entry's lock."""


class Interrupted(FiAutotuneError):
    """Stopped by SIGINT/SIGTERM after leaving everything complete (exit 130)."""

    exit_code = ExitCode.INTERRUPTED


def is_interrupt(exc: BaseException) -> bool:
    """True when ``exc`` is a ``KeyboardInterrupt`` or has one in its cause/context chain: a Ctrl-C
    in disguise. Python wraps some exceptions raised inside class creation - on 3.11 an interrupt
    landing in a dataclass field's ``__set_name__`` while a command's module loads comes out as
    ``RuntimeError("Error calling __set_name__ ...")`` - and that is still the user's Ctrl-C
    (exit 130, one line), not a bug of ours."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def os_error_message(e: OSError, path: object | None = None) -> str:
    """``cannot write /x/y: No space left on device`` - the path and the reason, nothing else."""
    where = path if path is not None else (e.filename if e.filename is not None else "")
    reason = e.strerror or str(e)
    return f"{where}: {reason}" if where != "" else reason
