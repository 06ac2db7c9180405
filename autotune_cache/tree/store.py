"""Remote stores: content-addressed bundles of cache entries, through fsspec.

A store is a prefix on any filesystem fsspec reaches - ``s3://bucket/caches`` (s3fs),
``gs://...`` (gcsfs), ``file:///srv/caches``, or a read-only ``https://host/caches``::

    <store>/fi-autotune-store.json                            marker: format, read-only or not
    <store>/bundles/<layout>/<version>/<arch>/<key>/<sha256>.tar.gz   one entry, reproducible (``export``)
    <store>/index/<layout>/<version>/<arch>/<key>.json        what ``ls URL`` and ``pull`` read

A bundle is named by the sha256 of its bytes, and bundles are reproducible, so the same entry
always lands at the same name: two pushers of one entry write the same object. A push uploads
the bundle first (one PUT: an object store shows it whole or not at all; a local store writes a
temp name and renames it), then publishes the index record, so a reader never meets a record
whose bundle is partial; a push killed in between leaves an unreferenced bundle and no record,
and a retry completes it. ``pull`` checks every bundle against the sha256 in its name and its
record before importing them all in one transaction (all or nothing).

Credentials come only from each backend's standard means (environment, profiles, instance or
workload identity); fi-autotune never reads, prints or logs them, and strips any user:password
from URLs in messages.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import urlsplit, urlunsplit

from autotune_cache.version import __version__
from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.registry import get_layout
from autotune_cache.tree.archive import export_entries
from autotune_cache.tree.atomic import crashpoint
from autotune_cache.tree.layout import CacheLayout, EntryId
from autotune_cache.tree.storeio import TIMEOUT_ENV, TooLarge, is_timeout, read_capped, store_timeout, timeout_options

MARKER = "fi-autotune-store.json"
STORE_FORMAT = 1
RECORD_FORMAT = 1
#: Largest index record / bundle we accept from a store (a bundle is one entry: < 1 MB real).
MAX_RECORD_BYTES = 1 << 20
MAX_BUNDLE_BYTES = 256 << 20

#: Which extra provides which protocol (``pip install "fi-autotune[s3]"``).
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}
READ_ONLY_PROTOCOLS = ("http", "https")


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


def _fail(url: str, what: str, e: BaseException) -> StoreError:
    if is_timeout(e):
        return StoreError(f"{what} {redact(url)}: no answer within {store_timeout():g} s "
                          f"({TIMEOUT_ENV}=SECONDS waits longer)")
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return StoreError(f"{what} {redact(url)}: {type(e).__name__}: {msg[:200]}")


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
        }

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> "StoreRecord":
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
                       key_fields)
        except (ValueError, TypeError, KeyError, RecursionError, UsageError) as e:
            raise StoreError(f"{where}: not a valid index record ({e})") from None


@dataclass(frozen=True)
class PushResult:
    pushed: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    uploaded_bytes: int = 0

    def to_dict(self) -> dict:
        return {"pushed": list(self.pushed), "unchanged": list(self.unchanged), "uploaded_bytes": self.uploaded_bytes}


class Store:
    """One store URL, opened through fsspec."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        scheme = urlsplit(self.url).scheme.lower()
        self.timeout = store_timeout()
        try:
            import fsspec

            self.fs, self.root = fsspec.core.url_to_fs(self.url, **timeout_options(scheme, self.timeout))
        except ImportError as e:
            extra = EXTRAS.get(scheme)
            hint = f': pip install "fi-autotune[{extra}]"' if extra else ""
            raise UsageError(f"the {scheme}:// store needs a backend that is not installed ({e}){hint}") from None
        except ValueError as e:
            raise UsageError(f"{redact(url)}: {e}") from None
        self.protocol = scheme
        self.local = scheme in ("file", "local") or not scheme
        self.root = self.root.rstrip("/")

    def __str__(self) -> str:
        return redact(self.url)

    # paths ------------------------------------------------------------------------------------
    def _join(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def record_path(self, layout: str, eid: EntryId) -> str:
        return self._join("index", layout, *eid.parts[:-1], f"{eid.parts[-1]}.json")

    def bundle_rel(self, layout: str, eid: EntryId, sha: str) -> str:
        return "/".join(("bundles", layout, *eid.parts, f"{sha}.tar.gz"))

    # reading ------------------------------------------------------------------------------------
    def require(self) -> dict:
        """The store's marker; an error (exit 1) where there is no store at this URL, or it
        cannot be reached - never an empty listing on a typo."""
        marker = self.marker()
        if not marker:
            raise StoreError(f"no fi-autotune store at {self} (no {MARKER}; `fi-autotune push` creates one)")
        if type(marker.get("format")) is not int or marker["format"] > STORE_FORMAT:
            raise StoreError(f"{self}: store format {marker.get('format')!r} is not one this fi-autotune reads")
        return marker

    def records(self, layout: str | None = None) -> list[StoreRecord]:
        """Every published entry (needs listing: object stores and file://; an HTTP store lists
        only where the server shows directory indexes)."""
        self.require()
        base = self._join("index", layout) if layout else self._join("index")
        try:
            paths = [p for p in self.fs.find(base) if p.endswith(".json")]
        except FileNotFoundError:
            return []
        except Exception as e:  # noqa: BLE001 - backends raise their own types
            raise _fail(self.url, "cannot list", e) from None
        if not paths:
            return []
        try:
            blobs = self.fs.cat(paths, on_error="omit")
        except Exception as e:  # noqa: BLE001
            raise _fail(self.url, "cannot read", e) from None
        out = []
        for p in sorted(blobs):
            out.append(StoreRecord.from_bytes(blobs[p], f"{redact(self.url)}/{p[len(self.root) + 1:]}"))
        return out

    def record(self, layout: str, eid: EntryId) -> StoreRecord | None:
        self.require()
        path = self.record_path(layout, eid)
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        except Exception as e:  # noqa: BLE001
            if _is_missing(e):
                return None
            raise _fail(self.url, "cannot read", e) from None
        where = f"{redact(self.url)}/{path[len(self.root) + 1:]}"
        rec = StoreRecord.from_bytes(data, where)
        if rec.layout != layout or rec.id != eid:
            # a record copied or edited to another entry's place: ``pull A`` must never install B
            raise StoreError(f"{where}: the index record names {rec.id}, not {eid}: refusing it")
        return rec

    def fetch(self, rec: StoreRecord) -> bytes:
        """The bundle's bytes, checked against the sha256 of its name and its record."""
        path = self._join(rec.bundle)
        try:
            size = self.fs.size(path)
            if size is not None and size > MAX_BUNDLE_BYTES:
                raise StoreError(f"{rec.id}: bundle of {size} bytes is over the {MAX_BUNDLE_BYTES} limit")
            data = self.fs.cat_file(path)
        except StoreError:
            raise
        except Exception as e:  # noqa: BLE001
            if _is_missing(e):
                raise StoreError(f"{rec.id}: its record names {rec.bundle}, which is not in {self}") from None
            raise _fail(self.url, "cannot read", e) from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != rec.sha256:
            raise StoreError(f"{rec.id}: bundle {rec.bundle} has sha256 {digest[:16]}..., not {rec.sha256[:16]}... "
                             "(corrupted or tampered with): refusing it")
        return data

    def marker(self) -> dict:
        try:
            data = self.fs.cat_file(self._join(MARKER))
        except Exception as e:  # noqa: BLE001
            if _is_missing(e):
                return {}
            raise _fail(self.url, "cannot reach", e) from None
        try:
            d = json.loads(data)
            return d if isinstance(d, dict) else {}
        except ValueError:
            return {}

    # writing ------------------------------------------------------------------------------------
    def _put(self, path: str, data: bytes) -> None:
        """Appear whole or not at all: one PUT on an object store; temp name + rename locally."""
        if self.local:
            directory = posixpath.dirname(path)
            self.fs.makedirs(directory, exist_ok=True)
            tmp = posixpath.join(directory, f".tmp-{secrets.token_hex(6)}")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        else:
            self.fs.pipe_file(path, data)

    def check_writable(self) -> None:
        if self.protocol in READ_ONLY_PROTOCOLS:
            raise UsageError(f"{self} is an {self.protocol}:// store: read-only (push to s3://, gs:// or file://)")
        if self.marker().get("read_only"):
            raise FiAutotuneError(f"{self} is marked read-only ({MARKER}): nothing was pushed")

    def push(self, layout: CacheLayout, bundles: list[tuple[object, bytes]], *, seal: bool = False) -> PushResult:
        """Publish ``(entry, bundle bytes)`` pairs: bundle first, then its index record."""
        self.check_writable()
        pushed, unchanged, uploaded = [], [], 0
        try:
            if not self.marker():
                self._put(self._join(MARKER), json.dumps({"format": STORE_FORMAT, "read_only": False}).encode())
            for entry, data in bundles:
                sha = hashlib.sha256(data).hexdigest()
                rel = self.bundle_rel(layout.name, entry.id, sha)
                current = self.record(layout.name, entry.id)
                if current is not None and current.sha256 == sha and self.fs.exists(self._join(rel)):
                    unchanged.append(str(entry.id))
                    continue
                if not self.fs.exists(self._join(rel)):
                    self._put(self._join(rel), data)
                    uploaded += len(data)
                crashpoint("store.bundle_uploaded")
                rec = StoreRecord(
                    layout.name, entry.id, sha, len(data), rel, dict(entry.metadata), entry.model,
                    entry.topology.to_dict() if entry.topology else None, entry.ep, len(entry.rank_files),
                    datetime.now(timezone.utc).isoformat(timespec="seconds"), __version__,
                    entry.manifest.key_fields.to_dict() if entry.manifest else None,
                )
                self._put(self.record_path(layout.name, entry.id), json.dumps(rec.to_dict(), indent=1).encode())
                pushed.append(str(entry.id))
            if seal:
                self._put(self._join(MARKER), json.dumps({"format": STORE_FORMAT, "read_only": True}).encode())
        except FiAutotuneError:
            raise
        except Exception as e:  # noqa: BLE001
            raise _fail(self.url, "cannot write to", e) from None
        return PushResult(tuple(pushed), tuple(unchanged), uploaded)


def _is_missing(e: BaseException) -> bool:
    """Backends report a missing object in their own ways (HTTP 404, ClientError NoSuchKey) -
    and fsspec's HTTP backend reports an unreachable server as FileNotFoundError too, with the
    connection error as its cause; that one is not "missing"."""
    cause = e.__cause__ or e.__context__
    if cause is not None and any(s in type(cause).__name__ for s in ("Connect", "Timeout", "OSError", "ClientOS")):
        return False
    if isinstance(e, FileNotFoundError):
        return True
    text = f"{type(e).__name__} {e}"
    return any(s in text for s in ("404", "NoSuchKey", "Not Found", "NotFound"))


def bundle_of(layout: CacheLayout, entry) -> bytes:
    """The reproducible one-entry bundle ``export`` would write for ``entry``."""
    buf = io.BytesIO()
    result = export_entries(layout, [entry], buf)
    if not result.entries:
        raise FiAutotuneError(f"{entry.id} vanished while it was being bundled")
    return buf.getvalue()
