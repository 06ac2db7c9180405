"""``pull``: which of a store's bundles to fetch, whether they suit the target environment, and
their import into the tree, all or none (``Store.push`` is the other direction).

A bundle tuned on another GPU model, or in another software stack than the target's
fingerprint, would be ignored (or worse, used) by the engine there: such bundles are refused
as a whole unless the caller asks for any environment.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.tree.archive import ImportResult, import_archives
from autotune_cache.tree.layout import CacheLayout, EntryId
from autotune_cache.tree.store import Store, StoreRecord


class PullRefused(FiAutotuneError):
    """Bundles for another GPU or environment: nothing was pulled. ``refused``: (record, why)."""

    def __init__(self, message: str, refused: list[tuple[StoreRecord, str]]):
        super().__init__(message)
        self.refused = refused


@dataclass(frozen=True)
class PullResult:
    imported: ImportResult
    #: True when neither a fingerprint nor a local GPU could judge the bundles' environment.
    unchecked: bool


def _id_of(store: Store, layout: CacheLayout, ref: str, listing: list | None) -> tuple[EntryId, list | None]:
    """The id a ref names in the store: an id of the layout, or a bare key naming one entry."""
    eid = layout.parse_id(ref)
    if eid is not None:
        return eid, listing
    listing = listing if listing is not None else store.records(layout.name)
    matches = [r.id for r in listing if r.id.name == ref]
    if len(matches) > 1:
        raise UsageError(f"{ref!r} names {len(matches)} entries in {store}; give one id: "
                         + ", ".join(map(str, matches)))
    if not matches:
        raise FiAutotuneError(f"no entry {ref!r} in {store}")
    return matches[0], listing


def select_records(store: Store, layout: CacheLayout, refs: tuple[str, ...] = (),
                   ids: list[EntryId] | None = None) -> list[StoreRecord]:
    """The store's records of the entries named by ``ids``, else by ``refs`` (ids or unique bare
    keys), else every entry of the layout. An entry the store lacks fails."""
    if ids is None and refs:
        ids, listing = [], None
        for ref in refs:
            eid, listing = _id_of(store, layout, ref, listing)
            ids.append(eid)
    if ids is None:
        records = store.records(layout.name)
    else:
        records = []
        for eid in ids:
            rec = store.record(layout.name, eid)
            if rec is None:
                raise FiAutotuneError(f"no entry {eid} in {store}")
            records.append(rec)
    if not records:
        raise FiAutotuneError(f"nothing to pull: {store} holds no entries")
    return records


def environment_refusals(records: list[StoreRecord], fingerprint: Fingerprint | None,
                         target_gpu: str | None) -> list[tuple[StoreRecord, str]]:
    """(record, why) for each bundle tuned for another environment than the fingerprint's, or,
    without one, on another GPU model than ``target_gpu``."""
    refused = []
    for rec in records:
        if fingerprint is not None:
            verdict = fingerprint.compare(rec.metadata)
            if verdict.stale:
                refused.append((rec, f"tuned for another environment ({verdict.describe()})"))
        elif target_gpu and rec.gpu and rec.gpu != target_gpu:
            refused.append((rec, f"tuned on {rec.gpu}, this machine has {target_gpu}"))
    return refused


def pull(store: Store, layout: CacheLayout, root, *, refs: tuple[str, ...] = (), ids: list[EntryId] | None = None,
         fingerprint: Fingerprint | None = None, local_gpu: str | None = None, any_env: bool = False,
         force: bool = False) -> PullResult:
    """Fetch the selected bundles (``select_records``), verify them, and import them all or none.
    The target environment is ``fingerprint``'s, else the GPU model ``local_gpu``."""
    records = select_records(store, layout, refs, ids)
    target_gpu = fingerprint.gpu if fingerprint is not None else local_gpu
    refused = environment_refusals(records, fingerprint, target_gpu)
    if refused and not any_env:
        raise PullRefused(f"nothing was pulled: {len(refused)} bundle(s) are for another GPU or environment "
                          "(--any-env pulls them anyway)", refused)
    sources = [(io.BytesIO(store.fetch(rec)), f"{store} {rec.id}") for rec in records]
    result = import_archives(layout, root, sources, force=force)
    return PullResult(result, unchecked=fingerprint is None and target_gpu is None and not any_env)
