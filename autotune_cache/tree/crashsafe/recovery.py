"""Finishing what a killed writer or deleter left: journals whose owner is gone are rolled
forward (the swaps they record are completed, so an archive import ends all-or-nothing; the
trash a delete journal names is removed), and staging and trash dirs of dead owners are
removed. Cheap when there is nothing to do; does nothing on a read-only tree (``ls`` reports
what it finds there).

Two kinds of journal live in ``.fi-autotune-journal/``, each named ``<owner>-<random>.json``:
a transaction's (``"entries"``: the swaps of one commit, ``txn``) and a delete's
(``"kind": "delete"``, rows under ``"deleted"``, which an older fi-autotune drops unread): the
entries one ``rm``/``prune`` took out of the tree, written once they are all in trash and
removed after the last trash dir. While a dead owner's delete journal is there, a re-run of the
same ``rm`` knows which of its ids were deleted, not mistyped; the next writer's
``sweep_leftovers`` finishes it, a reader never does. A dry run stages outside the tree, in a
scratch dir of the temp dir: what a killed one left there, the next dry run removes
(``sweep_dead_previews``)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat as stat_mod
import tempfile
import time
from pathlib import Path

from autotune_cache.tree.crashsafe.atomic import atomic_write_bytes, ensure_tree_dirs, fsync_dir, peek_lock
from autotune_cache.tree.crashsafe.dirs import remove_tree
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId
from autotune_cache.tree.layouts.own_names import (LOCKS_DIRNAME, OUR_PREFIX, PREVIEW_DIR_RE, STAGE_DIR_RE, TRASH_DIR_RE,
                                                   owner_locks_dir)
from autotune_cache.tree.crashsafe.locks import dead_owner, entry_lock
from autotune_cache.tree.records import CacheInfo, Finding
from autotune_cache.tree.refs import exact_ref
from autotune_cache.tree.crashsafe.swap import inode_of, swap_in, unlink_synced

JOURNAL_FORMAT = 1
#: What of ours names no owner to ask (a temp file: it may be an engine's save in flight, as
#: engines take no lock; a dry run's scratch killed before it took its owner lock) goes only
#: once this old.
STALE_TEMP_AGE_S = 3600.0
#: A dry run's owner lock file is made, then locked: a free one younger than this may be a dry
#: run starting (stalled between the two steps), not a dead one.
NEWBORN_LOCK_S = 60.0
#: A delete journal's ``kind`` (a transaction's has none).
DELETE_KIND = "delete"


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
        with dead_owner(base, tmp[len(OUR_PREFIX):].split("-", 1)[0], tidy=True) as dead:
            if dead:
                with contextlib.suppress(OSError):
                    os.unlink(jdir / tmp)
    done = []
    for name in names:
        token = name.split("-", 1)[0]
        with dead_owner(base, token, tidy=True) as dead:
            if not dead:
                continue
            path = jdir / name
            try:
                journal = json.loads(path.read_bytes())
                if isinstance(journal, dict) and journal.get("kind") == DELETE_KIND:
                    continue  # a writer's sweep finishes it (``sweep_leftovers``); a reader leaves the proof
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


def write_delete_journal(layout: CacheLayout, root: Path, owner: str, trashed: list[tuple[EntryId, Path]]) -> Path:
    """Record, durably, that ``owner`` deleted these entries (each now at its trash path)."""
    base = layout.base(root)
    jdir = ensure_tree_dirs(base, (layout.journal_dir(root).name,))
    journal = jdir / f"{owner}-{secrets.token_hex(4)}.json"
    rows = [{"id": list(eid.parts), "trash": str(trash.relative_to(base))} for eid, trash in trashed]
    atomic_write_bytes(journal, json.dumps({"format": JOURNAL_FORMAT, "kind": DELETE_KIND, "owner": owner,
                                            "deleted": rows}).encode())
    return journal


def deleted_by_dead(layout: CacheLayout, root: Path, journal: Path) -> tuple[EntryId, ...]:
    """The entries a delete journal says a dead owner deleted; () for a live owner's (its
    delete is still running: proof of nothing yet), a transaction's journal, or one unreadable.
    A question a plan asks (a dry run's too): it asks as a reader, tidying no lock file."""
    base = layout.base(root)
    with dead_owner(base, journal.name.split("-", 1)[0]) as dead:
        if not dead:
            return ()
        try:
            data = json.loads(journal.read_bytes())
            if not isinstance(data, dict) or data.get("kind") != DELETE_KIND:
                return ()
            return tuple(layout.make_id(tuple(row["id"])) for row in data["deleted"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return ()


def _finish_deletes(layout: CacheLayout, root: Path) -> int:
    """Remove the delete journals of dead owners, with the trash dirs they name (only names of
    ours, inside the tree: the rows come from a file anyone could have edited); how many."""
    base, jdir = layout.base(root), layout.journal_dir(root)
    try:
        names = sorted(n for n in os.listdir(jdir) if n.endswith(".json"))
    except OSError:
        return 0
    finished = 0
    for name in names:
        path = jdir / name
        with dead_owner(base, name.split("-", 1)[0], tidy=True) as dead:
            if not dead:
                continue
            try:
                journal = json.loads(path.read_bytes())
            except (OSError, ValueError, RecursionError):
                continue  # a transaction's half-written journal is ``recover_journals``'s
            if not isinstance(journal, dict) or journal.get("kind") != DELETE_KIND:
                continue
            rows = journal.get("deleted") if isinstance(journal.get("deleted"), list) else []
            for row in rows:
                rel = row.get("trash") if isinstance(row, dict) else None
                if not isinstance(rel, str) or ".." in Path(rel).parts or Path(rel).is_absolute():
                    continue
                trash = base / rel
                if TRASH_DIR_RE.match(trash.name) and os.path.lexists(trash):
                    remove_tree(trash)
            unlink_synced(path)
            finished += 1
    return finished


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
            with dead_owner(base, m["owner"], tidy=True) as dead:
                if dead:
                    remove_tree(parent / name)


def remove_leftover(base: Path, path: Path) -> tuple[bool, str | None]:
    """Remove a staging or trash dir found by a scan if its owner is gone: (removed, error)."""
    m = STAGE_DIR_RE.match(path.name) or TRASH_DIR_RE.match(path.name)
    if not m:
        return False, None
    with dead_owner(base, m["owner"], tidy=True) as dead:
        if not dead:
            return False, None
        err = remove_tree(path)
        return err is None, err


def sweep_leftovers(layout: CacheLayout, root: Path) -> int:
    """Finish the deletes of dead owners (their journals and trash), and remove every staging
    and trash dir in the tree whose owner is gone; how many things went. For the commands that
    write a tree (a reader never does: ``ls`` counts them instead). Those dirs lie beside
    entries, so only the levels above the entries are listed, never an entry's files."""
    base = layout.base(root)
    removed = _finish_deletes(layout, root)

    def walk(path: Path, depth: int) -> None:
        nonlocal removed
        try:
            with os.scandir(path) as it:
                children = [(c.name, c.is_dir(follow_symlinks=False)) for c in it]
        except OSError:
            return
        for name, is_dir in children:
            if not is_dir:
                continue
            if depth + 1 < len(layout.levels):
                if layout.levels[depth].valid(name):
                    walk(path / name, depth + 1)
            elif name.startswith(OUR_PREFIX) and (STAGE_DIR_RE.match(name) or TRASH_DIR_RE.match(name)):
                ok, _ = remove_leftover(base, path / name)
                removed += ok

    walk(base, 0)
    return removed


def sweep_dead_previews(temp_dir: str | Path | None = None) -> int:
    """Remove the scratch dirs that killed dry runs (``import``/``pull --dry-run``, ``txn``'s
    preview-only transaction) left in the temp dir; how many went. Asked by every dry run before
    it makes its own: nobody else would ever remove them. A scratch dir goes when its owner is
    provably gone (its owner lock, taken read-only, is free, and older than ``NEWBORN_LOCK_S``),
    or, with no lock file in it (killed before it took its lock), once ``STALE_TEMP_AGE_S`` old.
    Only this user's directories named and made as ``mkdtemp`` makes them, never through a link."""
    top = Path(temp_dir if temp_dir is not None else tempfile.gettempdir())
    try:
        with os.scandir(top) as it:
            found = [c for c in it if PREVIEW_DIR_RE.match(c.name)]
    except OSError:
        return 0
    removed, now = 0, time.time()
    for c in found:
        try:
            st = c.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat_mod.S_ISDIR(st.st_mode):
            continue  # a link or a file of that name: none of ours
        if st.st_uid != os.getuid():
            continue  # another user's dry run, alive or not: theirs to remove
        if stat_mod.S_IMODE(st.st_mode) != 0o700:
            continue  # not as mkdtemp made it: somebody's own directory of that name
        removed += _remove_if_dead(Path(c.path), now - st.st_mtime, now)
    return removed


def _remove_if_dead(scratch: Path, age: float, now: float) -> bool:
    locks = _owner_locks_in(scratch)
    if not locks and age < STALE_TEMP_AGE_S:
        return False  # made a moment ago by a dry run that has not taken its lock yet
    with contextlib.ExitStack() as held:
        for path in locks:
            try:
                if now - path.lstat().st_mtime < NEWBORN_LOCK_S:
                    return False  # its dry run may be about to lock it
            except OSError:
                pass  # gone since the listing: its owner released it
            if held.enter_context(peek_lock(path)) is not True:
                return False  # its owner runs (or it cannot tell)
        return remove_tree(scratch) is None


def _owner_locks_in(scratch: Path) -> list[Path]:
    """The owner lock files in a scratch dir: ``<base>/.fi-autotune-locks/owners/*.lock``, the
    base 1 or 2 levels down (its layout's ``base_parts``, not known here); links not followed."""
    locks, level = [], [scratch]
    for _ in range(3):
        below = []
        for d in level:
            try:
                with os.scandir(d) as it:
                    subdirs = [Path(c.path) for c in it if c.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for s in subdirs:
                if s.name != LOCKS_DIRNAME:
                    below.append(s)
                    continue
                owners = owner_locks_dir(d)
                try:
                    names = os.listdir(owners)
                except OSError:
                    continue
                locks += [owners / n for n in sorted(names) if n.endswith(".lock")]
        level = below
    return locks


def in_flight(info: CacheInfo, ref: str) -> tuple[EntryId, Finding] | None:
    """The entry ``ref`` names if a killed ``rm`` or ``prune`` was deleting it: a trash dir of
    that entry, or a delete journal naming it, whose owner is gone (only then - a live
    deleter's trash, or an id that is simply not there, is no proof of anything). A trash dir's
    id is its place plus the name in it. Asked by ``rm --dry-run`` too: it tidies no lock file."""
    text = exact_ref(ref).rstrip("/")
    base = info.layout.base(info.root)
    present = {e.id for e in info.entries}

    def named(eid: EntryId) -> bool:
        return text in (str(eid), eid.path_str, eid.name) and eid not in present

    for f in info.findings:
        if f.kind == "journal":
            hit = next((eid for eid in deleted_by_dead(info.layout, info.root, f.path) if named(eid)), None)
            if hit is not None:
                return hit, f
        elif f.kind == "trash" and (m := TRASH_DIR_RE.match(f.path.name)):
            try:
                eid = info.layout.make_id(f.path.parent.relative_to(base).parts + (m["name"],))
            except ValueError:
                continue
            if not named(eid):
                continue
            with dead_owner(base, m["owner"]) as dead:
                if dead:
                    return eid, f
    return None
