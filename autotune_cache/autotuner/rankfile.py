"""Reading FlashInfer autotune cache files (what SGLang calls rank files).

Format (flashinfer 0.7.2.post1, ``AutoTuner.save_configs``)::

    {"_metadata": {...}, "_records": {...}?, "<file_key>": [runner, tactic, policy?], ...,
     "_generation": "<sha256>"}

where ``file_key`` is ``str((custom_op, runner_class_name, nearest_profile, extras))``.
Parsing never imports flashinfer: ``ls`` must run on machines without CUDA.
"""

from __future__ import annotations

import ast
import re
import hashlib
import json
import os
import stat as stat_mod
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple
from pathlib import Path

from autotune_cache.humanize import format_size, shorten

METADATA_KEY = "_metadata"
GENERATION_KEY = "_generation"
RECORDS_KEY = "_records"
RESERVED_KEYS = (METADATA_KEY, GENERATION_KEY, RECORDS_KEY)

#: Caps what we agree to read. Real rank files are 15-110 KB (a dense FP8 Llama TP4: 84 configs,
#: 31 KB; GLM-5.1 on Blackwell with MoE, FP4 GEMMs and MLA: ~110 KB); 16 MiB is 150x that.
MAX_RANK_FILE_BYTES = 16 * 1024 * 1024
#: Longest file key we parse (``ast.literal_eval`` cost grows with it); real ones are < 1 KB.
MAX_KEY_CHARS = 8192


class NotACacheFile(ValueError):
    """Parses as JSON but is not a FlashInfer autotune cache."""


def validate_cache_obj(obj: object) -> tuple[dict, int]:
    """Check the shape FlashInfer's ``load_configs`` relies on; return (metadata, config count)."""
    if not isinstance(obj, dict):
        raise NotACacheFile("top level is not a JSON object")
    meta = obj.get(METADATA_KEY, {})
    if not isinstance(meta, dict):
        raise NotACacheFile("_metadata is not an object")
    records = obj.get(RECORDS_KEY, {})
    if not isinstance(records, dict):
        raise NotACacheFile("_records is not an object")
    count = 0
    for key, value in obj.items():
        if key in RESERVED_KEYS:
            continue
        if not (isinstance(value, list) and 2 <= len(value) <= 3 and isinstance(value[0], str)):
            raise NotACacheFile(f"entry {shorten(key)!r} is not [runner, tactic(, policy)]")
        count += 1
    if count == 0 and METADATA_KEY not in obj:
        raise NotACacheFile("no _metadata and no tuned configs")
    return meta, count


