"""Committing a whole entry (rank files + manifest) to the tree: the one write path for every writer.

A new key dir is assembled in a hidden staging dir and renamed into place, so even SIGKILL
leaves either nothing or the complete entry. An existing key dir is updated file by file
(each atomic), rank files first and the manifest last, with SIGINT/SIGTERM held until the
commit is done, all under the key's lock.
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
from .atomic import fsync_dir, makedirs, atomic_write_bytes, deferred_signals, key_lock
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


def _publish_new(target: Path, rank_files: dict[str, bytes], manifest: Manifest | None) -> bool:
    parent = target.parent
    stage = parent / f".fi-autotune-stage-{target.name}-{secrets.token_hex(6)}"
    for attempt in range(20):
        makedirs(parent)
        try:
            stage.mkdir()
            break
        except FileNotFoundError:
            if attempt == 19:
                raise
    try:
        records = {name: _record(data, _write_plain(stage / name, data)) for name, data in rank_files.items()}
        if manifest is not None:
            _write_plain(stage / layout.MANIFEST_NAME, manifest.with_rank_records(records).to_bytes())
        fsync_dir(stage)
        try:
            os.rename(stage, target)
        except OSError:
            if os.path.lexists(target):
                return False
            raise
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
    fsync_dir(parent)
    return True


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
        if not os.path.lexists(target) and _publish_new(target, rank_files, manifest):
            return target
        _replace_in_place(target, rank_files, manifest)
    return target
