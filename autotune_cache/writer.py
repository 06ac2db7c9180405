"""Committing a whole entry (rank files + manifest) to the tree: the one write path for every writer.

The whole entry is assembled in a hidden staging dir, then renamed into place (new key dir)
or swapped with the old one in one ``renameat2(RENAME_EXCHANGE)`` (existing key dir), so even
SIGKILL leaves either the previous entry or the complete new one. Where the swap is impossible
(no renameat2, or the key dir holds files that are not ours), files are replaced one by one,
each atomically, rank files first and the manifest last, with SIGINT/SIGTERM held until the
commit is done. All of it under the key's lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import stat as stat_mod
from dataclasses import dataclass
from pathlib import Path

from . import layout
from .atomic import atomic_write_bytes, deferred_signals, exchange_paths, fsync_dir, key_lock, makedirs
from .layout import RankName
from .manifest import Manifest, RankRecord
from .rankfile import validate_cache_obj


@dataclass(frozen=True)
class EntryId:
    flashinfer_version: str
    arch: str
    key: str

    def __str__(self) -> str:
        return f"{self.flashinfer_version}/{self.arch}/{self.key}"


def _record(data: bytes, st: os.stat_result) -> RankRecord:
    _, configs = validate_cache_obj(json.loads(data))
    return RankRecord(st.st_size, st.st_mtime_ns, hashlib.sha256(data).hexdigest(), configs)


def _write_plain(path: Path, data: bytes) -> os.stat_result:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return os.stat(path)


def _new_stage(target: Path) -> Path:
    parent = target.parent
    stage = parent / f".fi-autotune-stage-{target.name}-{secrets.token_hex(6)}"
    for attempt in range(20):
        makedirs(parent)
        try:
            stage.mkdir()
            return stage
        except FileNotFoundError:
            if attempt == 19:
                raise
    raise AssertionError("unreachable")


def _fill(stage: Path, rank_files: dict[str, bytes], manifest: Manifest | None) -> None:
    records = {name: _record(data, _write_plain(stage / name, data)) for name, data in rank_files.items()}
    if manifest is not None:
        _write_plain(stage / layout.MANIFEST_NAME, manifest.with_rank_records(records).to_bytes())
    fsync_dir(stage)


def _only_ours(target: Path) -> bool:
    """True if swapping the dir away would lose nothing but our own files."""
    for child in os.scandir(target):
        if not child.is_file(follow_symlinks=False):
            return False
        name = child.name
        if not (RankName.parse(name) or name == layout.MANIFEST_NAME or layout.TEMP_FILE_RE.match(name)):
            return False
    return True


def _publish(target: Path, rank_files: dict[str, bytes], manifest: Manifest | None) -> bool:
    """Put the whole entry in place in one step; False if only a file-by-file update can do it."""
    stage = _new_stage(target)
    try:
        _fill(stage, rank_files, manifest)
        if not os.path.lexists(target):
            try:
                os.rename(stage, target)
                fsync_dir(target.parent)
                return True
            except OSError:
                if not os.path.lexists(target):
                    raise
        if target.is_dir() and not target.is_symlink() and _only_ours(target) and exchange_paths(stage, target):
            fsync_dir(target.parent)
            return True  # ``stage`` now holds the previous entry, removed below
        return False
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _replace_in_place(target: Path, rank_files: dict[str, bytes], manifest: Manifest | None) -> None:
    records = {}
    for name, data in rank_files.items():
        atomic_write_bytes(target / name, data)
        records[name] = _record(data, os.stat(target / name))
    # Files of the old entry that the new one does not have would mix two tunings.
    for child in os.scandir(target):
        if RankName.parse(child.name) and child.name not in rank_files and child.is_file(follow_symlinks=False):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(child.path)
    mpath = target / layout.MANIFEST_NAME
    if manifest is not None:
        atomic_write_bytes(mpath, manifest.with_rank_records(records).to_bytes())
    elif os.path.lexists(mpath) and stat_mod.S_ISREG(os.lstat(mpath).st_mode):
        os.unlink(mpath)  # it described the entry we just replaced


def commit_entry(
    root: Path,
    entry: EntryId,
    rank_files: dict[str, bytes],
    manifest: Manifest | None,
    *,
    lock_timeout: float = -1,
    locked: bool = False,
) -> Path:
    """Make the key dir hold exactly ``rank_files`` (+ manifest). Returns the key dir.

    ``locked=True`` when the caller already holds the key lock (to check-then-write atomically).
    """
    for name in rank_files:
        if not RankName.parse(name):
            raise ValueError(f"not a rank file name: {name!r}")
    target = layout.key_dir(root, entry.flashinfer_version, entry.arch, entry.key)
    lock = (
        contextlib.nullcontext()
        if locked
        else key_lock(root, entry.flashinfer_version, entry.arch, entry.key, timeout=lock_timeout)
    )
    with lock, deferred_signals():
        if _publish(target, rank_files, manifest):
            return target
        _replace_in_place(target, rank_files, manifest)
    return target
