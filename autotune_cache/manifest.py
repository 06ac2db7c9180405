"""fi-autotune's manifest: one small JSON per key dir recording what the key's hash hides.

The manifest is written last, after every rank file, and also records each rank file's
(size, mtime_ns, sha256, configs). ``ls`` trusts those numbers only while ``stat`` still
matches them, which keeps listing 10,000 entries to a few stats per entry instead of parsing
80,000 JSON files; any file touched since (by an engine, by hand) is read and hashed again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from . import __version__
from .keys import KeyFields
from .layout import Topology

MANIFEST_FORMAT = 1


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class RankRecord:
    size: int
    mtime_ns: int
    sha256: str
    configs: int

    def to_dict(self) -> dict:
        return {"size": self.size, "mtime_ns": self.mtime_ns, "sha256": self.sha256, "configs": self.configs}


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
    extra: dict = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.key_fields.model_path

    @property
    def expected_files(self) -> list[str]:
        return self.topology.rank_files()

    def to_dict(self) -> dict:
        return {
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
            "expected_rank_files": self.expected_files,
            "rank_files": {name: rec.to_dict() for name, rec in sorted(self.rank_files.items())},
            "created": self.created,
            "updated": self.updated,
            "stats": self.stats,
            **({"extra": self.extra} if self.extra else {}),
        }

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n").encode()

    @classmethod
    def from_dict(cls, d: dict) -> "Manifest":
        if not isinstance(d, dict) or d.get("tool") != "fi-autotune":
            raise ValueError("not an fi-autotune manifest")
        return cls(
            key=str(d["key"]),
            schema=str(d["schema"]),
            key_string=str(d["key_string"]),
            key_fields=KeyFields.from_dict(d["key_fields"]),
            topology=Topology.from_dict(d["topology"]),  # cached: a tree has few distinct topologies
            flashinfer_version=str(d["flashinfer_version"]),
            arch=str(d["arch"]),
            flashinfer_metadata=dict(d.get("flashinfer_metadata") or {}),
            rank_files={
                name: RankRecord(int(r["size"]), int(r["mtime_ns"]), str(r["sha256"]), int(r["configs"]))
                for name, r in (d.get("rank_files") or {}).items()
            },
            created=str(d.get("created", "")),
            updated=str(d.get("updated", "")),
            tool_version=str(d.get("tool_version", "")),
            stats=dict(d.get("stats") or {}),
            extra=dict(d.get("extra") or {}),
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> "Manifest":
        try:
            return cls.from_dict(json.loads(data))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"invalid manifest: {e}") from None

    @classmethod
    def read(cls, path: Path) -> "Manifest":
        return cls.from_bytes(Path(path).read_bytes())

    def with_rank_records(self, records: dict[str, RankRecord], updated: str | None = None) -> "Manifest":
        return replace(self, rank_files=dict(records), updated=updated or utc_now_iso())
