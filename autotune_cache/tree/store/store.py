"""Remote stores: content-addressed bundles of cache entries, through fsspec.

A store is a prefix on any filesystem fsspec reaches - ``s3://bucket/caches`` (s3fs),
``gs://...`` (gcsfs), ``file:///srv/caches``, or a read-only ``https://host/caches``::

    <store>/fi-autotune-store.json                            marker: format, read-only or not
    <store>/bundles/<layout>/<version>/<arch>/<key>/<sha256>.tar.gz   one entry, reproducible (``export``)
    <store>/index/<layout>/<version>/<arch>/<key>.json        what ``ls URL`` and ``pull`` read
    <store>/deleting/<layout>/<version>/<arch>/<key>.json     a delete in progress (``storesweep``)

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
import posixpath
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

from autotune_cache.version import __version__
from autotune_cache.errors import FiAutotuneError, Interrupted, UsageError
from autotune_cache.humanize import plural
from autotune_cache.tree.store.export import export_entries
from autotune_cache.tree.crashsafe.atomic import atomic_write_bytes
from autotune_cache.tree.crashsafe.faults import crashpoint
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId
from autotune_cache.tree.crashsafe.locks import hold_owner_lock, release_owner_lock
from autotune_cache.tree.store.storeio import (HTTP_PROTOCOLS, LISTING_BYTES, TIMEOUT_ENV, DeadlinePassed, TooLarge, bounded,
                                               is_missing, is_timeout, read_capped, store_timeout, timeout_options)
from autotune_cache.tree.store.storerecord import MAX_RECORD_BYTES, StoreError, StoreRecord, redact

MARKER = "fi-autotune-store.json"
STORE_FORMAT = 1
#: Largest bundle we accept from a store (a bundle is one entry: < 1 MB real).
MAX_BUNDLE_BYTES = 256 << 20
#: Largest store marker (``{"format": 1, "read_only": false}``), read with this cap.
MAX_MARKER_BYTES = 64 << 10

#: Which extra provides which protocol (``pip install "fi-autotune[s3]"``).
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}
READ_ONLY_PROTOCOLS = ("http", "https")
#: Where a delete leaves its tombstone while it runs (``storesweep``).
TOMBSTONES = "deleting"
#: A local store's temp files: ``.tmp-<owner token>-<random>`` (``.tmp-<random>``: older fi-autotune, no owner).
TEMP_PREFIX = ".tmp-"


def _fail(url: str, what: str, e: BaseException, timeout: float | None = None) -> StoreError:
    if isinstance(e, DeadlinePassed):  # it kept answering, too slowly
        return StoreError(f"{what} {redact(url)}: {e} (--timeout SECONDS or {TIMEOUT_ENV}=SECONDS allows more)")
    if is_timeout(e):
        return StoreError(f"{what} {redact(url)}: no answer within {timeout or store_timeout():g} s "
                          f"(--timeout SECONDS or {TIMEOUT_ENV}=SECONDS waits longer)")
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return StoreError(f"{what} {redact(url)}: {type(e).__name__}: {msg[:200]}")


@dataclass(frozen=True)
class PushResult:
    pushed: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    uploaded_bytes: int = 0
    vanished: tuple[str, ...] = ()  # deleted (a concurrent rm or prune) before they were bundled

    def to_dict(self) -> dict:
        return {"pushed": list(self.pushed), "unchanged": list(self.unchanged), "uploaded_bytes": self.uploaded_bytes,
                "vanished": list(self.vanished)}


class Store:
    """One store URL, opened through fsspec."""

    def __init__(self, url: str, timeout: float | None = None):
        """``timeout``: seconds the store may stay silent (``--timeout``); None: the
        environment's ``FI_AUTOTUNE_STORE_TIMEOUT``, else the default (``storeio``)."""
        self.url = url.rstrip("/")
        scheme = urlsplit(self.url).scheme.lower()
        self.timeout = store_timeout(timeout)
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
        #: Index records ``records`` left out, one line each (``ls URL`` and ``pull`` warn), and their paths.
        self.unreadable: list[str] = []
        self.unreadable_paths: list[str] = []
        #: The marker as this Store last read or wrote it (``known_marker``); None: not yet.
        self._marker: dict | None = None

    def __str__(self) -> str:
        return redact(self.url)

    # paths ------------------------------------------------------------------------------------
    def join(self, *parts: str) -> str:
        """The full path of ``parts`` under the store's root (public: the sweep and the delete
        in ``storesweep`` and ``storehouse`` name the store's objects through it too)."""
        return "/".join((self.root, *parts))

    def record_path(self, layout: str, eid: EntryId) -> str:
        return self.join("index", layout, *eid.parts[:-1], f"{eid.parts[-1]}.json")

    def tombstone_path(self, layout: str, eid: EntryId) -> str:
        return self.join(TOMBSTONES, layout, *eid.parts[:-1], f"{eid.parts[-1]}.json")

    def bundle_rel(self, layout: str, eid: EntryId, sha: str) -> str:
        return "/".join(("bundles", layout, *eid.parts, f"{sha}.tar.gz"))

    # reading ------------------------------------------------------------------------------------
    def require(self, *, fresh: bool = False) -> dict:
        """The store's marker; an error (exit 1) where there is no store at this URL, or it
        cannot be reached - never an empty listing on a typo. Asked of the marker this Store
        knows (``known_marker``): a command reads it once, not once per record; ``fresh``: read
        now (whether it is sealed, before a write that depends on it)."""
        marker = self.marker() if fresh else self.known_marker()
        if not marker:
            raise StoreError(f"no fi-autotune store at {self} (no {MARKER}; `fi-autotune push` creates one)")
        if "unreadable" in marker and self.protocol in HTTP_PROTOCOLS and marker.get("answered"):
            # a web server answers any path (random bytes, an HTML page): an answer that is no
            # marker is no store, never an empty one
            raise StoreError(f"not a fi-autotune store at {self}: {marker['unreadable']}")
        if "unreadable" in marker:
            return marker  # a store is there: its records are each checked as they are read
        if type(marker.get("format")) is not int or marker["format"] > STORE_FORMAT:
            raise StoreError(f"{self}: store format {marker.get('format')!r} is not one this fi-autotune reads")
        return marker

    def records(self, layout: str | None = None) -> list[StoreRecord]:
        """Every published entry (needs listing: object stores and file://; an HTTP store lists
        only where the server shows directory indexes). A record that cannot be read, parsed,
        or sits in another entry's place is left out and named in ``self.unreadable``: one bad
        record (edited, truncated, from a newer fi-autotune) must not hide the others."""
        self.require()
        base = self.join("index", layout) if layout else self.join("index")
        try:
            paths = sorted(p for p in bounded(self.fs, self.fs.find, base, timeout=self.timeout, size=LISTING_BYTES)
                           if p.endswith(".json"))
        except FileNotFoundError:
            return []
        except Exception as e:  # noqa: BLE001 - backends raise their own types
            raise _fail(self.url, "cannot list", e, self.timeout) from None
        out = []
        for p, data in zip(paths, self._read_records(paths)):
            where = f"{redact(self.url)}/{p[len(self.root) + 1:]}"
            if isinstance(data, BaseException) and is_timeout(data):
                raise _fail(self.url, "cannot read", data, self.timeout)  # the store is not answering: not one bad record
            try:
                if isinstance(data, BaseException):
                    if is_missing(data):
                        continue  # deleted since the listing
                    raise _fail(self.url, "cannot read", data, self.timeout)
                rec = self._own_bundle(StoreRecord.from_bytes(data, where), where)
                if p != self.record_path(rec.layout, rec.id):
                    raise StoreError(f"{where}: the index record names {rec.id}, which belongs elsewhere")
            except StoreError as e:
                self.unreadable.append(f"{e}: skipped")
                self.unreadable_paths.append(p)
                continue
            out.append(rec)
        return out

    def _read_records(self, paths: list[str]) -> list:
        """Each record's bytes (at most ``MAX_RECORD_BYTES + 1`` read), or the exception met."""
        if self.local or self.protocol in READ_ONLY_PROTOCOLS or not paths:
            got = []
            for p in paths:
                try:
                    got.append(self.read_small(p, MAX_RECORD_BYTES, "index record"))
                except Exception as e:  # noqa: BLE001
                    if is_timeout(e):
                        raise _fail(self.url, "cannot read", e, self.timeout) from None
                    got.append(e)
            return got
        try:  # an object store: ranged reads, concurrently
            blobs = bounded(self.fs, self.fs.cat, paths, start=0, end=MAX_RECORD_BYTES + 1, on_error="return",
                            timeout=self.timeout, size=len(paths) * (MAX_RECORD_BYTES + 1))
        except Exception as e:  # noqa: BLE001
            raise _fail(self.url, "cannot read", e, self.timeout) from None
        return [StoreError(f"index record larger than {MAX_RECORD_BYTES} bytes")
                if isinstance(blobs.get(p), bytes) and len(blobs[p]) > MAX_RECORD_BYTES
                else blobs.get(p, FileNotFoundError(p)) for p in paths]

    def read_small(self, path: str, limit: int, what: str) -> bytes:
        """One small object read with its cap (``storeio.read_capped``); over it: StoreError.
        The only way anything reads a record, marker, tombstone or summary: never uncapped."""
        try:
            return read_capped(self.fs, path, limit, local=self.local, protocol=self.protocol, timeout=self.timeout)
        except TooLarge:
            raise StoreError(f"{redact(self.url)}/{path[len(self.root) + 1:]}: {what} larger than {limit} bytes") from None

    def record(self, layout: str, eid: EntryId) -> StoreRecord | None:
        self.require()
        path = self.record_path(layout, eid)
        try:
            data = self.read_small(path, MAX_RECORD_BYTES, "index record")
        except StoreError:
            raise
        except Exception as e:  # noqa: BLE001
            if is_missing(e):
                return None
            raise _fail(self.url, "cannot read", e, self.timeout) from None
        where = f"{redact(self.url)}/{path[len(self.root) + 1:]}"
        rec = self._own_bundle(StoreRecord.from_bytes(data, where), where)
        if rec.layout != layout or rec.id != eid:
            # a record copied or edited to another entry's place: ``pull A`` must never install B
            raise StoreError(f"{where}: the index record names {rec.id}, not {eid}: refusing it")
        return rec

    def _own_bundle(self, rec: StoreRecord, where: str) -> StoreRecord:
        """``rec``, if the bundle it names is the one a push of it writes (its entry's place,
        its sha256): a record edited to name another entry's bundle would have ``pull A``
        install B, and ``rm URL A`` delete B's bundle from under B's record."""
        if rec.bundle != self.bundle_rel(rec.layout, rec.id, rec.sha256):
            raise StoreError(f"{where}: the index record names the bundle {rec.bundle}, not its own")
        return rec

    def fetch(self, rec: StoreRecord) -> bytes:
        """The bundle's bytes, checked against the sha256 of its name and its record."""
        path = self.join(rec.bundle)
        # The record says how large its bundle is: read no more than that (plus one byte, to
        # know it is larger), whatever the server announces - or does not (a body with no
        # Content-Length would otherwise be read until memory runs out).
        limit = rec.size if type(rec.size) is int and 0 < rec.size <= MAX_BUNDLE_BYTES else MAX_BUNDLE_BYTES
        try:
            data = read_capped(self.fs, path, limit, local=self.local, protocol=self.protocol, timeout=self.timeout)
        except TooLarge:
            raise StoreError(f"{rec.id}: bundle {rec.bundle} is larger than the {limit} bytes its record says "
                             f"(at most {MAX_BUNDLE_BYTES}): refusing it") from None
        except StoreError:
            raise
        except Exception as e:  # noqa: BLE001
            if is_missing(e):
                raise StoreError(f"{rec.id}: its record names {rec.bundle}, which is not in {self}") from None
            raise _fail(self.url, "cannot read", e, self.timeout) from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != rec.sha256:
            raise StoreError(f"{rec.id}: bundle {rec.bundle} has sha256 {digest[:16]}..., not {rec.sha256[:16]}... "
                             "(corrupted or tampered with): refusing it")
        return data

    def marker(self) -> dict:
        """The store's marker: {} where there is none, ``{"unreadable": why}`` where one is there
        but cannot be read as one (truncated, not JSON, over its cap): a store that may be
        sealed - never taken for an unsealed one. Read now, every call (one request or two on
        a remote store), and remembered for ``known_marker``."""
        marker = self._read_marker()
        self._marker = marker  # a fleet's pushes share one Store across threads: each returns its own read
        return marker

    def known_marker(self) -> dict:
        """The marker as this Store last read or wrote it, read now if it has not been. Whether
        a store is there, and in which format, does not change under a command that has seen
        it; whether it is sealed may (another writer seals it while a warm tunes), so every
        write asks that afresh (``check_writable``)."""
        return self._marker if self._marker is not None else self.marker()

    def _read_marker(self) -> dict:
        try:
            data = self.read_small(self.join(MARKER), MAX_MARKER_BYTES, "marker")
        except StoreError as e:
            return {"unreadable": str(e)}
        except Exception as e:  # noqa: BLE001
            if is_missing(e):
                return {}
            if self.local and isinstance(e, OSError):
                return {"unreadable": f"{MARKER}: {e}"}  # a FIFO, a directory, no permission
            raise _fail(self.url, "cannot reach", e, self.timeout) from None
        try:
            d = json.loads(data)
        except (ValueError, RecursionError):
            return {"unreadable": f"{MARKER} is not JSON", "answered": True}
        if not isinstance(d, dict) or type(d.get("format")) is not int or type(d.get("read_only")) is not bool:
            return {"unreadable": f"{MARKER} is not a store marker", "answered": True}
        return d

    # writing ------------------------------------------------------------------------------------
    def put(self, path: str, data: bytes) -> None:
        """Appear whole or not at all: one PUT on an object store; temp name + rename locally.
        A local temp name carries this process's owner token (``tree.locks``: its lock is held
        while we run), so the next writer can prove it dead and remove it (``storehouse``); one
        that fails (a full disk) is removed at once. The only way anything writes an object of
        the store (bundles, records, tombstones, summaries, the marker): never half of one."""
        if self.local:
            directory = posixpath.dirname(path)
            self.fs.makedirs(directory, exist_ok=True)
            token = hold_owner_lock(Path(self.root))
            atomic_write_bytes(Path(path), data, tmp_name=f"{TEMP_PREFIX}{token}-{secrets.token_hex(6)}",
                               step="store.temp_written")
        else:
            bounded(self.fs, self.fs.pipe_file, path, data, timeout=self.timeout, size=len(data))

    def put_marker(self, *, read_only: bool) -> None:
        """Write the store's marker (creating the store, sealing or unsealing it)."""
        marker = {"format": STORE_FORMAT, "read_only": read_only}
        try:
            self.put(self.join(MARKER), json.dumps(marker).encode())
        except Exception as e:  # noqa: BLE001 - backends raise their own types
            raise _fail(self.url, "cannot write to", e, self.timeout) from None
        self._marker = marker

    def release(self) -> None:
        """Drop this process's owner lock in a local store (its temp files are all renamed)."""
        if self.local:
            release_owner_lock(Path(self.root))

    def check_writable(self) -> dict:
        """Refuse to write a store that is sealed, or may be; its marker, read afresh ({}: no
        store yet). Before every write: another writer may have sealed it since we looked."""
        if self.protocol in READ_ONLY_PROTOCOLS:
            raise UsageError(f"{self} is an {self.protocol}:// store: read-only (push to s3://, gs:// or file://)")
        marker = self.marker()
        if "unreadable" in marker:
            raise FiAutotuneError(f"{self}: its marker cannot be read ({marker['unreadable']}), so it may be sealed: "
                                  f"nothing was pushed (restore {MARKER} to push)")
        if marker.get("format", 0) > STORE_FORMAT:
            raise FiAutotuneError(f"{self}: store format {marker['format']} is newer than this fi-autotune: nothing was pushed")
        if marker.get("read_only"):
            raise FiAutotuneError(f"{self} is marked read-only ({MARKER}): nothing was pushed")
        return marker

    def push(self, layout: CacheLayout, bundles: list[tuple[object, bytes | None]], *, seal: bool = False) -> PushResult:
        """Publish ``(entry, bundle bytes)`` pairs: bundle first, then its index record. An entry
        whose bundle is None vanished before it was bundled (``bundle_of``): it is skipped and
        reported, as ``export`` does, and the others are pushed."""
        marker = self.check_writable()
        pushed, unchanged, uploaded, vanished = [], [], 0, []
        try:
            if not marker:
                self.put_marker(read_only=False)
            for entry, data in bundles:
                if data is None:
                    vanished.append(str(entry.id))
                    continue
                sha = hashlib.sha256(data).hexdigest()
                rel = self.bundle_rel(layout.name, entry.id, sha)
                current = self.record(layout.name, entry.id)
                if current is not None and current.sha256 == sha and self.fs.exists(self.join(rel)):
                    unchanged.append(str(entry.id))
                    continue
                # Uploaded even where the name exists without a record naming it: that is an orphan,
                # which a sweep may be removing; a fresh upload is a new file it will not take.
                self.put(self.join(rel), data)
                uploaded += len(data)
                crashpoint("store.bundle_uploaded")
                rec = StoreRecord(
                    layout.name, entry.id, sha, len(data), rel, dict(entry.metadata), entry.model,
                    entry.topology.to_dict() if entry.topology else None, entry.ep, len(entry.rank_files),
                    datetime.now(timezone.utc).isoformat(timespec="seconds"), __version__,
                    entry.manifest.key_fields.to_dict() if entry.manifest else None, entry.status.value,
                )
                self.put(self.record_path(layout.name, entry.id), json.dumps(rec.to_dict(), indent=1).encode())
                pushed.append(str(entry.id))
            if seal:
                self.put_marker(read_only=True)
        except KeyboardInterrupt:
            # Ctrl-C: each entry counted here is whole in the store (its bundle, then its record)
            raise Interrupted(f"interrupted: {plural(len(pushed), 'entry', 'entries')} pushed to {self} before it "
                              f"(whole; `fi-autotune ls {self}` lists them), {len(unchanged)} already there; "
                              "a rerun pushes the rest") from None
        except FiAutotuneError:
            raise
        except Exception as e:  # noqa: BLE001
            raise _fail(self.url, "cannot write to", e, self.timeout) from None
        finally:
            self.release()
        return PushResult(tuple(pushed), tuple(unchanged), uploaded, tuple(vanished))


def bundle_of(layout: CacheLayout, entry) -> bytes | None:
    """The reproducible one-entry bundle ``export`` would write for ``entry``; None when the
    entry vanished since it was listed (a concurrent ``rm`` or ``prune``): skip it, as export does."""
    buf = io.BytesIO()
    result = export_entries(layout, [entry], buf)
    if not result.entries:
        return None
    return buf.getvalue()
