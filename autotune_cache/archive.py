"""Moving entries between machines as ``.tar.gz`` (tune on a GPU builder, copy into an image).

Import treats the archive as hostile: every member is checked (layout name, no absolute path,
no ``..``, regular files only, size caps, JSON that is a FlashInfer cache or our manifest,
manifest key consistent with its directory) before anything is written, then each entry is
committed whole under its lock through the same writer as ``warm``.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from . import layout
from .atomic import atomic_write_bytes, key_lock
from .errors import EntryLocked, FiAutotuneError
from .keys import SCHEMAS
from .layout import RankName
from .manifest import Manifest
from .rankfile import MAX_RANK_FILE_BYTES, parse_cache_bytes, read_regular_file
from .scan import CacheEntry, EntryStatus, scan_entry
from .writer import EntryId, commit_entry

MAX_MEMBERS = 100_000
MAX_TOTAL_BYTES = 1 << 30

_MEMBER_RE = re.compile(
    r"^flashinfer/autotune/(?P<version>[^/]+)/(?P<arch>[^/]+)/(?P<key>[^/]+)/(?P<name>[^/]+)$"
)


def _arcname(entry: CacheEntry, name: str) -> str:
    return f"flashinfer/autotune/{entry.flashinfer_version}/{entry.arch}/{entry.key}/{name}"


def export_entries(root: Path, entries: list[CacheEntry], out: Path) -> list[str]:
    """Write rank files and manifests of ``entries`` to ``out``; returns the member names.

    Each entry is read under its lock so a concurrent warm cannot hand us half of a retune.
    """
    buf = io.BytesIO()
    members = []
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            with key_lock(root, e.flashinfer_version, e.arch, e.key, timeout=60):
                names = sorted(rf.name for rf in e.rank_files if rf.ok)
                if e.manifest is not None:
                    names.append(layout.MANIFEST_NAME)
                for name in names:
                    data = read_regular_file(e.path / name)
                    info = tarfile.TarInfo(_arcname(e, name))
                    info.size = len(data)
                    info.mtime = int(time.time())
                    info.mode = 0o644
                    tar.addfile(info, io.BytesIO(data))
                    members.append(info.name)
    atomic_write_bytes(Path(out), buf.getvalue())
    return members


@dataclass(frozen=True)
class ArchiveEntry:
    id: EntryId
    rank_files: dict[str, bytes]
    manifest: Manifest | None


def _check_name(name: str) -> re.Match:
    if name.startswith("/") or "\\" in name or "\x00" in name:
        raise FiAutotuneError(f"archive member {name!r}: absolute or malformed path")
    parts = PurePosixPath(name).parts
    if ".." in parts or "." in parts:
        raise FiAutotuneError(f"archive member {name!r}: path traversal")
    m = _MEMBER_RE.match(name)
    if not m:
        raise FiAutotuneError(f"archive member {name!r}: not in the cache layout")
    if not layout.is_valid_version(m["version"]) or not layout.ARCH_RE.match(m["arch"]) or not layout.KEY_RE.match(m["key"]):
        raise FiAutotuneError(f"archive member {name!r}: not in the cache layout")
    if not (RankName.parse(m["name"]) or m["name"] == layout.MANIFEST_NAME):
        raise FiAutotuneError(f"archive member {name!r}: not a rank file or manifest")
    return m


def read_archive(path: Path) -> list[ArchiveEntry]:
    """Validate the whole archive into memory; raise on the first bad member."""
    try:
        tar = tarfile.open(path, mode="r:*")
    except (OSError, tarfile.TarError) as e:
        raise FiAutotuneError(f"cannot read {path}: {e}") from None
    grouped: dict[EntryId, dict[str, bytes]] = {}
    total = 0
    count = 0
    with tar:
        try:
            for member in tar:
                count += 1
                if count > MAX_MEMBERS:
                    raise FiAutotuneError(f"archive has more than {MAX_MEMBERS} members")
                name = member.name[2:] if member.name.startswith("./") else member.name
                if member.isdir():
                    if name.startswith("/") or ".." in PurePosixPath(name).parts:
                        raise FiAutotuneError(f"archive member {member.name!r}: path traversal")
                    continue
                if not member.isreg():
                    kind = "link" if (member.issym() or member.islnk()) else "special file"
                    raise FiAutotuneError(f"archive member {member.name!r}: {kind}, only regular files are allowed")
                m = _check_name(name)
                if member.size > MAX_RANK_FILE_BYTES:
                    raise FiAutotuneError(f"archive member {name!r}: {member.size} bytes, over the {MAX_RANK_FILE_BYTES} limit")
                total += member.size
                if total > MAX_TOTAL_BYTES:
                    raise FiAutotuneError(f"archive contents exceed {MAX_TOTAL_BYTES} bytes")
                f = tar.extractfile(member)
                data = f.read(member.size + 1) if f else b""
                if len(data) != member.size:
                    raise FiAutotuneError(f"archive member {name!r}: truncated")
                eid = EntryId(m["version"], m["arch"], m["key"])
                files = grouped.setdefault(eid, {})
                if m["name"] in files:
                    raise FiAutotuneError(f"archive member {name!r} appears twice")
                files[m["name"]] = data
        except (tarfile.TarError, EOFError, OSError, ValueError) as e:
            if isinstance(e, FiAutotuneError):
                raise
            raise FiAutotuneError(f"cannot read {path}: {e}") from None

    entries = []
    for eid, files in sorted(grouped.items(), key=lambda kv: str(kv[0])):
        manifest = None
        mdata = files.pop(layout.MANIFEST_NAME, None)
        if mdata is not None:
            try:
                manifest = Manifest.from_bytes(mdata)
            except ValueError as e:
                raise FiAutotuneError(f"{eid}: {e}") from None
            if (manifest.flashinfer_version, manifest.arch, manifest.key) != (eid.flashinfer_version, eid.arch, eid.key):
                raise FiAutotuneError(f"{eid}: manifest describes another entry")
            schema = SCHEMAS.get(manifest.schema)
            if schema is not None and schema.key(manifest.key_fields) != eid.key:
                raise FiAutotuneError(f"{eid}: key does not match the manifest's key fields")
        for name, data in files.items():
            try:
                parse_cache_bytes(data)
            except (ValueError, RecursionError) as e:
                raise FiAutotuneError(f"{eid}/{name}: not a FlashInfer cache file ({str(e)[:80]})") from None
        if not files:
            raise FiAutotuneError(f"{eid}: no rank files")
        entries.append(ArchiveEntry(eid, files, manifest))
    if not entries:
        raise FiAutotuneError(f"{path}: no cache entries in the archive")
    return entries


@dataclass(frozen=True)
class ImportResult:
    imported: tuple[str, ...]
    unchanged: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]

    def to_dict(self) -> dict:
        return {
            "imported": list(self.imported),
            "unchanged": list(self.unchanged),
            "refused": [{"entry": e, "reason": r} for e, r in self.refused],
        }


def _conflict(root: Path, a: ArchiveEntry, force: bool) -> str | None:
    """None to write; 'same' when identical; else why we refuse."""
    path = layout.key_dir(root, a.id.flashinfer_version, a.id.arch, a.id.key)
    if not os.path.lexists(path):
        return None
    if not path.is_dir() or path.is_symlink():
        return "the key dir path exists and is not a directory"
    existing = scan_entry(path, a.id.flashinfer_version, a.id.arch)
    ours = {n: hashlib.sha256(d).hexdigest() for n, d in a.rank_files.items()}
    theirs = {rf.name: rf.sha256 for rf in existing.rank_files}
    if ours == theirs:
        return "same"
    if existing.status == EntryStatus.COMPLETE and not force:
        return "a different complete entry is already there (use --force to replace it)"
    return None


def import_archive(root: Path, archive: Path, *, force: bool = False) -> ImportResult:
    entries = read_archive(archive)
    refusals = [(str(a.id), why) for a in entries if (why := _conflict(root, a, force)) not in (None, "same")]
    if refusals:
        # All or nothing: refuse before writing any entry.
        return ImportResult((), (), tuple(refusals))
    imported, unchanged, refused = [], [], []
    for a in entries:
        try:
            with key_lock(root, a.id.flashinfer_version, a.id.arch, a.id.key, timeout=120):
                why = _conflict(root, a, force)  # again, under the lock
                if why == "same":
                    unchanged.append(str(a.id))
                    continue
                if why is not None:
                    refused.append((str(a.id), why))
                    continue
                commit_entry(root, a.id, a.rank_files, a.manifest, locked=True)
                imported.append(str(a.id))
        except EntryLocked as e:
            refused.append((str(a.id), str(e)))
    return ImportResult(tuple(imported), tuple(unchanged), tuple(refused))
