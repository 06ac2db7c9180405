"""The real ``fi-autotune`` command line, killed at an exact step:

    python tests/standins/fault_cli.py --crash-at STEP[:N] [--no-exchange] -- ARGS...

runs the click CLI in this process exactly as ``fi-autotune ARGS...`` does (same output, same
exit codes), with a fault hook installed first (``autotune_cache.tree.crashsafe.faults``): the process
SIGKILLs itself the N-th time (default the first) it reaches the crash point ``STEP``
(``txn.journaled``, ``prune.renamed``, ``store.bundle_uploaded``...). A real kill at an exact
step, not a mocked failure. ``--no-exchange`` turns ``renameat2(RENAME_EXCHANGE)`` off, so that
an entry is swapped in by the journaled pair of renames that NFS and some FUSE mounts get.

The library reads no variable for this: a user's environment can never make it kill itself.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Callable

from autotune_cache.tree.crashsafe import faults
from fi_autotune_cli import main as cli_main

#: this launcher as a command; ``crash_at`` puts its options after it
FAULT_CLI = [sys.executable, str(Path(__file__).resolve())]


def kill_at(target: str, sig: int = signal.SIGKILL) -> Callable[[str], None]:
    """The hook for ``STEP[:N]``: SIGKILL (or ``sig``: SIGINT is a Ctrl-C there) this process the
    N-th time it reaches ``STEP``."""
    point, _, nth = target.partition(":")
    times = int(nth or 1)
    hits = 0

    def hook(name: str) -> None:
        nonlocal hits
        if name != point:
            return
        hits += 1
        if hits >= times:
            os.kill(os.getpid(), sig)

    return hook


def crash_at(target: str | None = None, no_exchange: bool = False, signal_name: str = "KILL") -> list[str]:
    """The command that runs ``fi-autotune`` killed at ``target`` (``STEP[:N]``; None: not
    killed; ``signal_name``: INT for a Ctrl-C there) and without ``RENAME_EXCHANGE`` if asked;
    its arguments follow."""
    return [*FAULT_CLI, *(["--crash-at", target, "--signal", signal_name] if target else []),
            *(["--no-exchange"] if no_exchange else []), "--"]


def run(argv: list[str]) -> int:
    """``fi-autotune`` with the faults that ``argv``'s options (up to ``--``) ask for."""
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(prog="standins/fault_cli.py", description=__doc__.splitlines()[0])
    ap.add_argument("--crash-at", metavar="STEP[:N]", help="SIGKILL at the N-th time (default 1st) STEP is reached")
    ap.add_argument("--signal", default="KILL", help="the signal sent there (default KILL; INT: a Ctrl-C)")
    ap.add_argument("--no-exchange", action="store_true", help="swap entries in with two renames")
    opts = ap.parse_args(argv[:split])
    hook = kill_at(opts.crash_at, signal.Signals["SIG" + opts.signal]) if opts.crash_at else None
    faults.install(hook, exchange=not opts.no_exchange)
    return cli_main.main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
