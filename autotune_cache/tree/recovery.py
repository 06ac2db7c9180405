"""Finishing what a killed writer left: journals whose owner is gone are rolled forward (the
swaps they record are completed, so an archive import ends all-or-nothing), and staging and
trash dirs of dead owners are removed. Cheap when there is nothing to do; does nothing on a
read-only tree (``ls`` reports what it finds there)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from autotune_cache.tree.atomic import fsync_dir
from autotune_cache.tree.dirs import remove_tree
from autotune_cache.tree.layout import OUR_PREFIX, STAGE_DIR_RE, TRASH_DIR_RE, CacheLayout
from autotune_cache.tree.locks import dead_owner, entry_lock
from autotune_cache.tree.swap import inode_of, swap_in, unlink_synced

JOURNAL_FORMAT = 1


def recover_journals(layout: CacheLayout, root: Path) -> list[str]:
    """Finish the swaps of every journal whose owner is gone; returns what it did, for notes.

    Cheap when there is nothing to do (one failed stat). Safe on a read-only tree (does nothing:
    a journal there is reported by ``ls`` as a finding).
    """
    base = layout.base(root)
    jdir = layout.journal_dir(root)
    try:
        listing = os.listdir(jdir)
    except OSError:
        return []
    names = sorted(n for n in listing if n.endswith(".json"))
    for tmp in (n for n in listing if n.endswith(".tmp") and n.startswith(OUR_PREFIX)):
        # a journal killed while being written: its transaction never started swapping
        with dead_owner(base, tmp[len(OUR_PREFIX):].split("-", 1)[0]) as dead:
            if dead:
                with contextlib.suppress(OSError):
                    os.unlink(jdir / tmp)
    done = []
    for name in names:
        token = name.split("-", 1)[0]
        with dead_owner(base, token) as dead:
            if not dead:
                continue
            path = jdir / name
            try:
                journal = json.loads(path.read_bytes())
                rows = journal["entries"]
            except (OSError, ValueError, KeyError, TypeError):
                unlink_synced(path)  # a half-written journal: its transaction never started swapping
                continue
            finished = _roll_forward(layout, root, base, rows)
            unlink_synced(path)
            for row in rows:
                trash = base / row["trash"]
                if os.path.lexists(trash):
                    remove_tree(trash)
            done.append(f"finished an interrupted write of {finished} of {len(rows)} entries")
    return done


def _roll_forward(layout: CacheLayout, root: Path, base: Path, rows: list) -> int:
    finished = 0
    for row in rows:
        try:
            eid = layout.make_id(tuple(row["id"]))
        except (ValueError, TypeError):
            continue
        target, stage, trash = base / row["target"], base / row["stage"], base / row["trash"]
        with entry_lock(layout, root, eid, timeout=120):
            now_target, now_stage = inode_of(target), inode_of(stage)
            if now_target == row["stage_ino"]:
                if now_stage is not None and now_stage == row["old_ino"]:
                    os.rename(stage, trash)  # exchanged; the old entry was still at the stage name
                finished += 1
            elif now_stage == row["stage_ino"] and now_target == row["old_ino"]:
                swap_in(stage, target, trash)  # not swapped yet
                finished += 1
            elif now_stage == row["stage_ino"] and now_target is None and inode_of(trash) == row["old_ino"]:
                os.rename(stage, target)  # between the two renames of the fallback
                fsync_dir(target.parent)
                finished += 1
            elif now_stage == row["stage_ino"]:
                remove_tree(stage)  # the target changed since (an engine wrote it): keep that
    return finished


def remove_dead_siblings(base: Path, target: Path) -> None:
    """Staging and trash dirs of ``target``'s name left by owners that are gone."""
    parent = target.parent
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        m = STAGE_DIR_RE.match(name) or TRASH_DIR_RE.match(name)
        if m and m["name"] == target.name:
            with dead_owner(base, m["owner"]) as dead:
                if dead:
                    remove_tree(parent / name)


def remove_leftover(base: Path, path: Path) -> tuple[bool, str | None]:
    """Remove a staging or trash dir found by a scan if its owner is gone: (removed, error)."""
    m = STAGE_DIR_RE.match(path.name) or TRASH_DIR_RE.match(path.name)
    if not m:
        return False, None
    with dead_owner(base, m["owner"]) as dead:
        if not dead:
            return False, None
        err = remove_tree(path)
        return err is None, err
