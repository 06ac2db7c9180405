"""Where a test launcher may inject faults into the write and delete paths; inert otherwise.

The reliability tests kill real processes at exact steps (after the journal is written, between
two renames, ...) rather than mocking ``os``. Each such step calls ``crashpoint("txn.journaled")``
and so on; in ``fi-autotune`` itself that call does nothing. A test launcher
(``tests/standins/fault_cli.py``) installs a hook first, in its own process, and runs the real CLI: the
hook SIGKILLs the process at the step it was told. Nothing here reads the environment, so no
variable a user happens to set can make the tool kill itself or change how it commits.
"""

from __future__ import annotations

from typing import Callable

_hook: Callable[[str], None] | None = None
_exchange = True


def crashpoint(name: str) -> None:
    """A named step of a write or delete; the installed hook (if any) is called with ``name``."""
    if _hook is not None:
        _hook(name)


def exchange_allowed() -> bool:
    """False once a launcher turned ``renameat2(RENAME_EXCHANGE)`` off, so that a test can take
    the journaled two-rename path that filesystems without it (NFS, some FUSE mounts) take."""
    return _exchange


def install(hook: Callable[[str], None] | None = None, *, exchange: bool = True) -> None:
    """For test launchers only: ``hook`` is called at every ``crashpoint`` from now on (None: no
    hook); ``exchange=False`` makes ``atomic.exchange_paths`` answer "not supported"."""
    global _hook, _exchange
    _hook = hook
    _exchange = exchange
