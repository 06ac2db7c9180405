"""fi-autotune's manifest: one small JSON per entry recording what the key's hash hides.

The manifest is written with the data files and records each one's (size, mtime_ns, ctime_ns,
sha256, configs). ``ls`` trusts those numbers only while ``stat`` still shows the same size,
mtime and ctime, which keeps listing 10,000 entries to a few stats per entry instead of parsing
80,000 JSON files; any file touched since (by an engine, by hand, even with its mtime put back)
is read and hashed again.

A manifest is data we may not have written (an archive, a hand edit): every field is type- and
size-checked on read, and anything malformed makes the entry corrupt, never a crash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import NamedTuple
from datetime import datetime, timezone

from autotune_cache.version import __version__
from autotune_cache.plan.entry_key import KeyFields
from autotune_cache.plan.topology import MAX_RANK_FILES, Topology, TopologyError

#: 2: ``request`` (the typed serving request) replaces ``extra.plan_args``; records gain ctime_ns.
MANIFEST_FORMAT = 2
#: Largest manifest we parse; real ones are a few KB (one record per rank file).
MAX_MANIFEST_BYTES = 16 * 1024 * 1024


class NewerManifest(ValueError):
    """Written by a newer fi-autotune: not corrupt, just not ours to interpret."""


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class RankRecord(NamedTuple):
    """What the manifest says of one rank file. A tuple: ``ls`` builds 80,000 of them."""

    size: int
    mtime_ns: int
    sha256: str
    configs: int
    ctime_ns: int | None = None  # absent in format-1 manifests

    def to_dict(self) -> dict:
        d = {"size": self.size, "mtime_ns": self.mtime_ns, "sha256": self.sha256, "configs": self.configs}
        if self.ctime_ns is not None:
            d["ctime_ns"] = self.ctime_ns
        return d

    def matches(self, st) -> bool:
        """Does ``stat`` say the file is still the one recorded?"""
        return (
            self.size == st.st_size
            and self.mtime_ns == st.st_mtime_ns
            and (self.ctime_ns is None or self.ctime_ns == st.st_ctime_ns)
        )

    @classmethod
    def from_dict(cls, name: str, r: object) -> "RankRecord":
        try:
            size, mtime, sha, configs = r["size"], r["mtime_ns"], r["sha256"], r["configs"]  # type: ignore[index]
            ctime = r.get("ctime_ns")  # type: ignore[union-attr]
        except (KeyError, TypeError, AttributeError):
            raise ValueError(f"rank_files[{name[:40]!r}] is not a record") from None
        # type() is, not isinstance: bool is an int subclass and no size is True.
        if type(size) is not int or type(mtime) is not int or type(configs) is not int or type(sha) is not str \
                or (ctime is not None and type(ctime) is not int):
            raise ValueError(f"rank_files[{name[:40]!r}] has fields of the wrong type")
        return cls(size, mtime, sha, configs, ctime)


@dataclass(frozen=True)
class Manifest:
    key: str
    schema: str
    key_string: str
    key_fields: KeyFields
    topology: Topology
    flashinfer_version: str
    arch: str
    flashinfer_metadata: dict
    rank_files: dict[str, RankRecord]
    created: str
    updated: str
    tool_version: str = __version__
    stats: dict = field(default_factory=dict)
    #: What warm was asked (``request.TuneRequest.to_dict()``): how ``verify`` rebuilds the plan.
    request: dict | None = None
    extra: dict = field(default_factory=dict)
    format: int = MANIFEST_FORMAT

    @property
    def model(self) -> str:
        return self.key_fields.model_path

    @property
    def gpu(self) -> str | None:
        value = self.flashinfer_metadata.get("gpu")
        return value if isinstance(value, str) else None

    def to_dict(self) -> dict:
        d = {
            "format": MANIFEST_FORMAT,
            "tool": "fi-autotune",
            "tool_version": self.tool_version,
            "key": self.key,
            "schema": self.schema,
            "key_string": self.key_string,
            "key_fields": self.key_fields.to_dict(),
            "topology": self.topology.to_dict(),
            "flashinfer_version": self.flashinfer_version,
            "arch": self.arch,
            "flashinfer_metadata": self.flashinfer_metadata,
            "rank_files": {name: rec.to_dict() for name, rec in sorted(self.rank_files.items())},
            "created": self.created,
            "updated": self.updated,
            "stats": self.stats,
        }
        if self.request is not None:
            d["request"] = self.request
        if self.extra:
            d["extra"] = self.extra
        return d

    def to_bytes(self) -> bytes:
        # Compact: ``ls`` parses one per entry (pretty-print it with ``fi-autotune show --json``).
        return (json.dumps(self.to_dict(), separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_dict(cls, d: object) -> "Manifest":
        """Type- and size-checked; ``ls`` parses 10,000 of these, so the checks are plain
        ``type() is`` tests (bool is an int subclass: no count is True)."""
        if type(d) is not dict or d.get("tool") != "fi-autotune":
            raise ValueError("not an fi-autotune manifest")
        fmt = d.get("format")
        if type(fmt) is not int or fmt < 1:
            raise ValueError("no valid format number")
        if fmt > MANIFEST_FORMAT:
            raise NewerManifest(f"format {fmt} is newer than this fi-autotune reads ({MANIFEST_FORMAT}); upgrade fi-autotune")
        key, schema, key_string = d.get("key"), d.get("schema"), d.get("key_string")
        version, arch = d.get("flashinfer_version"), d.get("arch")
        for name, v in (("key", key), ("schema", schema), ("key_string", key_string),
                        ("flashinfer_version", version), ("arch", arch)):
            if type(v) is not str:
                raise ValueError(f"{name} is not a string")
        records = d.get("rank_files") or {}
        if type(records) is not dict:
            raise ValueError("rank_files is not an object")
        if len(records) > MAX_RANK_FILES:
            raise ValueError(f"more than {MAX_RANK_FILES} rank files")
        metadata, stats, extra = d.get("flashinfer_metadata") or {}, d.get("stats") or {}, d.get("extra") or {}
        for name, v in (("flashinfer_metadata", metadata), ("stats", stats), ("extra", extra)):
            if type(v) is not dict:
                raise ValueError(f"{name} is not an object")
        request = d.get("request")
        if request is not None and type(request) is not dict:
            raise ValueError("request is not an object")
        try:
            topology = Topology.from_dict(d.get("topology"))  # cached: a tree has few distinct topologies
        except TopologyError as e:
            raise ValueError(f"topology: {e}") from None
        make = RankRecord.from_dict
        return cls(
            key, schema, key_string, KeyFields.from_dict(d.get("key_fields")), topology, version, arch,
            metadata, {name: make(name, r) for name, r in records.items()},
            str(d.get("created", "")), str(d.get("updated", "")), str(d.get("tool_version", "")),
            stats, request, extra, fmt,
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> "Manifest":
        if len(data) > MAX_MANIFEST_BYTES:
            raise ValueError(f"invalid manifest: larger than {MAX_MANIFEST_BYTES} bytes")
        try:
            return cls.from_dict(json.loads(data))
        except NewerManifest:
            raise
        except RecursionError:
            raise ValueError("invalid manifest: nested too deeply") from None
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"invalid manifest: {e}") from None

    def with_rank_records(self, records: dict[str, RankRecord], updated: str | None = None) -> "Manifest":
        return replace(self, rank_files=dict(records), updated=updated or utc_now_iso())
