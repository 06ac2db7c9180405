"""A stat-validated index of rank-file digests, for entries no manifest vouches for.

Engine-written entries have no fi-autotune manifest, so without help ``ls`` reads and hashes
every rank file every time (800,000 files for a 100,000-entry tree). This index remembers, per
entry, what reading its files gave (per file: sha256, config count, ``_metadata``), keyed by
everything ``stat`` says about each of them: name, device, inode, size, mtime and ctime (a 128-bit
BLAKE2b of them all, ``stats_digest``: an entry one of whose files' stat differs is read again, whole).
It sees what ``stat`` sees: any ``write``, ``truncate`` or rename changes a file's ctime, even one
that puts its mtime back. It cannot see a write through a shared memory map, which changes the
bytes without updating ctime or mtime (Linux updates them at most at the first write to a clean
page; on tmpfs never): the record keeps the sha256 of the bytes it was made from until
``FI_AUTOTUNE_NO_INDEX=1`` reads every file again (docs/cache-layout.md).

It lives outside the tree, in ``platformdirs.user_cache_dir("fi-autotune")/digests/`` (so a
read-only tree is indexed too), one file per (layout, tree root). The file is a sorted array of
fixed-size records read with ``pread`` through a 65,536-slot fan-out table (as git's pack
index), never loaded whole: memory stays flat however large the tree (the fan-out table, 256 KB,
and one bit per record for "used by this scan"), one lookup per entry costs one small read.

Safety of the file itself: it is written to a temp file and renamed over (two ``ls`` saving at
once: the last rename wins, both files whole); a CRC-32 of everything after the header is checked
when it is opened, so a truncated, torn or corrupt file (a crash before the data reached the disk,
a stray write) is ignored and rebuilt, never trusted; so is anything ``fstat`` says is not a regular
file (opened without blocking, ``safeopen``: a FIFO would block ``open``). A reader keeps its file.

Rewritten only when something new was read or much of it is stale, by streaming the old records
this scan used together with the new ones. ``FI_AUTOTUNE_NO_INDEX=1`` turns it off (cold path).
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import secrets
import struct
import sys
import time
import zlib
from array import array
from pathlib import Path

from autotune_cache.registry import default_layout
from autotune_cache.safeopen import FileRefused, open_checked_fd
from autotune_cache.tree.layouts.own_names import OUR_PREFIX

FORMAT = 3
MAGIC = b"FIDIGX\x00\x03"
SUFFIX = ".idx"

_KEY = struct.Struct("<QQqqq")  # dev, ino, size, mtime_ns, ctime_ns
#: key (16), slot (which file of the entry; ALL: every one), sha256, configs, metadata id.
#: Big-endian slot: records sort by (key, slot) as plain bytes.
_REC = struct.Struct(">16sI32sII")
REC = _REC.size
_HEAD = struct.Struct("<8sQIII4x")  # magic, records, root bytes, metas bytes, crc32 of the rest
HEAD = _HEAD.size
FAN = 65536
FAN_BYTES = 4 * FAN
ALL = 0xFFFFFFFF
KEY_BYTES = 16
#: Records per read when the old file is streamed into the new one (or checksummed).
CHUNK = 4096


def stat_key(st: os.stat_result) -> bytes:
    return _KEY.pack(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


#: ``stat_key`` of n files at once, by n (one ``pack`` per entry, not one per file: ``ls`` keys every entry).
_KEYS: dict[int, struct.Struct] = {}


def stats_digest(files) -> bytes:
    """The index's key: a digest of ``files``, (name, stat) in the entry's order - their count,
    names and ``stat_key``s (fixed-size fields after a count: unambiguous)."""
    n = len(files)
    keys = _KEYS.get(n) or struct.Struct("<" + "QQqqq" * n)
    if n <= 64:  # at most 64 formats kept (an entry holds at most MAX_RANK_FILES data files)
        _KEYS[n] = keys
    fields: list[int] = []
    for _, st in files:
        fields += (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    names = "\0".join([name for name, _ in files]).encode("utf-8", "surrogateescape")
    return hashlib.blake2b(b"".join([n.to_bytes(4, "little"), names, b"\0", keys.pack(*fields)]), digest_size=KEY_BYTES).digest()


class DigestIndex:
    """Per-entry records (sha256, configs, metadata of each file) by ``stats_digest``; learns in
    memory, saves on demand."""

    def __init__(self, path: Path | None = None, root: str = ""):
        self.path = path
        self.root = root
        self.fd: int | None = None
        self.n = 0  # records in the file opened
        self.fan: array | None = None
        self.metas: list[dict] = []
        self._meta_ids: dict[tuple, int] = {}
        self.used = bytearray()  # one bit per record of the file opened
        self.learned: dict[bytes, tuple] = {}  # key -> ((sha hex, configs, meta dict), ...)

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:  # an empty index is still one (``if digests`` must not drop it)
        return True

    def _set_metas(self, metas: list) -> None:
        self.metas = metas
        for i, m in enumerate(metas):
            with contextlib.suppress(TypeError):
                self._meta_ids.setdefault(tuple(sorted(m.items())), i)

    # reading -----------------------------------------------------------------------------------
    def get_entry(self, key: bytes, count: int) -> tuple | None:
        """What the files of the entry whose ``stats_digest`` is ``key`` hold, one (sha256, configs,
        metadata) per file (``count`` of them), or None when unknown."""
        known = self.learned.get(key)
        if known is not None:
            return known if len(known) == count else None
        if self.fd is None:
            return None
        fan = self.fan
        p = key[0] << 8 | key[1]
        lo = fan[p - 1] if p else 0
        hi = fan[p]
        if not lo < hi <= self.n:
            return None
        try:
            buf = os.pread(self.fd, (hi - lo) * REC, HEAD + lo * REC)
        except OSError:
            return None
        if len(buf) != (hi - lo) * REC:  # cut short under us (never by our writers: they rename)
            return None
        pos = buf.find(key)
        while pos >= 0 and pos % REC:
            pos = buf.find(key, pos + 1)
        if pos < 0:
            return None
        first = pos // REC
        metas = self.metas
        out = []
        i = first
        while i < hi - lo and buf[i * REC:i * REC + KEY_BYTES] == key:
            _, slot, sha, configs, meta_id = _REC.unpack_from(buf, i * REC)
            if meta_id >= len(metas):
                return None
            value = (sha.hex(), configs, metas[meta_id])
            if slot == ALL:
                if out:
                    return None
                out = [value] * count
                i += 1
                break
            if slot != len(out):
                return None
            out.append(value)
            i += 1
        if len(out) != count:
            return None
        used = self.used
        for r in range(lo + first, lo + i):
            used[r >> 3] |= 1 << (r & 7)
        return tuple(out)

    def learn_entry(self, key: bytes, values: list) -> None:
        """Remember what the entry's files hold: (sha256 hex, configs, metadata) each, in order."""
        out = []
        for sha, configs, metadata in values:
            if not (isinstance(sha, str) and len(sha) == 64 and 0 <= configs < 2**32):
                return
            try:
                ident = tuple(sorted(metadata.items()))
                hash(ident)
            except (TypeError, AttributeError):
                return  # metadata with nested values: not worth indexing
            meta_id = self._meta_ids.get(ident)
            if meta_id is None:
                meta_id = self._meta_ids[ident] = len(self.metas)
                self.metas.append(dict(metadata))
            out.append((sha, configs, self.metas[meta_id]))
        if out:
            self.learned[key] = tuple(out)

    # across forked scanners ---------------------------------------------------------------------
    def start_delta(self) -> None:
        """In a forked child: report only what this child reads from here on (a child of a later
        batch would otherwise send back everything the parent had already merged)."""
        self.used = bytearray(len(self.used))
        self.learned = {}

    def delta(self) -> tuple:
        """What this process learned and used, for the parent (metadata by value: ids differ)."""
        return bytes(self.used), self.learned

    def merge(self, delta: tuple) -> None:
        used, learned = delta
        if len(used) == len(self.used) and any(used):
            self.used = bytearray((int.from_bytes(self.used, "little") | int.from_bytes(used, "little"))
                                  .to_bytes(len(used), "little"))
        for key, values in learned.items():
            self.learn_entry(key, list(values))

    # persistence -------------------------------------------------------------------------------
    @staticmethod
    def path_for(root: Path, layout: str | None = None) -> tuple[Path, str]:
        from platformdirs import user_cache_dir

        real = os.path.realpath(root)
        ident = real if layout in (None, default_layout().name) else f"{layout}:{real}"
        name = hashlib.sha256(ident.encode()).hexdigest()[:16] + SUFFIX
        return Path(user_cache_dir("fi-autotune")) / "digests" / name, real

    @classmethod
    def for_root(cls, root: Path, layout: str | None = None) -> "DigestIndex":
        """The index of one layout's tree at ``root`` (empty when disabled, absent or unreadable).
        One file per (layout, root): two engines may share a root, and each scan keeps only the
        records it used, so a shared file would drop the other layout's records every time.
        ``layout``: its name, None for the default layout."""
        if os.environ.get("FI_AUTOTUNE_NO_INDEX") == "1":
            return cls(None)
        path, real = cls.path_for(root, layout)
        index = cls(path, real)
        try:
            fd = open_checked_fd(path, None, what="digest index", nofollow=True)
        except (OSError, FileRefused):
            return index
        try:
            index._open(fd)
        except (OSError, ValueError, EOFError, TypeError, struct.error):
            os.close(fd)
            index = cls(path, real)  # corrupt, truncated, another format or another root: rebuilt
        return index

    def _open(self, fd: int) -> None:
        head = os.pread(fd, HEAD, 0)
        magic, n, root_len, meta_len, crc = _HEAD.unpack(head)
        if magic != MAGIC:
            raise ValueError("another format")
        size = HEAD + n * REC + FAN_BYTES + root_len + meta_len
        if os.fstat(fd).st_size != size:
            raise ValueError("truncated")
        got, off, step = 0, HEAD, CHUNK * REC
        while off < size:
            chunk = os.pread(fd, min(step, size - off), off)
            if not chunk:
                raise ValueError("truncated")
            got = zlib.crc32(chunk, got)
            off += len(chunk)
        if got != crc:
            raise ValueError("checksum")
        tail = os.pread(fd, FAN_BYTES + root_len + meta_len, HEAD + n * REC)
        fan = array("I")
        fan.frombytes(tail[:FAN_BYTES])
        if sys.byteorder != "little":
            fan.byteswap()
        if fan[-1] != n:
            raise ValueError("fan-out")
        if tail[FAN_BYTES:FAN_BYTES + root_len].decode("utf-8", "surrogateescape") != self.root:
            raise ValueError("another root")
        metas = marshal.loads(tail[FAN_BYTES + root_len:])
        if type(metas) is not list or any(type(m) is not dict for m in metas):
            raise ValueError("metadata")
        self._set_metas(metas)
        self.fd, self.n, self.fan = fd, n, fan
        self.used = bytearray((n + 7) // 8)

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None

    def _stale(self) -> int:
        return self.n - int.from_bytes(self.used, "little").bit_count() if self.n else 0

    def save(self) -> None:
        """Keep what this scan saw: records used or learned (deleted files drop out). Written
        only when something new was read or much is stale; silent where it cannot be written."""
        if self.path is None:
            return
        if not self.learned and self._stale() <= self.n // 10:
            self.close()
            return
        tmp = self.path.parent / f"{OUR_PREFIX}{self.path.name}.{secrets.token_hex(6)}.tmp"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            try:
                self._write(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            with contextlib.suppress(OSError):  # the index of the format before this one
                os.unlink(self.path.with_suffix(".marshal"))
            _forget_idle(self.path.parent)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        finally:
            self.close()

    def _records(self):
        """Every record to keep, sorted: the used ones of the file opened merged with the learned,
        one per (key, slot)."""
        new = []
        for key, values in self.learned.items():
            meta_ids = [self._meta_ids[tuple(sorted(m.items()))] for _, _, m in values]
            if all(v == values[0] for v in values):
                sha, configs, _ = values[0]
                new.append(_REC.pack(key, ALL, bytes.fromhex(sha), configs, meta_ids[0]))
            else:
                new += [_REC.pack(key, slot, bytes.fromhex(sha), configs, meta_id)
                        for slot, ((sha, configs, _), meta_id) in enumerate(zip(values, meta_ids))]
        new.sort()
        new_it = iter(new)
        nxt = next(new_it, None)
        last = b""
        used = self.used
        for start in range(0, self.n, CHUNK):
            buf = os.pread(self.fd, min(CHUNK, self.n - start) * REC, HEAD + start * REC)
            for i in range(len(buf) // REC):
                r = start + i
                if not used[r >> 3] & (1 << (r & 7)):
                    continue
                rec = buf[i * REC:(i + 1) * REC]
                while nxt is not None and nxt < rec:
                    if nxt[:20] != last:
                        last = nxt[:20]
                        yield nxt
                    nxt = next(new_it, None)
                if rec[:20] != last:
                    last = rec[:20]
                    yield rec
        while nxt is not None:
            if nxt[:20] != last:
                last = nxt[:20]
                yield nxt
            nxt = next(new_it, None)

    def _write(self, fd: int) -> None:
        counts = array("I", bytes(FAN_BYTES))
        crc, n, out, pending = 0, 0, [], 0
        os.write(fd, bytes(HEAD))

        def flush():
            nonlocal crc, out, pending
            data = b"".join(out)
            crc = zlib.crc32(data, crc)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            out, pending = [], 0

        for rec in self._records():
            counts[rec[0] << 8 | rec[1]] += 1
            out.append(rec)
            n += 1
            pending += 1
            if pending >= CHUNK:
                flush()
        flush()
        total = 0
        for i in range(FAN):
            total += counts[i]
            counts[i] = total
        if sys.byteorder != "little":
            counts.byteswap()
        root = self.root.encode("utf-8", "surrogateescape")
        metas = marshal.dumps(self.metas)
        out = [counts.tobytes(), root, metas]
        flush()
        os.pwrite(fd, _HEAD.pack(MAGIC, n, len(root), len(metas), crc), 0)


#: An index not rewritten for this long belongs to a tree nobody lists any more (or a deleted one).
IDLE_S = 30 * 86400
#: A temp file this old is a killed writer's.
TEMP_IDLE_S = 3600


def _forget_idle(directory: Path) -> None:
    now = time.time()
    try:
        children = list(os.scandir(directory))
    except OSError:
        return
    for child in children:
        name = child.name
        if name.endswith((SUFFIX, ".marshal")):
            idle = IDLE_S
        elif name.startswith(OUR_PREFIX) and name.endswith(".tmp"):
            idle = TEMP_IDLE_S
        else:
            continue
        with contextlib.suppress(OSError):
            if now - child.stat(follow_symlinks=False).st_mtime > idle:
                os.unlink(child.path)
