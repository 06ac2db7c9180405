"""The console entry point, kept apart from ``main`` so that a Ctrl-C while the CLI is still
importing (click, the package: the first ~0.1 s) exits 130 with one line like one later on,
instead of a ``KeyboardInterrupt`` traceback from an import - or an interrupt Python wrapped in
another exception (on 3.11, one landing in a dataclass field's or an enum member's
``__set_name__`` comes out as ``RuntimeError`` caused by it). This module imports nothing of
ours but ``main``, inside the guard, so the guard's own check of the exception chain is written
here (``errors.is_interrupt`` is the same rule for everything after start-up, which this module
cannot import before the guard is in place); ``sys`` is already loaded by the interpreter."""

from __future__ import annotations

import sys


def _interrupted(exc: BaseException) -> bool:
    for _ in range(64):  # a chain of causes is short; a looped one is not walked for ever
        if exc is None or isinstance(exc, KeyboardInterrupt):
            return exc is not None
        exc = exc.__cause__ or exc.__context__
    return False


try:
    from .main import console_main
except BaseException as e:  # noqa: BLE001 - only an interrupt is handled; the rest re-raised
    if not _interrupted(e):
        raise
    sys.stderr.write("fi-autotune: interrupted\n")
    sys.stderr.flush()
    raise SystemExit(130) from None

__all__ = ["console_main"]
