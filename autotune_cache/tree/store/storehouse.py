"""Store housekeeping: ``rm`` and ``prune`` of a store's entries, and unsealing (what killed
writers and deleters left: ``storesweep``).

Deleting from a store is plan-then-delete, as in the tree (``delete.py``): the plan lists the
index records the filters or names select; executing it re-reads each record and removes it
only if it still names the bundle the plan showed (a push since then wins): *tombstone, record,
bundle*, so a reader never meets a record whose bundle is gone; the tombstones go once every
entry of the plan has (the sweep that ends the command). A kill leaves the tombstone of every
entry already taken - and, between record and bundle, an unreferenced bundle no reader sees -
so a re-run of the same ``rm`` reports those entries "already deleted" and finishes; the next
writer sweeps the rest. A sealed store (or one whose marker cannot be
read, so may be sealed) is never written: ``unseal`` first.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.humanize import format_size
from autotune_cache.registry import get_layout
from autotune_cache.tree.crashsafe.faults import crashpoint
from autotune_cache.tree.delete import Candidate, DeleteResult
from autotune_cache.tree.refs import named_by
from autotune_cache.tree.select import EntryFilter
from autotune_cache.tree.status import EntryStatus
from autotune_cache.tree.store.store import MARKER, STORE_FORMAT, Store
from autotune_cache.tree.store.storerecord import StoreRecord
from autotune_cache.tree.store.storesweep import Remains, dead_temps, survey, sweep_store, write_summary

@dataclass(frozen=True)
class RecordView:
    """An index record seen as a tree entry, so that the tree's filters (``EntryFilter``) and
    the deletion output read it unchanged: modified = pushed, last use unknown."""

    record: StoreRecord
    status: EntryStatus

    @property
    def id(self):
        return self.record.id

    layout = property(lambda self: self.record.layout)
    model = property(lambda self: self.record.model)
    flashinfer_version = property(lambda self: self.record.flashinfer_version)
    arch = property(lambda self: self.record.arch)
    size_on_disk = property(lambda self: self.record.size)
    size_on_disk_str = property(lambda self: format_size(self.record.size))
    last_used = None

    @property
    def gpu_short(self) -> str:
        g = self.record.gpu
        return g.removeprefix("NVIDIA ").replace(" ", "-") if g else "-"

    @property
    def last_modified(self) -> float | None:
        try:
            return datetime.fromisoformat(self.record.pushed).timestamp()
        except (TypeError, ValueError):
            return None  # an unknown push time is never "older than" anything

    def to_dict(self) -> dict:
        return {**self.record.to_dict(), "status": self.status.value}


def record_views(records: list[StoreRecord], fingerprint=None) -> list[RecordView]:
    """Each record with its status: as pushed, or stale where ``fingerprint`` (``--env-from``)
    says the serving image's FlashInfer would ignore it."""
    out = []
    for r in records:
        status = EntryStatus(r.status_of)
        if fingerprint is not None and fingerprint.compare(r.metadata).stale:
            status = EntryStatus.STALE
        out.append(RecordView(r, status))
    return out


def require_store_filters(flt: EntryFilter) -> None:
    """A store keeps no access time: ``--unused-for`` would select nothing, or on a guess."""
    if flt.unused_for is not None:
        raise UsageError("a store does not record when an entry was last used: --unused-for works on a tree only "
                         "(--older-than selects by push time)")


class StoreListing:
    """``ls URL``: a store's published entries (its index records), the records it could not read
    (``store.unreadable``, to be said before anything is judged), then, from ``views``, the
    entries the filters select, each judged as ``ls`` judges one (stale against ``env_from``'s
    fingerprint), and from ``remains`` what an interrupted push or delete left (counted, never
    swept: ``ls`` only reads)."""

    def __init__(self, url: str, flt: EntryFilter, env_from: str | None):
        require_store_filters(flt)
        self.store = Store(url)
        self.records = self.store.records()
        self._flt, self._env_from = flt, env_from

    def views(self, now: float) -> list[RecordView]:
        fp = Fingerprint.load(self._env_from) if self._env_from else None
        return sorted((v for v in record_views(self.records, fp) if self._flt.reasons(v, now) is not None),
                      key=lambda v: str(v.id))

    def remains(self) -> Remains:
        return survey(self.store, self.records)


