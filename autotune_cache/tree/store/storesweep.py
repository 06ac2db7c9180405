"""What killed pushers and deleters leave in a store, and when it may go.

Three kinds of remains, none of which a reader ever sees (readers go by index records only):

- **temp files** of a local store's killed writer (``.tmp-<owner>-<random>``): gone as soon
  as their owner's lock can be taken (``Store.put`` holds it while it writes);
- **orphan bundles**: ``bundles/...<sha256>.tar.gz`` that no index record names, left by a
  push killed between its bundle and its record, or a delete killed between its record and its
  bundle. A bundle only becomes visible through a record, so an orphan may be a push in flight:
  it goes only once no writer can still be publishing it - in a local store, when no other
  owner lock is held; anywhere, once it is older than ``ORPHAN_GRACE_S`` (a push writes its
  record seconds after its bundle). It is re-checked just before it goes: a record naming it
  since, or a new upload of the same name (its size or time changed), keeps it;
- **tombstones** (``deleting/<layout>/<id>.json``): written by a delete before it removes the
  record, removed after the bundle. A tombstone whose record is gone proves that the entry was
  deleted, not mistyped: a re-run of the killed ``rm URL A B C`` reports A "already deleted"
  and goes on. It stays while its bundle does, and goes with it.

The next command that writes the store (``push``, ``warm --push``, ``rm URL``, ``prune URL``,
``push --unseal``) sweeps (``sweep_store``); ``ls URL`` only counts (``survey``). An index
record that cannot be read keeps every bundle of its entry: never delete on a guess.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat as stat_mod
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from autotune_cache.tree.delete import STALE_TEMP_AGE_S
from autotune_cache.tree.layouts.values import EntryId
from autotune_cache.tree.layouts.own_names import LOCKS_DIRNAME
from autotune_cache.tree.crashsafe.locks import dead_owner, other_owner_alive
from autotune_cache.tree.store.store import TEMP_PREFIX, TOMBSTONES, Store
from autotune_cache.tree.store.storeio import LISTING_BYTES, bounded, env_seconds, is_missing
from autotune_cache.tree.store.storerecord import MAX_RECORD_BYTES

#: A bundle no record names goes once this old, whoever may be writing: a push publishes its
#: record seconds after its bundle, so an hour-old orphan is a killed push's or delete's.
ORPHAN_GRACE_S = 3600.0
#: Sets another grace period, in seconds (0 in a maintenance window where no push runs).
GRACE_ENV = "FI_AUTOTUNE_STORE_GRACE"


def orphan_grace() -> float:
    """The grace period: ``FI_AUTOTUNE_STORE_GRACE`` seconds (0 allowed: a maintenance window
    where no push runs), else ``ORPHAN_GRACE_S``."""
    return env_seconds(GRACE_ENV, ORPHAN_GRACE_S, zero_ok=True)


STORE_TEMP_RE = re.compile(rf"^{re.escape(TEMP_PREFIX)}(?:(?P<owner>[0-9a-f]{{12}})-)?[0-9a-f]{{12}}\Z")
_BUNDLE_RE = re.compile(r"^bundles/(?P<layout>[^/]+)/(?P<parts>.+)/(?P<sha>[0-9a-f]{64})\.tar\.gz\Z")


@dataclass(frozen=True)
class Orphan:
    """A bundle no record names."""

    rel: str  # bundles/<layout>/<id...>/<sha>.tar.gz
    size: int
    mtime: float | None  # None: the store does not say (never old enough)
    record_rel: str  # where its entry's record would be


@dataclass(frozen=True)
class Tombstone:
    rel: str
    id: EntryId
    bundle: str | None
    record_present: bool
    mtime: float | None
    bundle_present: bool = False  # in the survey's listing


@dataclass(frozen=True)
class Summary:
    """``deleting/<hex>.json``: the entries one delete took, written once its plan has run and
    removed after its tombstones (a kill while they go leaves this one file saying it all)."""

    rel: str
    ids: tuple[EntryId, ...]
    mtime: float | None


@dataclass(frozen=True)
class Remains:
    """What a sweep would look at; ``sweepable`` counts what it would remove now."""

    orphans: tuple[Orphan, ...] = ()
    tombstones: tuple[Tombstone, ...] = ()
    writers_alive: bool = False
    local: bool = False
    grace: float = ORPHAN_GRACE_S
    summaries: tuple[Summary, ...] = ()
    published: frozenset = frozenset()  # str(EntryId) of every readable record

    def may_go(self, mtime: float | None, now: float) -> bool:
        """No writer can still be publishing it: a local store with no other live owner, or old enough."""
        if self.local and not self.writers_alive:
            return True
        return mtime is not None and now - mtime >= self.grace

    def done_with(self, now: float) -> list:
        """The tombstones and summaries a sweep would remove now (what a delete left once its
        bundles went, or a stale one): a ``prune URL`` re-run with nothing else to do runs for them."""
        stones = [t for t in self.tombstones if (self.may_go(t.mtime, now) if t.record_present else not t.bundle_present)]
        return stones + [s for s in self.summaries if self.may_go(s.mtime, now)]

    def sweepable(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        return sum(self.may_go(o.mtime, now) for o in self.orphans)

    def deleted_by_a_killed_rm(self, ref: str) -> Tombstone | None:
        """The tombstone proving ``ref`` (an id, a key or an id path) was deleted: its record is gone."""
        for t in self.tombstones:
            if not t.record_present and ref in (str(t.id), t.id.path_str, t.id.name):
                return t
        for summary in self.summaries:
            for eid in summary.ids:
                if str(eid) not in self.published and ref in (str(eid), eid.path_str, eid.name):
                    return Tombstone(summary.rel, eid, None, False, summary.mtime)
        return None

    def interrupted_deletes(self) -> set[str]:
        """The ids a killed delete took: each tombstone whose record is gone, and each id of a
        delete summary not published again - the summary alone says it once the tombstones have
        gone (a delete killed at its very end), and both say it before that: counted once."""
        ids = {str(t.id) for t in self.tombstones if not t.record_present}
        for summary in self.summaries:
            ids.update(str(eid) for eid in summary.ids if str(eid) not in self.published)
        return ids

    def to_dict(self, now: float | None = None) -> dict:
        return {"orphan_bundles": len(self.orphans), "orphan_bytes": sum(o.size for o in self.orphans),
                "sweepable": self.sweepable(now), "interrupted_deletes": len(self.interrupted_deletes())}


@dataclass(frozen=True)
class Swept:
    removed: int = 0  # temp files and orphan bundles
    freed: int = 0
    temps: int = 0
    kept_young: int = 0  # orphans a live or recent writer may still be publishing

    def notes(self, store) -> list[str]:
        """What a writer says it swept (one line each)."""
        out = []
        if self.temps:
            out.append(f"removed {self.temps} temp file(s) of an interrupted push from {store}")
        if self.removed - self.temps:
            out.append(f"removed {self.removed - self.temps} bundle(s) no index record names (an interrupted push "
                       f"or delete) from {store}")
        if self.kept_young:
            out.append(f"kept {self.kept_young} bundle(s) no index record names: a push may still be publishing them "
                       f"(they go once {orphan_grace():g} s old; {GRACE_ENV} sets another period)")
        return out


def _mtime(info: dict) -> float | None:
    """The modification time a backend reports: local ``mtime``, s3fs ``LastModified``, gcsfs
    ``updated``; None where it says none (then the bundle is never old enough)."""
    for k in ("mtime", "LastModified", "updated", "last_modified", "timeCreated", "created"):
        v = info.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        if isinstance(v, datetime):
            return v.timestamp()
        if isinstance(v, str):
            try:
                return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def _find(store: Store, top: str) -> dict[str, dict]:
    try:
        found = bounded(store.fs, store.fs.find, store.join(top), detail=True, timeout=store.timeout, size=LISTING_BYTES)
    except FileNotFoundError:
        return {}
    return found if isinstance(found, dict) else {p: {} for p in found}


def survey(store: Store, records: list | None = None, *, tidy: bool = False) -> Remains:
    """The orphan bundles and tombstones of ``store`` (lists ``bundles/``, ``deleting/`` and,
    unless given its ``records``, ``index/``); removes nothing. Bundles are listed first, so
    that a push starting after the listing is not in it; writers are asked for last - with
    ``tidy`` (``sweep_store``'s) dead writers' lock files go on the way; without it (``ls URL``,
    a plan, a dry run) not a file of the store changes."""
    root = store.root + "/"
    bundles = _find(store, "bundles")
    stones = _find(store, TOMBSTONES)
    records = store.records() if records is None else records
    named = {r.bundle for r in records}
    published = {store.record_path(r.layout, r.id)[len(root):]: r for r in records}
    unreadable = set(store.unreadable_paths)
    orphans = []
    for path, info in sorted(bundles.items()):
        rel = path[len(root):] if path.startswith(root) else path
        m = _BUNDLE_RE.match(rel)
        if m is None or rel in named:
            continue  # not one of ours, or published
        *head, last = m["parts"].split("/")
        record_rel = "/".join(("index", m["layout"], *head, f"{last}.json"))
        if store.join(record_rel) in unreadable:
            continue  # its record cannot be read: it may name this bundle
        orphans.append(Orphan(rel, int(info.get("size") or 0), _mtime(info), record_rel))
    tombs, summaries = [], []
    for path, info in sorted(stones.items()):
        rel = path[len(root):] if path.startswith(root) else path
        if not rel.endswith(".json"):
            continue
        if "/" not in rel[len(TOMBSTONES) + 1:]:
            summaries.append(Summary(rel, _summary_ids(store, path), _mtime(info)))
            continue
        layout, id_rel = rel[len(TOMBSTONES) + 1:-len(".json")].split("/", 1)
        record_rel = "/".join(("index", layout, f"{id_rel}.json"))
        if store.join(record_rel) in unreadable:
            continue
        bundle = _tombstone_bundle(store, path, layout, id_rel)
        tombs.append(Tombstone(rel, EntryId(layout, tuple(id_rel.split("/"))), bundle, record_rel in published,
                               _mtime(info), bundle is not None and root + bundle in bundles))
    alive = store.local and other_owner_alive(Path(store.root), tidy=tidy)
    return Remains(tuple(orphans), tuple(tombs), alive, store.local, orphan_grace(), tuple(summaries),
                   frozenset(str(r.id) for r in records))


def _summary_ids(store: Store, path: str) -> tuple[EntryId, ...]:
    try:
        data = json.loads(store.read_small(path, MAX_RECORD_BYTES, "delete summary"))
        return tuple(EntryId(d["layout"], tuple(d["id"])) for d in data["deleted"]
                     if isinstance(d["layout"], str) and all(isinstance(x, str) for x in d["id"]))
    except Exception:  # noqa: BLE001 - unreadable: it proves nothing
        return ()


def write_summary(store: Store, deleted: list) -> str:
    """Record, in one object, the entries a delete took (``Summary``); its path."""
    path = store.join(TOMBSTONES, f"{secrets.token_hex(8)}.json")
    store.put(path, json.dumps({"format": 1, "deleted": [{"layout": e.layout, "id": list(e.parts)}
                                                          for e in deleted]}).encode())
    return path


def _tombstone_bundle(store: Store, path: str, layout: str, id_rel: str) -> str | None:
    """The bundle a tombstone names, if it is one of that entry's bundle names (a tombstone is
    a file anyone could have edited: it never points a delete anywhere else)."""
    try:
        data = json.loads(store.read_small(path, MAX_RECORD_BYTES, "tombstone"))
    except Exception:  # noqa: BLE001 - unreadable: it proves nothing and names nothing
        return None
    bundle = data.get("bundle") if isinstance(data, dict) else None
    if not isinstance(bundle, str):
        return None
    m = _BUNDLE_RE.match(bundle)
    return bundle if m and m["layout"] == layout and m["parts"] == id_rel else None


def sweep_store(store: Store, own: str | None = None) -> Swept:
    """Remove the remains no writer can still be using (module docstring): dead writers' temp
    files, orphan bundles, the tombstones whose bundle is gone or whose record is back, and
    delete summaries (``own``, the caller's, stays: it removes it last). For a command that
    writes the store, after ``check_writable``."""
    temps, freed = sweep_temps(store)
    removed = temps
    # As the command's check_writable read it (or its push wrote it) just before its own writes:
    # no older than a fresh read here would be by the time the sweep's deletes run
    marker = store.known_marker()
    if not marker or "unreadable" in marker:
        return Swept(removed, freed, temps)
    remains = survey(store, tidy=True)
    now = time.time()
    kept = 0
    root = store.root + "/"
    for o in remains.orphans:
        if not remains.may_go(o.mtime, now):
            kept += 1
            continue
        if _still_orphan(store, o) and _rm(store, root + o.rel):
            removed, freed = removed + 1, freed + o.size
    for t in remains.tombstones:
        if t.record_present:
            gone = remains.may_go(t.mtime, now)  # a delete killed before its record went: stale
        else:
            gone = t.bundle is None or not store.fs.exists(root + t.bundle)
        if gone:
            _rm(store, root + t.rel)
    for summary in remains.summaries:  # after the tombstones: while any goes, this still says it all
        if root + summary.rel != own and remains.may_go(summary.mtime, now):
            _rm(store, root + summary.rel)
    return Swept(removed, freed, temps, kept)


def _still_orphan(store: Store, o: Orphan) -> bool:
    """Checked again just before removing: no record names it now, and nobody wrote it since
    the listing (a push of the same entry re-uploads the same name)."""
    try:
        data = store.read_small(store.join(o.record_rel), MAX_RECORD_BYTES, "index record")
        if json.loads(data).get("bundle") == o.rel:
            return False
    except Exception as e:  # noqa: BLE001
        if not is_missing(e):
            return False  # cannot tell: keep it
    try:
        info = store.fs.info(store.join(o.rel))
    except Exception:  # noqa: BLE001 - gone already, or cannot tell
        return False
    return int(info.get("size") or 0) == o.size and _mtime(info) == o.mtime


def _rm(store: Store, path: str) -> bool:
    try:
        store.fs.rm_file(path)
    except Exception as e:  # noqa: BLE001
        return is_missing(e)
    return True


def sweep_temps(store: Store) -> tuple[int, int]:
    """Remove the temp files of killed writers from a file:// store: (files, bytes).

    A temp name carries its writer's owner token, whose lock that writer holds while it runs
    (``Store.put``): a temp whose token's lock we can take is dead, and goes at once, however
    young. An older name has no token: it goes only once older than ``STALE_TEMP_AGE_S``, as the
    tree's temp files do - a push of that age has long finished or died. Object stores have no
    temp files (one PUT)."""
    removed = freed = 0
    for path, size in dead_temps(store, remove=True):
        removed, freed = removed + 1, freed + size
    return removed, freed


def dead_temps(store: Store, remove: bool = False) -> list[tuple[Path, int]]:
    """(path, size) of each temp file of a killed writer in a file:// store (``sweep_temps``),
    removed with ``remove`` (each while its owner's lock is held, so no new owner can take it;
    the dead owner's lock file goes too). Without ``remove`` (a plan, a dry run) it only looks:
    no lock file is made or removed."""
    if not store.local:
        return []
    base = Path(store.root)
    out = []
    now = time.time()
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d != LOCKS_DIRNAME]
        for name in filenames:
            m = STORE_TEMP_RE.match(name)
            path = Path(dirpath) / name
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not m or not stat_mod.S_ISREG(st.st_mode):
                continue
            if m["owner"]:
                with dead_owner(base, m["owner"], tidy=remove) as dead:
                    gone = dead and (not remove or _unlink(path))
            else:
                gone = now - st.st_mtime >= STALE_TEMP_AGE_S and (not remove or _unlink(path))
            if gone:
                out.append((path, st.st_size))
    return out


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
    except OSError:
        return False
    return True
