"""Who holds what in a tree: the owner token of this process and the writer lock of an entry.

Every staging, trash and journal name carries the token of the process that made it; that
process holds ``.fi-autotune-locks/owners/<token>.lock`` while it runs. Whoever can take that
lock knows the owner is gone and may finish or remove what it left, at once, without waiting
for an age to pass (see ``txn`` for the writes that use it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Callable, Iterator

from autotune_cache.errors import FiAutotuneError, os_error_message
from autotune_cache.tree.crashsafe.atomic import ensure_tree_dirs, file_lock, peek_lock, retry_vanished_dir, try_lock
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId
from autotune_cache.tree.layouts.own_names import OWNER_LOCKS_PARTS, owner_locks_dir

_OWNER: dict = {"pid": None, "held": {}}


def _held() -> dict:
    """base -> (token, lock) held by this process (a fork starts with none)."""
    if _OWNER["pid"] != os.getpid():
        _OWNER.update(pid=os.getpid(), held={})
    return _OWNER["held"]


def _owner_lock_path(base: Path, token: str) -> Path:
    return owner_locks_dir(base) / f"{token}.lock"


def hold_owner_lock(base: Path, make_base: Callable[[], object] | None = None) -> str:
    """This process's token in ``base``, its lock taken (a fresh token each time: once
    released, a token's lock file may be taken by a cleaner that found it dead). ``make_base``
    (a writer's) makes ``base`` again if it vanished before the lock was held: a refused import
    removes the empty tree it made, and may do so just after this writer made it too."""
    import filelock  # where a lock is taken: ls never takes one

    held = _held()
    if base not in held:
        token = secrets.token_hex(6)
        path = _owner_lock_path(base, token)
        lock = filelock.FileLock(str(path), timeout=0)
        try:
            retry_vanished_dir(lambda: (make_base and make_base(), ensure_tree_dirs(base, OWNER_LOCKS_PARTS),
                                        lock.acquire()))
        except filelock.Timeout:
            raise FiAutotuneError(f"the owner lock {path} is taken") from None
        except OSError as e:
            raise FiAutotuneError(f"cannot write to the cache tree: {os_error_message(e)}") from None
        held[base] = (token, lock)
    return held[base][0]


def release_owner_lock(base: Path) -> None:
    """Drop this process's owner lock in ``base`` once nothing of ours is left there (the file
    goes too: the token is never used again, so nobody can be waiting on it)."""
    token, lock = _held().pop(base, (None, None))
    if lock is not None:
        with contextlib.suppress(OSError):
            os.unlink(_owner_lock_path(base, token))
        lock.release()


@contextlib.contextmanager
def dead_owner(base: Path, token: str, *, tidy: bool = False) -> Iterator[bool]:
    """Yields True (holding its lock, where there is a lock file) when the owner of ``token``
    is gone, else False.

    By default it asks as a reader does (``ls``, ``show``, every ``--dry-run``, a plan): it
    creates and removes nothing - the lock file is opened read-only (``atomic.peek_lock``), and
    a missing one means its owner is gone; such a caller only reports, it never acts on it. ``tidy`` is for a writer that finishes or removes
    what a dead owner left: its lock file is taken (made if missing) and removed afterwards, as
    nobody will use that token again."""
    mine = _held().get(base)
    if mine is not None and mine[0] == token:
        yield False
        return
    path = _owner_lock_path(base, token)
    if not tidy:
        with peek_lock(path) as free:
            yield free is True  # None (cannot tell): as if alive - never finish a live writer's work
        return
    lock = try_lock(path)
    if lock is None:
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # nobody will use this token again
        lock.release()


def other_owner_alive(base: Path, *, tidy: bool = False) -> bool:
    """Whether a process other than this one holds an owner lock in ``base`` (a writer is
    running there). With ``tidy`` (a writer's sweep) dead owners' lock files are removed on the
    way; without it (``ls URL``, a dry run's plan) nothing is touched."""
    try:
        names = os.listdir(owner_locks_dir(base))
    except OSError:
        return False
    for name in names:
        if name.endswith(".lock"):
            with dead_owner(base, name[:-len(".lock")], tidy=tidy) as dead:
                mine = _held().get(base, (None,))[0] == name[:-len(".lock")]
                if not dead and not mine:
                    return True
    return False


@contextlib.contextmanager
def entry_lock(layout: CacheLayout, root: Path, eid: EntryId, timeout: float = -1) -> Iterator[None]:
    """The writer lock of one entry. ``timeout=0`` fails at once with EntryLocked."""
    with file_lock(layout.base(root), layout.lock_path(root, eid), str(eid), timeout):
        yield
