"""What is installed in this Python, read from package metadata without importing it.

Importing flashinfer imports torch (seconds, and CUDA libraries); the tree commands must stay
instant, and the serving engine's version must be readable in an image without starting it.
"""

from __future__ import annotations

import re

from autotune_cache.errors import UsageError

#: A version as it may stand in a cache path (FlashInfer's, in every engine's tree): one path
#: component, no separators, bounded. FlashInfer versions are PEP 440 strings ("0.7.2.post1",
#: "0.8.0rc1+cu130"); "unknown" is what SGLang writes when flashinfer has no __version__.
VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+!_-]{0,63}\Z")


def installed_version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version  # ~40 ms: only when asked

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def installed_flashinfer_version() -> str | None:
    return installed_version("flashinfer-python")


def flashinfer_version_of(given: str | None) -> str:
    """The FlashInfer version in the entry's path: ``--flashinfer-version``, else the installed one."""
    version = given or installed_flashinfer_version()
    if not version:
        raise UsageError("flashinfer-python is not installed: pass --flashinfer-version")
    if not VERSION_RE.match(version):
        raise UsageError(f"invalid --flashinfer-version {version!r}")
    return version
