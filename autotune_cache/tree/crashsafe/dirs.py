"""Listing, sizing and removing directories the way the tree needs it: never following a
symlink, never raising for what cannot be read or removed (the error comes back as text, for a
finding or a result row)."""

from __future__ import annotations

import os
import shutil
import stat as stat_mod
from pathlib import Path

from autotune_cache.errors import os_error_message

#: Files walked inside an engine side directory (SGLang's runs/) before giving up on its size.
MAX_SIDE_FILES = 10_000


def list_dir(path: Path, sort: bool = True) -> tuple[list[os.DirEntry], str | None]:
    """The children of ``path`` (sorted by name unless ``sort`` is off), or why not."""
    try:
        with os.scandir(path) as it:
            children = list(it)
    except OSError as e:
        return [], f"cannot list: {e.strerror or e}"
    if sort:
        children.sort(key=lambda c: c.name)
    return children, None


def dir_size(path: Path, limit: int = MAX_SIDE_FILES) -> tuple[int, float, list[Path]]:
    """(bytes, newest mtime, files) of the regular files under ``path``, at most ``limit`` files."""
    total, newest, files = 0, 0.0, []
    for dirpath, _dirnames, filenames in os.walk(path, followlinks=False):
        for name in filenames:
            if len(files) >= limit:
                return total, newest, files
            p = Path(dirpath) / name
            try:
                st = p.lstat()
            except OSError:
                continue
            if stat_mod.S_ISREG(st.st_mode):
                total += st.st_size
                newest = max(newest, st.st_mtime)
                files.append(p)
    return total, newest, files


def remove_tree(path: Path) -> str | None:
    """``rm -r`` of a staging or trash dir (symlinks inside are removed, never followed).
    Returns the error of what could not be removed, or None."""
    errors: list[str] = []

    def onerror(func, p, exc_info):  # noqa: ARG001
        if not isinstance(exc_info[1], FileNotFoundError):
            errors.append(os_error_message(exc_info[1], p))

    shutil.rmtree(path, onerror=onerror)
    return errors[0] if errors else None


def first_missing(deepest: str | Path) -> Path | None:
    """The highest directory on the way to ``deepest`` (an absolute path, ``..`` and symlinks
    resolved: ``os.path.realpath``) that does not exist yet (None: all do)."""
    deepest = Path(deepest)
    for p in [*reversed(deepest.parents), deepest]:
        if not os.path.lexists(p):
            return p
    return None


def remove_dir_chain(top: Path, deepest: Path) -> None:
    """rmdir ``deepest`` and its parents up to and including ``top``, while they are empty: only
    the directories a transaction made on its way down, never a file, never a directory another
    process has put anything in (the first non-empty one stops it)."""
    p = Path(deepest)
    while True:
        try:
            os.rmdir(p)
        except OSError:
            return
        if p == top or top not in p.parents:
            return
        p = p.parent


def remove_empty_parents(path: Path, stop: Path) -> None:
    """rmdir ``path``'s parents while empty, never ``stop`` or above."""
    p = Path(path).parent
    stop = Path(stop)
    while p != stop and stop in p.parents:
        try:
            os.rmdir(p)
        except OSError:
            return
        p = p.parent
