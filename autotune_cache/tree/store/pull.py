"""``pull``: which of a store's bundles to fetch, whether they suit the target environment, and
their import into the tree, all or none (``Store.push`` is the other direction).

A bundle tuned on another GPU model, or in another software stack than the target's
fingerprint, would be ignored (or worse, used) by the engine there: such bundles are refused
as a whole unless the caller asks for any environment.

Only a bundle's bytes are pinned (by the sha256 in its name); its index record is an editable
JSON file. So what is judged is what the bundle holds, once staged: exactly the one entry the
record names, rank files whose ``_metadata`` agree with the record and with each other, and
that ``_metadata`` - not the record's - against the target environment. Any disagreement
refuses the pull before anything is committed.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.errors import FiAutotuneError
from autotune_cache.tree.store.archive import ImportPlan, ImportResult, import_archives
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId
from autotune_cache.tree.refs import exact_ref, named_by
from autotune_cache.tree.store.store import Store
from autotune_cache.tree.store.storerecord import StoreError, StoreRecord
from autotune_cache.tree.crashsafe.txn import StagedEntry, Transaction


class PullRefused(FiAutotuneError):
    """Bundles for another GPU or environment: nothing was pulled. ``refused``: (record, why)."""

    def __init__(self, message: str, refused: list[tuple[StoreRecord, str]]):
        super().__init__(message)
        self.refused = refused


@dataclass(frozen=True)
class PullResult:
    #: With ``dry_run``: what would be imported, unchanged and refused; nothing was.
    imported: ImportResult
    #: True when neither a fingerprint nor a local GPU could judge the bundles' environment.
    unchecked: bool
    #: (record, why) of the bundles for another environment left out (``only_compatible``).
    left_out: tuple[tuple[StoreRecord, str], ...] = ()


def _id_of(store: Store, layout: CacheLayout, ref: str, listing: list | None) -> tuple[EntryId, list | None]:
    """The id a ref names in the store: a whole id of the layout as given (no listing: it names
    that entry or none), else what the tree's rules (``named_by``: a key, a unique key prefix,
    alone or at the end of an id) make of it against the store's listing, read once."""
    eid = layout.parse_id(exact_ref(ref))
    if eid is not None:
        return eid, listing
    listing = listing if listing is not None else store.records(layout.name)
    matches = named_by(ref, listing, (layout,), where=f" in {store}")
    if not matches:
        raise FiAutotuneError(f"no entry {ref!r} in {store}")
    return matches[0].id, listing


def select_records(store: Store, layout: CacheLayout, refs: tuple[str, ...] = (),
                   ids: list[EntryId] | None = None) -> list[StoreRecord]:
    """The store's records of the entries named by ``ids``, else by ``refs`` (ids, keys or
    unique key prefixes), else every entry of the layout. An entry the store lacks fails."""
    if ids is None and refs:
        ids, listing = [], None
        for ref in refs:
            eid, listing = _id_of(store, layout, ref, listing)
            ids.append(eid)
    if ids is None:
        records = store.records(layout.name)
    else:
        records = []
        for eid in dict.fromkeys(ids):  # once each: ``pull URL A A`` is one entry
            rec = store.record(layout.name, eid)
            if rec is None:
                raise FiAutotuneError(f"no entry {eid} in {store}")
            records.append(rec)
    if not records:
        raise FiAutotuneError(f"nothing to pull: {store} holds no entries")
    return records


def bundle_metadata(staged: StagedEntry) -> dict:
    """The environment a staged bundle was tuned in: its rank files' ``_metadata`` (what the
    engine judges), else its manifest's, as ``CacheEntry.metadata`` reads an entry on disk."""
    if staged.metadata:
        return staged.metadata
    return staged.manifest.flashinfer_metadata if staged.manifest else {}


