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


_PEP440 = re.compile(r"^v?([0-9]+(?:\.[0-9]+)*)(?:[-_.]?(a|b|rc)([0-9]*))?(?:[-_.]?post([0-9]*))?"
                     r"(?:[-_.]?dev([0-9]*))?(?:\+[0-9A-Za-z.]*)?\Z", re.IGNORECASE)
_PHASE = {"a": 1, "b": 2, "rc": 3}


def version_order(version: str | None) -> tuple:
    """A sort key that orders FlashInfer versions as PEP 440 does for the forms FlashInfer uses
    (``0.7.1 < 0.7.2rc1 < 0.7.2 < 0.7.2.post1``; a ``.dev`` release before its final), read
    without ``packaging`` (not a dependency). A version it cannot read ("unknown", None) sorts
    below every readable one: ``prune --keep-latest`` never keeps a guess over a known release."""
    m = _PEP440.match(version or "")
    if not m:
        return (0,)
    release = tuple(int(x) for x in m[1].split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    if m[2]:
        phase = (_PHASE[m[2].lower()], int(m[3] or 0))
    elif m[5] is not None and m[4] is None:
        phase = (0, 0)  # 0.8.0.dev1: before 0.8.0a1
    else:
        phase = (4, 0)
    post = int(m[4] or 0) + 1 if m[4] is not None else 0
    return (1, release, phase, post)


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