@dataclass(frozen=True)
class StoreDeletePlan:
    """What ``rm URL`` / ``prune URL`` would delete; the shape of ``delete.DeletePlan`` so the
    CLI prints and confirms both alike."""

    store: Store
    candidates: tuple[Candidate, ...]
    left_alone: tuple[tuple[str, str], ...] = ()
    remains: Remains = Remains()
    #: Named entries a killed delete had already taken (their tombstone, no record).
    already_deleted: tuple[str, ...] = ()
    #: What the run would sweep (``store_leftovers``), found once when the plan is made: read
    #: for ``empty`` and again for printing, it must neither walk the store twice nor change
    #: between the two.
    leftovers: tuple = ()

    @property
    def empty(self) -> bool:
        """Nothing to run: no entry to delete, no killed delete to finish, no orphan to sweep."""
        return not (self.candidates or self.already_deleted or self.leftovers)

    @property
    def expected_freed_size_str(self) -> str:
        return format_size(sum(c.freed for c in self.candidates))

    def to_dict(self) -> dict:
        return {"store": str(self.store), "entries": [{**c.entry.to_dict(), "reasons": list(c.reasons)}
                                                      for c in self.candidates],
                "left_alone": [{"entry": e, "reason": r} for e, r in self.left_alone],
                "already_deleted": list(self.already_deleted), "remains": self.remains.to_dict(),
                "expected_freed_size": sum(c.freed for c in self.candidates)}

    def check_writable(self) -> None:
        check_deletable(self.store)

    def execute(self) -> DeleteResult:
        check_deletable(self.store)
        deleted, skipped, errors = [], list(self.left_alone), []
        own = None
        try:
            for cand in self.candidates:
                why = delete_record(self.store, cand.entry.record)
                if why is None:
                    deleted.append((str(cand.entry.id), cand.freed))
                elif why.startswith("!"):
                    errors.append((str(cand.entry.id), why[1:]))
                else:
                    skipped.append((str(cand.entry.id), why))
            taken = [c.entry.id for c in self.candidates if any(str(c.entry.id) == d for d, _ in deleted)]
            own = write_summary(self.store, taken) if taken else None  # the tombstones go next
            crashpoint("store.summary_written")
            swept = sweep_store(self.store, own)
            crashpoint("store.swept")
        finally:
            self.store.release()
        if own is not None:  # last of all, after the owner lock: a kill before it leaves the whole proof
            with contextlib.suppress(FileNotFoundError):
                self.store.fs.rm_file(own)
        return DeleteResult(tuple(deleted), tuple(skipped), tuple(errors), swept.removed, swept.freed)


def check_deletable(store: Store) -> None:
    """Refuse to delete from a sealed store, or one that may be (its marker unreadable)."""
    try:
        store.check_writable()
    except FiAutotuneError as e:
        raise FiAutotuneError(str(e).replace("nothing was pushed", "nothing was deleted")
                              + ("" if "read-only" not in str(e) else
                                 f" (`fi-autotune push --unseal {store}` makes it writable)")) from None