def cache_file_bytes(metadata: dict, entries: dict) -> bytes:
    """A cache file exactly as FlashInfer's ``AutoTuner.save_configs`` lays it out: ``_metadata``
    first, keys sorted, ``_generation`` = sha256 of the compact sorted dump, ``indent=2``."""
    ordered: dict = {METADATA_KEY: metadata}
    for k in sorted(entries):
        ordered[k] = entries[k]
    gen = hashlib.sha256(json.dumps(ordered, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    ordered[GENERATION_KEY] = gen
    return json.dumps(ordered, indent=2).encode()


def parse_cache_bytes(data: bytes) -> dict:
    """Parse and validate; raises ValueError (JSON or NotACacheFile) on anything unusable."""
    try:
        obj = json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    validate_cache_obj(obj)
    return obj


_NOATIME = getattr(os, "O_NOATIME", 0)


def open_for_reading(path: "Path | str", dir_fd: int | None = None) -> int:
    """An fd on ``path`` that neither follows a symlink nor blocks on a FIFO, and, where we may
    (our own files), does not update the access time: listing is not using (``--unused-for``)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    if _NOATIME:
        try:
            return os.open(path, flags | _NOATIME, dir_fd=dir_fd)
        except PermissionError:
            pass  # O_NOATIME needs ownership; reading someone else's file may touch its atime
    return os.open(path, flags, dir_fd=dir_fd)


def refused_by_system(e: BaseException) -> bool:
    """Whether reading failed because the system would not let it (EACCES, EIO, gone meanwhile:
    an errno), which leaves the file's contents unknown - not because of what the file is
    (``read_regular_file``'s own refusals, not a regular file or too large, carry no errno; bad
    JSON is a ValueError). One rule for every reader of an entry's files."""
    return isinstance(e, OSError) and e.errno is not None


def read_regular_file(path: "Path | str", limit: int = MAX_RANK_FILE_BYTES, dir_fd: int | None = None) -> bytes:
    """Read a regular file without following a symlink, blocking on a FIFO, or touching atime."""
    fd = open_for_reading(path, dir_fd)
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            raise OSError(f"{os.path.basename(path)} is not a regular file")
        if st.st_size > limit:
            raise OSError(f"{os.path.basename(path)} is larger than {limit} bytes")
        # One read of the size stat gave (+1 to see growth); loop only if the file grew meanwhile.
        chunks = [os.read(fd, st.st_size + 1)]
        while len(chunks[-1]) and sum(map(len, chunks)) > st.st_size:
            if sum(map(len, chunks)) > limit:
                raise OSError(f"{os.path.basename(path)} is larger than {limit} bytes")
            chunks.append(os.read(fd, 1 << 20))
        return b"".join(chunks)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ParsedKey:
    custom_op: str
    runner: str
    profile: tuple
    extras: tuple


_KEY_HEAD = re.compile(r"""^\('((?:[^'\\]|\\.)*)', '((?:[^'\\]|\\.)*)', """)


def parse_file_key(file_key: str) -> ParsedKey | None:
    """Split a FlashInfer ``file_key`` string; None for keys of a shape we do not know.

    Real keys are not always Python literals: a runner's extras may hold dtypes, printed bare
    (``(torch.float8_e4m3fn, torch.bfloat16)``). The op, runner and shapes are parsed; extras
    that are not literals are kept as their text."""
    if len(file_key) > MAX_KEY_CHARS:
        return None
    try:
        value = ast.literal_eval(file_key)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        value = None
    if value is not None:
        if not (isinstance(value, tuple) and len(value) == 4 and isinstance(value[0], str)):
            return None
        return ParsedKey(value[0], str(value[1]), value[2], value[3])
    m = _KEY_HEAD.match(file_key)
    if not m or not file_key.endswith(")"):
        return None
    start = m.end()
    end = _closing(file_key, start)
    if end is None or file_key[end + 1:end + 3] != ", ":
        return None
    try:
        profile = ast.literal_eval(file_key[start:end + 1])
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(profile, tuple):
        return None
    return ParsedKey(m[1], m[2], profile, (file_key[end + 3:-1],))


def _closing(text: str, start: int) -> int | None:
    """Index of the parenthesis closing the one at ``start`` (shapes hold no strings)."""
    if start >= len(text) or text[start] != "(":
        return None
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        elif c in "'\"":
            return None
    return None


@dataclass(frozen=True)
class OpSummary:
    """Tuned configs of one custom op in one rank file."""

    custom_op: str
    configs: int
    buckets: int  # distinct bucketed input profiles
    runners: tuple[str, ...]


def summarize_ops(obj: dict) -> list[OpSummary]:
    configs: Counter = Counter()
    profiles: dict[str, set] = {}
    runners: dict[str, set] = {}
    for key, value in obj.items():
        if key in RESERVED_KEYS:
            continue
        parsed = parse_file_key(key)
        op = parsed.custom_op if parsed else "<unparsed key>"
        configs[op] += 1
        profiles.setdefault(op, set()).add(repr(parsed.profile) if parsed else key)
        runners.setdefault(op, set()).add(str(value[0]))
    return [
        OpSummary(op, configs[op], len(profiles[op]), tuple(sorted(runners[op])))
        for op in sorted(configs)
    ]


class RankFile(NamedTuple):
    """One data file of an entry as found on disk. ``error`` is set when it is corrupt or
    unreadable; ``unknown`` when the system would not let it be read (permissions, I/O, gone
    meanwhile): what it holds is then not known, and the entry is no corrupt one to delete. A
    tuple: ``ls`` builds 80,000 of them."""

    directory: Path
    name: str
    size_on_disk: int
    mtime: float
    mtime_ns: int
    sha256: str | None = None
    num_configs: int = 0
    metadata: dict = {}  # noqa: RUF012 - never mutated; shared by identical files
    error: str | None = None
    unknown: bool = False

    @property
    def path(self) -> Path:
        return self.directory / self.name

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def size_on_disk_str(self) -> str:
        return format_size(self.size_on_disk)

    def load(self) -> dict:
        """Full parsed contents (for ``show``); raises if the file has become unreadable."""
        return parse_cache_bytes(read_regular_file(self.path))

    @classmethod
    def from_bytes(cls, directory: Path, name: str, st: os.stat_result, data: bytes, digest: str | None = None) -> "RankFile":
        base = dict(directory=directory, name=name, size_on_disk=st.st_size, mtime=st.st_mtime,
                    mtime_ns=st.st_mtime_ns)
        digest = digest or hashlib.sha256(data).hexdigest()
        try:
            obj = json.loads(data)
            meta, count = validate_cache_obj(obj)
        except NotACacheFile as e:
            return cls(**base, sha256=digest, error=f"not a FlashInfer cache: {e}")
        except (ValueError, RecursionError) as e:
            return cls(**base, sha256=digest, error=f"invalid JSON: {str(e)[:80]}")
        return cls(**base, sha256=digest, num_configs=count, metadata=meta)

    @classmethod
    def unreadable(cls, directory: Path, name: str, st: os.stat_result, e: OSError) -> "RankFile":
        """``e`` from reading it: the system's refusal (an errno: EACCES, EIO...) leaves its
        contents unknown; ``read_regular_file``'s own (not a regular file, too large) is a fact."""
        return cls(directory, name, st.st_size, st.st_mtime, st.st_mtime_ns, error=f"unreadable: {e.strerror or e}",
                   unknown=refused_by_system(e))

    @classmethod
    def read(cls, directory: Path, name: str, st: os.stat_result) -> "RankFile":
        try:
            data = read_regular_file(os.path.join(directory, name))
        except OSError as e:
            return cls.unreadable(directory, name, st, e)
        return cls.from_bytes(directory, name, st, data)