def bundle_disagreement(rec: StoreRecord, plan: ImportPlan, txn: Transaction) -> str | None:
    """Why the bundle fetched for ``rec`` is not the entry its record describes, or None.

    The index record is a small editable JSON file beside the bundle; only the bundle's bytes
    are checked (sha256). A record edited to name another GPU, another entry's bundle, or a
    bundle holding more than one entry must not decide what lands in the tree."""
    if plan.entries != {rec.id}:
        names = ", ".join(sorted(map(str, plan.entries))) or "nothing"
        return f"its bundle holds {names}, not just {rec.id}"
    staged = txn.staged[rec.id]
    if staged.mixed_metadata:
        return "its bundle's rank files were tuned in different environments (their _metadata differ)"
    if bundle_metadata(staged) != rec.metadata:
        return "its index record's metadata disagrees with its bundle's rank files"
    if rec.rank_files and rec.rank_files != len(staged.records):
        return f"its index record counts {rec.rank_files} rank files, its bundle holds {len(staged.records)}"
    return None


def environment_refusals(judged: list[tuple[StoreRecord, dict]], fingerprint: Fingerprint | None,
                         target_gpu: str | None) -> list[tuple[StoreRecord, str]]:
    """(record, why) for each bundle whose rank files (``metadata``: the bundle's own, never
    the record's) were tuned for another environment than the fingerprint's, or, without one,
    on another GPU model than ``target_gpu``."""
    refused = []
    for rec, metadata in judged:
        gpu = metadata.get("gpu")
        gpu = gpu if isinstance(gpu, str) and gpu not in ("unknown", "None") else None
        if fingerprint is not None:
            verdict = fingerprint.compare(metadata)
            if verdict.stale:
                refused.append((rec, f"tuned for another environment ({verdict.describe()})"))
        elif target_gpu and gpu and gpu != target_gpu:
            refused.append((rec, f"tuned on {gpu}, this machine has {target_gpu}"))
    return refused


#: What a refusal for another environment tells the user to do: take the others, never only
#: ``--any-env`` (which would install the refused ones too).
ONLY_COMPATIBLE_HINT = "--only-compatible pulls the others and leaves these; --any-env pulls them all anyway"


def pull(store: Store, layout: CacheLayout, root, records: list[StoreRecord], *,
         fingerprint: Fingerprint | None = None, local_gpu: str | None = None, any_env: bool = False,
         only_compatible: bool = False, force: bool = False, dry_run: bool = False) -> PullResult:
    """Fetch the bundles of ``records`` (``select_records``, filtered), verify them, and import
    them all or none. Each bundle is staged and judged by what it holds (``bundle_disagreement``,
    then the environment of its rank files) before anything is committed; ``only_compatible``
    leaves out the bundles for another environment instead of refusing them all. The target
    environment is ``fingerprint``'s, else the GPU model ``local_gpu``. ``dry_run`` makes every
    one of these decisions, and the commit's (a conflicting entry), and commits nothing: the
    preview refuses what the pull would refuse."""
    target_gpu = fingerprint.gpu if fingerprint is not None else local_gpu
    left_out: list[tuple[StoreRecord, str]] = []

    def verify(plans: list[ImportPlan], txn: Transaction) -> None:
        for rec, plan in zip(records, plans):
            why = bundle_disagreement(rec, plan, txn)
            if why is not None:
                raise StoreError(f"{rec.id}: {why}: refusing it (the store's index record or bundle was edited); "
                                 "nothing was pulled")
        judged = [(rec, bundle_metadata(txn.staged[rec.id])) for rec in records]
        refused = [] if any_env else environment_refusals(judged, fingerprint, target_gpu)
        if refused and (not only_compatible or len(refused) == len(records)):
            why = ("every one selected is for another GPU or environment (--only-compatible found none to take)"
                   if only_compatible else f"{len(refused)} bundle(s) are for another GPU or environment "
                   f"({ONLY_COMPATIBLE_HINT})")
            raise PullRefused(f"nothing was pulled: {why}", refused)
        for rec, why in refused:
            txn.drop(rec.id)
            left_out.append((rec, why))

    sources = [(io.BytesIO(store.fetch(rec)), f"{store} {rec.id}") for rec in records]
    result = import_archives(layout, root, sources, force=force, check=verify, dry_run=dry_run)
    return PullResult(result, unchecked=fingerprint is None and target_gpu is None and not any_env,
                      left_out=tuple(left_out))
