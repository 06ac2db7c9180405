"""Committing one entry (rank files + manifest): the write path of ``warm`` and ``convert``.

A one-entry ``txn.Transaction``: staged beside its target, swapped in with one rename under the
entry's lock. ``check`` (called under the lock) may refuse or report "same".
"""

from __future__ import annotations

from pathlib import Path

import os

from autotune_cache.errors import FiAutotuneError, os_error_message
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId
from autotune_cache.tree.manifest import Manifest
from autotune_cache.tree.scanner.scan import scan_entry
from autotune_cache.tree.crashsafe.txn import Check, CommitResult, StagedEntry, Transaction


def other_gpu_refusal(existing_gpu: str | None, incoming_gpu: str | None, arch: str | None) -> str | None:
    """Why a cache tuned on one GPU model must not silently replace one tuned on another.

    H100 and H200 are both sm90, so their caches for one deployment share one path; FlashInfer
    rejects a file whose ``gpu`` differs from the device it runs on, so replacing one with the
    other makes every engine on the first GPU model re-tune at each boot.
    """
    if existing_gpu and incoming_gpu and existing_gpu != incoming_gpu:
        return (f"holds a cache tuned on {existing_gpu}, not {incoming_gpu}: both are {arch or 'one arch'} and share "
                f"one path, and FlashInfer on either GPU rejects the other's file (use --force to replace it)")
    return None


def replace_policy(layout: CacheLayout, root: Path, force: bool) -> Check:
    """What ``import`` and ``warm`` may overwrite, decided under the entry's lock:

    * identical rank files: ``"same"`` (nothing to do);
    * an entry tuned on another GPU model: refused without ``--force`` (``other_gpu_refusal``);
    * a different complete entry: refused without ``--force``;
    * anything else (absent, incomplete, corrupt, stale): replaced.
    """
    def check(staged: StagedEntry, target: Path) -> str | None:
        if not os.path.lexists(target):
            return None
        existing = scan_entry(layout, target, staged.eid)
        if {rf.name: rf.sha256 for rf in existing.rank_files} == staged.digests:
            return "same"
        if force:
            return None
        why = other_gpu_refusal(existing.gpu, (staged.metadata or {}).get("gpu"), existing.arch)
        if why:
            return why
        if existing.complete_for(list(staged.digests)):
            return "a different complete entry is already there (use --force to replace it)"
        return None

    return check


def commit_entry(
    layout: CacheLayout,
    root: Path,
    eid: EntryId,
    rank_files: dict[str, bytes],
    manifest: Manifest | None,
    *,
    check: Check | None = None,
    lock_timeout: float = -1,
) -> CommitResult:
    """Make the entry dir hold exactly ``rank_files`` (+ manifest), or nothing changes."""
    if not rank_files:
        raise ValueError("an entry needs at least one data file")
    txn = Transaction(layout, root)
    try:
        for name, data in sorted(rank_files.items()):
            if layout.classify(name, False).value != "data":
                raise ValueError(f"not a data file name of the {layout.name} layout: {name!r}")
            txn.add_file(eid, name, data)
        txn.finish_entry(eid, manifest)
        return txn.commit(check, lock_timeout)
    except OSError as e:
        raise FiAutotuneError(f"cannot write {eid}: {os_error_message(e)}; nothing was written") from None
    finally:
        txn.discard()
