"""A stat-validated index of rank-file digests, for entries no manifest vouches for.

Engine-written entries have no fi-autotune manifest, so without help ``ls`` reads and hashes
every rank file every time (80,000 files for a 10,000-entry tree). This index remembers, per
file, what reading it gave (sha256, config count, ``_metadata``), keyed by everything ``stat``
says about the file: device, inode, size, mtime and ctime. Any write to the file - even one that
puts its mtime back - changes its ctime, so a record can only ever describe the bytes it was
made from; a file whose stat differs is read again.

It lives outside the tree, in ``platformdirs.user_cache_dir("fi-autotune")/digests/`` (so a
read-only tree is indexed too), one file per tree root, rewritten only when something new was
read. Keys and values are fixed-size bytes so that loading 80,000 records takes milliseconds.
``FI_AUTOTUNE_NO_INDEX=1`` turns it off (benchmarks of the cold path).
"""

from __future__ import annotations

import hashlib
import marshal
import os
import struct
import time
from pathlib import Path

from autotune_cache.registry import default_layout
from autotune_cache.tree.atomic import atomic_write_bytes

FORMAT = 2
#: Beyond this many records (about 32 MB of index) nothing more is learned.
MAX_RECORDS = 400_000

_KEY = struct.Struct("<QQqqq")  # dev, ino, size, mtime_ns, ctime_ns
_VALUE = struct.Struct("<32sII")  # sha256, configs, metadata id


def stat_key(st: os.stat_result) -> bytes:
    return _KEY.pack(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class DigestIndex:
    """Records (sha256, configs, metadata) by ``stat_key``; learns in memory, saves on demand."""

    def __init__(self, path: Path | None = None, files: dict | None = None, metas: list | None = None,
                 root: str = ""):
        self.path = path
        self.root = root
        self.files: dict[bytes, bytes] = files or {}
        self.metas: list[dict] = metas or []
        self._meta_ids: dict[tuple, int] = {}
        for i, m in enumerate(self.metas):
            self._meta_ids.setdefault(tuple(sorted(m.items())), i)
        self.used: set[bytes] = set()
        self.learned: dict[bytes, bytes] = {}

    # reading -----------------------------------------------------------------------------------
    def get(self, st: os.stat_result) -> tuple[str, int, dict] | None:
        key = stat_key(st)
        rec = self.files.get(key) or self.learned.get(key)
        if rec is None:
            return None
        self.used.add(key)
        sha, configs, meta_id = _VALUE.unpack(rec)
        if meta_id >= len(self.metas):
            return None
        return sha.hex(), configs, self.metas[meta_id]

    def learn(self, st: os.stat_result, sha256: str, configs: int, metadata: dict) -> None:
        self._learn(stat_key(st), sha256, configs, metadata)

    def _learn(self, key: bytes, sha256: str, configs: int, metadata: dict) -> None:
        if len(self.files) + len(self.learned) >= MAX_RECORDS or not 0 <= configs < 2**32:
            return
        try:
            ident = tuple(sorted(metadata.items()))
            hash(ident)
        except TypeError:
            return  # metadata with nested values: not worth indexing
        meta_id = self._meta_ids.get(ident)
        if meta_id is None:
            meta_id = self._meta_ids[ident] = len(self.metas)
            self.metas.append(dict(metadata))
        self.learned[key] = _VALUE.pack(bytes.fromhex(sha256), configs, meta_id)

    # across forked scanners ---------------------------------------------------------------------
    def start_delta(self) -> None:
        """In a forked child: report only what this child reads from here on (a child of a later
        batch would otherwise send back everything the parent had already merged)."""
        self.used = set()
        self.learned = {}

    def delta(self) -> tuple:
        """What this process learned and used, for the parent (metadata by value: ids differ)."""
        learned = {}
        for k, v in self.learned.items():
            sha, n, m = _VALUE.unpack(v)
            learned[k] = (sha.hex(), n, self.metas[m])
        return self.used, learned

    def merge(self, delta: tuple) -> None:
        used, learned = delta
        self.used |= used
        for k, (sha, n, meta) in learned.items():
            self._learn(k, sha, n, meta)

    # persistence -------------------------------------------------------------------------------
    @classmethod
    def for_root(cls, root: Path, layout: str | None = None) -> "DigestIndex":
        """The index of one layout's tree at ``root`` (empty when disabled, absent or unreadable).
        One file per (layout, root): two engines may share a root, and each scan keeps only the
        records it used, so a shared file would drop the other layout's records every time.
        ``layout``: its name, None for the default layout (whose file keeps the name it always had)."""
        if os.environ.get("FI_AUTOTUNE_NO_INDEX") == "1":
            return cls(None)
        from platformdirs import user_cache_dir

        real = os.path.realpath(root)
        ident = real if layout in (None, default_layout().name) else f"{layout}:{real}"
        name = hashlib.sha256(ident.encode()).hexdigest()[:16] + ".marshal"
        path = Path(user_cache_dir("fi-autotune")) / "digests" / name
        try:
            with open(path, "rb") as f:
                data = marshal.load(f)
            if not (type(data) is dict and data.get("format") == FORMAT and data.get("root") == real
                    and type(data.get("files")) is dict and type(data.get("metas")) is list):
                raise ValueError("another format")
            return cls(path, data["files"], data["metas"], real)
        except (OSError, ValueError, EOFError, TypeError):
            return cls(path, root=real)

    def save(self) -> None:
        """Keep what this scan saw: records used or learned (deleted files drop out). Written
        only when something new was read or much is stale; silent where it cannot be written."""
        if self.path is None:
            return
        stale = len(self.files) - len(self.used & self.files.keys())
        if not self.learned and stale <= len(self.files) // 10:
            return
        files = {k: self.files[k] for k in self.used if k in self.files}
        files.update(self.learned)
        data = {"format": FORMAT, "root": self.root, "files": files, "metas": self.metas}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.path, marshal.dumps(data))
            _forget_idle(self.path.parent)
        except OSError:
            pass


#: An index not rewritten for this long belongs to a tree nobody lists any more (or a deleted one).
IDLE_S = 30 * 86400


def _forget_idle(directory: Path) -> None:
    now = time.time()
    for p in directory.glob("*.marshal"):
        try:
            if now - p.stat().st_mtime > IDLE_S:
                p.unlink()
        except OSError:
            pass
