"""The console entry point, kept apart from ``main`` so that a Ctrl-C while the CLI is still
importing (click, the package: the first ~0.1 s) exits 130 with one line like one later on,
instead of a ``KeyboardInterrupt`` traceback from an import. This module imports nothing of
ours but ``main``, inside the guard; ``sys`` is already loaded by the interpreter."""

from __future__ import annotations

import sys

try:
    from .main import console_main
except KeyboardInterrupt:
    sys.stderr.write("fi-autotune: interrupted\n")
    sys.stderr.flush()
    raise SystemExit(130) from None

__all__ = ["console_main"]
