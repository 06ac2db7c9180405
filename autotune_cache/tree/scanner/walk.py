"""Walking a layout's tree down to its entry dirs: which directories are entries (by the
layout's levels), and what else lies between them (our staging, trash and journal names,
temp files, foreign things) as ``Finding``s. No entry is read here (``entry_scan`` does)."""

from __future__ import annotations

import os
import stat as stat_mod
from pathlib import Path
from typing import Iterator

from autotune_cache.errors import FiAutotuneError
from autotune_cache.tree.crashsafe.dirs import dir_size, list_dir
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId
from autotune_cache.tree.layouts.own_names import JOURNAL_DIRNAME, LOCKS_DIRNAME, STAGE_DIR_RE, TEMP_FILE_RE, TRASH_DIR_RE
from autotune_cache.tree.records import Finding, finding_for


def check_base(layout: CacheLayout, root: Path) -> Path | None:
    """The layout's managed subtree, None if absent; an error if something else is in its place."""
    path = Path(root)
    for part in layout.base_parts():
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise FiAutotuneError(f"cannot read {path}: {e.strerror or e}") from None
        if stat_mod.S_ISLNK(st.st_mode):
            raise FiAutotuneError(f"{path} is a symlink inside the cache tree; fi-autotune does not follow it "
                                  "(point --cache-dir at the real tree)")
        if not stat_mod.S_ISDIR(st.st_mode):
            raise FiAutotuneError(f"{path} is not a directory: this is not a cache tree (it should hold "
                                  f"{'/'.join(layout.base_parts())}/<version>/...)")
    return path


def _tree_level_finding(path: Path, child: os.DirEntry) -> Finding | None | bool:
    """Our own hidden names found between entries; False: the name is gone since its directory
    was listed (a trash dir ``rm`` just finished removing), nothing to report."""
    name = child.name
    try:
        st = child.stat(follow_symlinks=False)
    except FileNotFoundError:
        return False  # lstat of the name itself: it is no longer in its directory
    except OSError as e:
        return Finding(path / name, "unreadable", f"cannot stat: {e.strerror or e}")
    p = path / name
    is_dir = stat_mod.S_ISDIR(st.st_mode)
    if TEMP_FILE_RE.match(name) and stat_mod.S_ISREG(st.st_mode):
        return Finding(p, "temp", "temporary file of an interrupted write", st.st_size, st.st_mtime)
    if STAGE_DIR_RE.match(name) and is_dir:
        size, _, _ = dir_size(p)
        return Finding(p, "stage", "staging dir of a running or interrupted write", size, st.st_mtime)
    if TRASH_DIR_RE.match(name) and is_dir:
        size, _, _ = dir_size(p)
        return Finding(p, "trash", "an entry being deleted (or whose deletion was interrupted)", size, st.st_mtime)
    return None


def list_entry_dirs(layout: CacheLayout, root: Path) -> tuple[list[tuple[Path, EntryId]], list[Finding]]:
    """(entry dir, id) for every entry of ``layout`` under ``root``, plus what does not belong."""
    findings: list[Finding] = []
    return list(iter_entry_dirs(layout, root, findings)), findings


def iter_entry_dirs(layout: CacheLayout, root: Path, findings: list[Finding]) -> Iterator[tuple[Path, EntryId]]:
    """``list_entry_dirs`` one entry at a time, in the same order (sorted by name at every
    level): a streamed ``ls`` holds one directory's names, not a Path per entry of the tree.
    What does not belong is appended to ``findings`` as the walk passes it."""
    base = check_base(layout, root)
    if base is None:
        return

    def walk(path: Path, depth: int, parts: tuple[str, ...]) -> Iterator[tuple[Path, EntryId]]:
        level = layout.levels[depth]
        children, err = list_dir(path)
        if err:
            findings.append(Finding(path, "unreadable", err))
        for child in children:
            name = child.name
            if depth == 0 and (name == LOCKS_DIRNAME or name in layout.skip_names):
                continue
            if depth == 0 and name == JOURNAL_DIRNAME:
                jchildren, _ = list_dir(path / name)
                for j in jchildren:
                    if j.name.endswith(".json"):
                        findings.append(Finding(path / name / j.name, "journal",
                                                "journal of an interrupted multi-entry write or delete"))
                continue
            # d_type answers the common case (a real directory with a valid name) without a stat.
            if level.valid(name) and child.is_dir(follow_symlinks=False):
                if depth + 1 == len(layout.levels):
                    yield path / name, EntryId(layout.name, (*parts, name))
                else:
                    yield from walk(path / name, depth + 1, (*parts, name))
                continue
            found = _tree_level_finding(path, child)
            if found is False:
                continue
            if found is None:
                try:
                    st = child.stat(follow_symlinks=False)
                except OSError as e:
                    found = Finding(path / name, "unreadable", f"cannot stat: {e.strerror or e}")
                else:
                    found = finding_for(path / name, st, "" if not stat_mod.S_ISDIR(st.st_mode) else f"not a {level.name} directory")
            findings.append(found)

    yield from walk(base, 0, ())
