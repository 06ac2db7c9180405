"""Putting a staged entry in place of its target in one step, and taking it back: the moves a
transaction's journal records, shared by the writer (``txn``) and the recovery that finishes
or undoes them after a kill (``recovery``). Entries are told apart by inode."""

from __future__ import annotations

import contextlib
import os
import stat as stat_mod
from pathlib import Path

from autotune_cache.tree.crashsafe.atomic import exchange_paths, fsync_dir
from autotune_cache.tree.crashsafe.faults import crashpoint
from autotune_cache.tree.crashsafe.dirs import remove_tree


def inode_of(path: Path) -> int | None:
    """The inode of the directory at ``path``; -1 for something else there, None for nothing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_ino if stat_mod.S_ISDIR(st.st_mode) else -1


def swap_in(stage: Path, target: Path, trash: Path) -> None:
    """Put ``stage`` at ``target`` in one step; whatever was at ``target`` ends at ``trash``."""
    if not os.path.lexists(target):
        try:
            os.rename(stage, target)
            fsync_dir(target.parent)
            return
        except OSError:
            if not os.path.lexists(target):
                raise
            # an engine created the dir in between: replace it like any existing one
    if exchange_paths(stage, target):
        crashpoint("txn.exchanged")
        os.rename(stage, trash)  # ``stage`` holds the previous entry now
    else:
        os.rename(target, trash)
        crashpoint("txn.between_renames")
        os.rename(stage, target)
    fsync_dir(target.parent)
    carry_engine_side(trash, target)


def carry_engine_side(old: Path, new: Path) -> None:
    """The engine's own side dir (SGLang's runs/) belongs to the engine, not to the tuning we
    replace: move it into the new entry rather than deleting it."""
    runs_old, runs_new = old / "runs", new / "runs"
    if os.path.isdir(runs_old) and not os.path.islink(runs_old) and not os.path.lexists(runs_new):
        with contextlib.suppress(OSError):
            os.rename(runs_old, runs_new)


def unlink_synced(path: Path) -> None:
    """Remove a journal file and make its removal durable."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fsync_dir(path.parent)


def undo_swap(base: Path, row: dict) -> bool:
    """Put the previous entry back at ``target`` (by inode: wherever the swap had got to).
    True when the target holds what it held before the transaction."""
    target, stage, trash = base / row["target"], base / row["stage"], base / row["trash"]
    old = row["old_ino"]
    try:
        t = inode_of(target)
        if t != row["stage_ino"]:
            if t is None and old is not None and inode_of(trash) == old:
                os.rename(trash, target)  # stopped between the two renames of the fallback
            return inode_of(target) == old
        # The new entry is in place. Move it out of the way, then the old one back.
        new_out = target.parent / f"{trash.name}-new"
        os.rename(target, new_out)
        old_at = next((p for p in (stage, trash) if old is not None and inode_of(p) == old), None)
        if old_at is not None:
            os.rename(old_at, target)
        remove_tree(new_out)
        fsync_dir(target.parent)
        return inode_of(target) == old
    except OSError:
        return False
