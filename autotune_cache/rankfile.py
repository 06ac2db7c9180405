"""Reading FlashInfer autotune cache files (what SGLang calls rank files).

Format (flashinfer 0.7.2.post1, ``AutoTuner.save_configs``)::

    {"_metadata": {...}, "_records": {...}?, "<file_key>": [runner, tactic, policy?], ...,
     "_generation": "<sha256>"}

where ``file_key`` is ``str((custom_op, runner_class_name, nearest_profile, extras))``.
Parsing never imports flashinfer: ``ls`` must run on machines without CUDA.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import stat as stat_mod
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

METADATA_KEY = "_metadata"
GENERATION_KEY = "_generation"
RECORDS_KEY = "_records"
RESERVED_KEYS = (METADATA_KEY, GENERATION_KEY, RECORDS_KEY)

#: Caps what we agree to read; a real rank file is KBs to a few MB.
MAX_RANK_FILE_BYTES = 64 * 1024 * 1024


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
            raise NotACacheFile(f"entry {key[:60]!r} is not [runner, tactic(, policy)]")
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
    obj = json.loads(data)
    validate_cache_obj(obj)
    return obj


def read_regular_file(path: "Path | str", limit: int = MAX_RANK_FILE_BYTES) -> bytes:
    """Read a regular file without following a symlink or blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            raise OSError(f"{os.path.basename(path)} is not a regular file")
        if st.st_size > limit:
            raise OSError(f"{os.path.basename(path)} is larger than {limit} bytes")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ParsedKey:
    custom_op: str
    runner: str
    profile: tuple
    extras: tuple


def parse_file_key(file_key: str) -> ParsedKey | None:
    """Split a FlashInfer ``file_key`` string; None for keys of a shape we do not know."""
    try:
        value = ast.literal_eval(file_key)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not (isinstance(value, tuple) and len(value) == 4 and isinstance(value[0], str)):
        return None
    return ParsedKey(value[0], str(value[1]), value[2], value[3])


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


@dataclass(frozen=True)
class RankFile:
    """One rank file as found on disk. ``error`` is set when it is corrupt or unreadable."""

    directory: Path
    name: str
    size_on_disk: int
    mtime: float
    mtime_ns: int
    sha256: str | None = None
    num_configs: int = 0
    metadata: dict = field(default_factory=dict, compare=False, hash=False)
    error: str | None = None

    @property
    def path(self) -> Path:
        return self.directory / self.name

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def size_on_disk_str(self) -> str:
        from .humanize import format_size

        return format_size(self.size_on_disk)

    def load(self) -> dict:
        """Full parsed contents (for ``show``); raises if the file has become unreadable."""
        return parse_cache_bytes(read_regular_file(self.path))

    @classmethod
    def read(cls, directory: Path, name: str, st: os.stat_result) -> "RankFile":
        path = os.path.join(directory, name)
        base = dict(directory=directory, name=name, size_on_disk=st.st_size, mtime=st.st_mtime, mtime_ns=st.st_mtime_ns)
        try:
            data = read_regular_file(path)
        except OSError as e:
            return cls(**base, error=f"unreadable: {e.strerror or e}")
        digest = hashlib.sha256(data).hexdigest()
        try:
            obj = json.loads(data)
            meta, count = validate_cache_obj(obj)
        except NotACacheFile as e:
            return cls(**base, sha256=digest, error=f"not a FlashInfer cache: {e}")
        except (ValueError, RecursionError) as e:
            return cls(**base, sha256=digest, error=f"invalid JSON: {str(e)[:80]}")
        return cls(**base, sha256=digest, num_configs=count, metadata=meta)
