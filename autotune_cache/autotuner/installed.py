"""What is installed in this Python, read from package metadata without importing it.

Importing flashinfer imports torch (seconds, and CUDA libraries); the tree commands must stay
instant, and the serving engine's version must be readable in an image without starting it.
"""

from __future__ import annotations



def installed_version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version  # ~40 ms: only when asked

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def installed_flashinfer_version() -> str | None:
    return installed_version("flashinfer-python")
