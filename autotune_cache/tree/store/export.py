"""``export``: entries as a reproducible ``.tar.gz`` bundle (tune on a GPU box, copy into an image).

The same entries always give the same bytes (members sorted, mtime/uid/gid/mode fixed, gzip
header without name or time), so a Docker layer that ``ADD``s it is reused as long as the cache
is unchanged. Entries are read without locks (a read-only tree exports too): each entry dir is
opened once and its files read through that handle, and the read is retried if the entry was
swapped meanwhile. ``archive.py`` reads such bundles back.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import io
import os
import re
import secrets
import stat as stat_mod
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from autotune_cache.autotuner.rankfile import read_regular_file
from autotune_cache.errors import UsageError
from autotune_cache.tree.crashsafe.faults import crashpoint
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import NameKind
from autotune_cache.tree.records import CacheEntry


def _snapshot(layout: CacheLayout, entry: CacheEntry, attempts: int = 5) -> dict[str, bytes] | None:
    """The entry's data files and manifest, read through one handle on its dir; None if it
    vanished. Retried while a writer swaps the entry in between (then we read the new one)."""
    for _ in range(attempts):
        try:
            dfd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        try:
            before = os.fstat(dfd).st_ino
            files: dict[str, bytes] = {}
            for name in sorted(os.listdir(dfd)):
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if not stat_mod.S_ISREG(st.st_mode):
                    continue
                kind = layout.classify(name, False)
                if kind is NameKind.DATA:
                    files[name] = read_regular_file(name, dir_fd=dfd)
                elif kind is NameKind.MANIFEST:
                    files[name] = read_regular_file(name, dir_fd=dfd)
            for sub in layout.data_dirs:
                files.update(_read_data_dir(layout, dfd, sub))
            try:
                still = os.lstat(entry.path).st_ino
            except FileNotFoundError:
                return None
            if still == before:
                return files
        except FileNotFoundError:
            continue  # a file vanished under us: the entry was replaced or deleted; look again
        finally:
            os.close(dfd)
    return None


def _source_date_epoch() -> int:
    try:
        return max(0, int(os.environ.get("SOURCE_DATE_EPOCH", "0")))
    except ValueError:
        return 0


@dataclass(frozen=True)
class ExportResult:
    entries: tuple[str, ...]
    members: tuple[str, ...]
    vanished: tuple[str, ...] = ()
    size: int = 0
    empty: tuple[str, ...] = ()  # held no data file when read: nothing to export (not "vanished")

    def to_dict(self) -> dict:
        return {"entries": list(self.entries), "members": list(self.members), "vanished": list(self.vanished),
                "size": self.size, "empty": list(self.empty)}


def _read_data_dir(layout: CacheLayout, dfd: int, sub: str) -> dict[str, bytes]:
    """The data files of one of an entry's ``data_dirs``, named ``<sub>/<name>`` (none if absent)."""
    try:
        sfd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    try:
        files = {}
        for name in sorted(os.listdir(sfd)):
            st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
            if stat_mod.S_ISREG(st.st_mode) and layout.classify(f"{sub}/{name}", False) is NameKind.DATA:
                files[f"{sub}/{name}"] = read_regular_file(name, dir_fd=sfd)
        return files
    finally:
        os.close(sfd)


def export_entries(layout: CacheLayout, entries: list[CacheEntry], out: BinaryIO) -> ExportResult:
    """Write a reproducible .tar.gz of ``entries`` to ``out``. Entries that vanished since they
    were listed (a concurrent prune) are skipped and reported, never an error."""
    mtime = _source_date_epoch()
    members: list[tuple[str, bytes]] = []
    exported, vanished, empty = [], [], []
    for e in sorted(entries, key=lambda e: e.id):
        files = _snapshot(layout, e)
        if files is None:
            vanished.append(str(e.id))
            continue
        if not any(layout.classify(n, False) is NameKind.DATA for n in files):
            empty.append(str(e.id))
            continue
        exported.append(str(e.id))
        members.extend((layout.member_name(e.id, name), data) for name, data in files.items())
    members.sort()
    with tempfile.SpooledTemporaryFile(max_size=64 << 20) as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=mtime, compresslevel=9) as gz:
            with tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    info.mtime = mtime
                    info.mode = 0o644
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    tar.addfile(info, io.BytesIO(data))
        size = raw.tell()
        raw.seek(0)
        while chunk := raw.read(1 << 20):
            out.write(chunk)
    return ExportResult(tuple(exported), tuple(n for n, _ in members), tuple(vanished), size, tuple(empty))


