"""A store's index records: what ``ls URL`` lists and what ``pull`` looks a bundle up by.

A record is a small JSON file anyone with write access to the store can edit; only the bundle
it names is pinned (by the sha256 in that name). So a record is parsed defensively here (types,
a bundle path that matches its sha256, a format this version reads), and ``pull`` judges the
bundle's own contents against it (``tree/store/pull.py``). Also the store's shared small names: the
error type, and URLs without credentials for messages.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.registry import get_layout
from autotune_cache.tree.layouts.values import EntryId

RECORD_FORMAT = 1
#: Largest index record we accept from a store (read with this cap, then parsed).
MAX_RECORD_BYTES = 1 << 20
#: What a pushed entry can be (``push`` never publishes a corrupt, diverged or stale one).
PUSHED_STATUSES = ("complete", "incomplete", "unverified")


def redact(url: str) -> str:
    """The URL without any ``user:password@`` (never print a credential)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<url>"
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return url


def is_store_url(text: str | None) -> bool:
    return bool(text) and "://" in text


class StoreError(FiAutotuneError):
    """The store could not be reached or read (exit 1)."""


@dataclass(frozen=True)
class StoreRecord:
    """One published entry: the index record of a bundle."""

    layout: str
    id: EntryId
    sha256: str
    size: int
    bundle: str  # path of the bundle relative to the store
    metadata: dict = field(default_factory=dict)
    model: str | None = None
    topology: dict | None = None
    ep: int | None = None
    rank_files: int = 0
    pushed: str = ""
    tool_version: str = ""
    key_fields: dict | None = None  # from the entry's manifest; None for engine-written entries
    #: The entry's status when pushed (``push --include-incomplete`` publishes incomplete and
    #: unverified ones too). Records of older pushes have none: ``status_of`` infers it.
    status: str = ""

    @property
    def status_of(self) -> str:
        """complete, incomplete or unverified: as pushed; for an older record without one,
        complete only where a manifest (``key_fields``) counted its rank files - never on a guess."""
        if self.status in PUSHED_STATUSES:
            return self.status
        return "complete" if self.key_fields is not None else "unverified"

    @property
    def gpu(self) -> str | None:
        g = self.metadata.get("gpu")
        return g if isinstance(g, str) and g not in ("unknown", "None") else None

    @property
    def flashinfer_version(self) -> str | None:
        return get_layout(self.layout).id_fields(self.id).get("flashinfer_version")

    @property
    def arch(self) -> str | None:
        return get_layout(self.layout).id_fields(self.id).get("arch")

    def to_dict(self) -> dict:
        return {
            "format": RECORD_FORMAT, "tool": "fi-autotune", "tool_version": self.tool_version, "layout": self.layout,
            "id": str(self.id), "parts": list(self.id.parts), "sha256": self.sha256, "size": self.size,
            "bundle": self.bundle, "metadata": self.metadata, "model": self.model, "topology": self.topology,
            "ep": self.ep, "rank_files": self.rank_files, "pushed": self.pushed, "key_fields": self.key_fields,
            "status": self.status_of,
        }

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> "StoreRecord":
        """Parse a record read with its cap (``Store.read_small``); the length is checked again."""
        if len(data) > MAX_RECORD_BYTES:
            raise StoreError(f"{where}: index record larger than {MAX_RECORD_BYTES} bytes")
        try:
            d = json.loads(data)
            if type(d) is not dict or d.get("tool") != "fi-autotune":
                raise ValueError("not an fi-autotune index record")
            if type(d.get("format")) is not int or d["format"] > RECORD_FORMAT:
                raise ValueError(f"format {d.get('format')!r} is not one this fi-autotune reads")
            layout = get_layout(d["layout"])
            eid = layout.make_id(tuple(d["parts"]))
            sha, size, bundle = d["sha256"], d["size"], d["bundle"]
            if type(sha) is not str or len(sha) != 64 or type(size) is not int or type(bundle) is not str:
                raise ValueError("sha256/size/bundle have the wrong types")
            if posixpath.basename(bundle) != f"{sha}.tar.gz" or ".." in bundle.split("/") or bundle.startswith("/"):
                raise ValueError("the bundle path does not match its sha256")
            metadata = d.get("metadata") or {}
            key_fields = d.get("key_fields")
            if type(metadata) is not dict or (key_fields is not None and type(key_fields) is not dict):
                raise ValueError("metadata / key_fields are not objects")
            return cls(layout.name, eid, sha, size, bundle, metadata, d.get("model"), d.get("topology"), d.get("ep"),
                       int(d.get("rank_files") or 0), str(d.get("pushed", "")), str(d.get("tool_version", "")),
                       key_fields, d["status"] if d.get("status") in PUSHED_STATUSES else "")
        except (ValueError, TypeError, KeyError, RecursionError, UsageError) as e:
            raise StoreError(f"{where}: not a valid index record ({e})") from None
