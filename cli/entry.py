"""The console entry point, kept apart from ``main`` so that a Ctrl-C while the CLI is still
importing (click, the package: the first ~0.1 s) exits 130 with one line like one later on,
instead of a ``KeyboardInterrupt`` traceback from an import - or an interrupt Python wrapped in
another exception (``errors.is_interrupt``). ``errors`` is imported first, inside the guard: the
package's names load lazily, so that import runs ``errors.py`` alone, and an interrupt landing
there is a bare ``KeyboardInterrupt``. Nothing else of ours but ``main``; ``sys`` is already
loaded by the interpreter."""

from __future__ import annotations

import sys

try:
    from autotune_cache.errors import is_interrupt
    from .main import console_main
except BaseException as e:  # noqa: BLE001 - only an interrupt is handled; the rest re-raised
    if not (isinstance(e, KeyboardInterrupt) or ("is_interrupt" in globals() and is_interrupt(e))):
        raise
    sys.stderr.write("fi-autotune: interrupted\n")
    sys.stderr.flush()
    raise SystemExit(130) from None

__all__ = ["console_main"]