def export_to_file(layout: CacheLayout, entries: list[CacheEntry], path: Path) -> ExportResult:
    """``export_entries`` into ``path``, which appears whole or not at all: written under a
    temp name beside it, fsynced, renamed. The writer holds an ``flock`` on its temp file for as
    long as it writes, so a later export to the same name can tell a killed writer's temp (its
    lock free) from a running one's, and removes the dead ones first (``sweep_dead_temps``)."""
    sweep_dead_temps(path)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until the file is closed (or this process dies)
        with os.fdopen(fd, "wb", closefd=False) as f:
            result = export_entries(layout, entries, f)
            f.flush()
        os.fsync(fd)
        crashpoint("export.written")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    return result


def output_target(path: Path) -> tuple[Path, bool]:
    """Where ``export -o path`` puts the archive, and whether it streams there (True) instead of
    writing it atomically. As shell ``>`` does: an existing device, FIFO or socket is written
    through (a socket's open fails: it is left), never renamed over (as root that would destroy
    ``/dev/null``); a symlink is followed, so the archive lands at its target and the link stays
    (a dangling link's target is created, as ``>`` creates it: refusing it would guard nothing
    that following a live link does not open). A regular file, a directory or a new name is the
    path itself, written atomically."""
    for _ in range(_MAX_LINKS):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return path, False
        if not stat_mod.S_ISLNK(st.st_mode):
            return path, not (stat_mod.S_ISREG(st.st_mode) or stat_mod.S_ISDIR(st.st_mode))
        if not _may_follow(path, st):
            raise UsageError(f"{path} is another user's symlink in a shared sticky directory: not followed (as the "
                             "kernel's protected_symlinks would not follow it for `>`); give the file itself")
        path = path.parent / os.readlink(path)  # one link at a time: the kernel resolves the directories
    # a loop: ``open_stream`` refuses it (O_NOFOLLOW, ELOOP), one line
    return path, True


#: Links followed at most, as the kernel's ELOOP limit.
_MAX_LINKS = 40


def _may_follow(link: Path, st: os.stat_result) -> bool:
    """The kernel's ``fs.protected_symlinks`` rule, which a shell's ``>`` obeys and a link
    resolved here would bypass: in a sticky, world-writable directory (``/tmp``) only a link of
    this user or of the directory's owner is followed - else anyone could point ``/tmp/x.tgz`` at
    ``/etc/passwd`` for root's export to replace."""
    try:
        d = os.stat(link.parent)
    except OSError:
        return False
    shared = d.st_mode & stat_mod.S_ISVTX and d.st_mode & stat_mod.S_IWOTH
    return not shared or st.st_uid in (os.geteuid(), d.st_uid)


def open_stream(path: Path) -> int | None:
    """A descriptor writing through to ``path``, a device or FIFO ``output_target`` found there
    (a FIFO's open waits for its reader, as ``>`` does). It never creates, truncates or follows:
    None if a regular file has taken the name since it was looked at (it gets the atomic write)."""
    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC)
    if stat_mod.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def sweep_dead_temps(path: Path) -> int:
    """Remove the temp files of killed exports to ``path`` (``.<name>.<hex>.tmp`` whose flock
    can be taken: nobody is writing them); how many. A FIFO or a link by that name is left."""
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.[0-9a-f]{{8}}\.tmp\Z")
    removed = 0
    try:
        names = [n for n in os.listdir(path.parent) if pattern.match(n)]
    except OSError:
        return 0
    for name in names:
        try:
            fd = os.open(path.parent / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path.parent / name)
            removed += 1
        except OSError:
            continue  # locked: a running export's
        finally:
            os.close(fd)
    return removed