def delete_record(store: Store, rec: StoreRecord) -> str | None:
    """Delete one published entry if its record still names ``rec``'s bundle: the record
    first, then the bundle. None when deleted; else why it stayed ("!..." for an error)."""
    try:
        now = store.record(rec.layout, rec.id)
    except FiAutotuneError as e:
        return f"!{e}"
    if now is None:
        return "already deleted"
    if now.sha256 != rec.sha256:
        return "pushed again since the plan was made"
    tombstone = store.tombstone_path(rec.layout, rec.id)
    try:
        store.put(tombstone, json.dumps({"format": 1, "bundle": rec.bundle, "sha256": rec.sha256,
                                          "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}).encode())
        crashpoint("store.tombstone_written")
        store.fs.rm_file(store.record_path(rec.layout, rec.id))
        crashpoint("store.record_removed")
        with contextlib.suppress(FileNotFoundError):
            store.fs.rm_file(store.root + "/" + rec.bundle)
        crashpoint("store.bundle_removed")
        # The tombstone stays until the whole plan has run (the sweep that ends ``execute``
        # takes it): a re-run of a command killed at a later entry still knows this one went.
    except Exception as e:  # noqa: BLE001 - backends raise their own types
        return f"!cannot delete from {store}: {type(e).__name__}: {str(e).strip()[:200]}"
    return None


def plan_store_delete(store: Store, flt: EntryFilter | None = None, refs: tuple[str, ...] = (),
                      fingerprint=None, now: float | None = None) -> StoreDeletePlan:
    """The records ``refs`` name (ids, keys or unique key prefixes, by the tree's own rules,
    ``named_by``: an unknown or ambiguous one fails before anything), or those matching every
    filter of ``flt`` (at least one given)."""
    store.require()
    records = store.records()
    if refs:
        remains = survey(store, records)
        views = record_views(records, fingerprint)
        held = [get_layout(name) for name in dict.fromkeys(v.layout for v in views)]
        picked, resumed = [], []
        for ref in refs:
            matches = named_by(ref, views, held, where=f" in {store}")
            if not matches:
                stone = remains.deleted_by_a_killed_rm(ref)
                if stone is None:
                    raise FiAutotuneError(f"no entry {ref!r} in {store}", hint=f"`fi-autotune ls {store}` lists them")
                if str(stone.id) not in resumed:
                    resumed.append(str(stone.id))
                continue
            if matches[0] not in [c.entry for c in picked]:
                picked.append(Candidate(matches[0], ("named",)))
        return StoreDeletePlan(store, tuple(picked), _unreadable(store), remains, tuple(resumed),
                               store_leftovers(store, remains))
    if flt is None or flt.empty:
        raise UsageError("nothing selected: give at least one of --older-than, --flashinfer-version, --status, "
                         "--model, --arch (or name entries with rm)")
    require_store_filters(flt)
    now = time.time() if now is None else now
    cands = [Candidate(v, why) for v in record_views(records, fingerprint)
             if (why := flt.reasons(v, now)) is not None]
    remains = survey(store, records)
    return StoreDeletePlan(store, tuple(cands), _unreadable(store), remains, leftovers=store_leftovers(store, remains, now))


def store_leftovers(store: Store, remains: Remains, now: float | None = None) -> tuple:
    """Bundles no record names, tombstones and summaries of finished deletes, and dead
    writers' temp files, that a run would remove now (as the tree's leftovers). Looks only:
    a plan is made by a dry run too (no lock file is tidied, ``dead_temps``)."""
    now = time.time() if now is None else now
    return (tuple(o for o in remains.orphans if remains.may_go(o.mtime, now))
            + tuple(remains.done_with(now)) + tuple(dead_temps(store)))


def _unreadable(store: Store) -> tuple[tuple[str, str], ...]:
    """Records that could not be read are never deleted on a guess: named, left alone."""
    return tuple(("an index record", line) for line in store.unreadable)


def unseal(store: Store) -> bool:
    """Mark a sealed store writable again (the inverse of ``push --read-only``); False when it
    was not sealed. A marker that cannot be read is not overwritten: it may say more than we
    know (a newer format)."""
    marker = store.require(fresh=True)  # whether it is sealed now
    if "unreadable" in marker:
        raise FiAutotuneError(f"{store}: its marker cannot be read ({marker['unreadable']}): not unsealing "
                              f"on a guess (restore {MARKER} first)")
    if not marker.get("read_only"):
        return False
    if marker["format"] > STORE_FORMAT:
        raise FiAutotuneError(f"{store}: store format {marker['format']} is newer than this fi-autotune")
    try:
        store.put_marker(read_only=False)
    finally:
        store.release()
    sweep_store(store)
    return True
