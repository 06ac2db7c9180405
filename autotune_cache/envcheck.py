"""Would FlashInfer here accept a cache file's ``_metadata``? Asked of FlashInfer itself.

This is the only module of the cache-tree commands that imports flashinfer (and so torch);
``metadata_checker`` is used only for ``ls --check-env`` / ``prune --status stale``; the rest of
this module imports nothing heavy.
"""

from __future__ import annotations

from typing import Callable

from .errors import FiAutotuneError


def installed_flashinfer_version() -> str | None:
    """From package metadata, without importing flashinfer (and so torch)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flashinfer-python")
    except PackageNotFoundError:
        return None


def metadata_checker() -> Callable[[dict], "dict | None"]:
    """Return ``check(saved_metadata) -> {field: (saved, current)}`` or None when accepted.

    Mirrors ``AutoTuner.load_configs``: a file is ignored on any hard or soft mismatch.
    """
    try:
        from flashinfer.autotuner.autotuner import _classify_metadata_mismatches, _collect_metadata
    except Exception as e:  # ImportError, or a CUDA library failing to load
        raise FiAutotuneError(f"--check-env needs an importable flashinfer: {e}") from None
    current = _collect_metadata()

    def check(saved: dict) -> "dict | None":
        if not saved:
            return None  # no _metadata: FlashInfer loads it without a check
        hard, soft = _classify_metadata_mismatches(saved, current)
        return {**hard, **soft} or None

    check.current = current  # type: ignore[attr-defined]
    return check
