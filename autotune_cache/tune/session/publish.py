"""What follows a warm's write: the same tuning in the layouts written from it (those its own
layout lists in ``convert_targets``: ``--layout sglang,flashinfer-v2``) and the entry pushed to a
store (``--push``) - from one scan of the entry."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autotune_cache.registry import get_layout
from autotune_cache.errors import UsageError
from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tree.scanner.scan import CacheEntry, scan_entry
from autotune_cache.tree.store.store import PushResult, Store, bundle_of
from autotune_cache.tree.store.storesweep import sweep_store
from autotune_cache.tree.store.storerecord import is_store_url


def writable_store(url: str | None) -> Store | None:
    """The --push store, checked before any tuning (a typo costs nothing then)."""
    if url is None:
        return None
    if not is_store_url(url):
        raise UsageError(f"--push {url!r}: give a store URL (s3://, gs://, file://)")
    store = Store(url)
    store.check_writable()
    sweep_store(store)  # what killed pushers and deleters left, once no writer can be using it (``storesweep``)
    return store


def written_entry(plan: TuningPlan) -> CacheEntry:
    """The entry a warm of ``plan`` wrote (or found complete), scanned once for what follows."""
    return scan_entry(plan.layout_obj, plan.key_dir, plan.entry_id)


def derived(plan: TuningPlan, layouts: tuple[str, ...]) -> tuple[str, ...]:
    """The layouts of ``layouts`` written from the plan's entry: all but its own (and but the one
    asked for, where the engine reads another: a single-rank vLLM's managed store)."""
    own = {plan.layout, plan.request.engine.layout if plan.request is not None else plan.layout}
    return tuple(name for name in layouts if name not in own)


def write_derived(entry: CacheEntry, name: str, to_root: Path | None = None):
    """A complete entry written into the layout ``name`` (default: under that layout's own root):
    what was written (a result with ``to_dict``)."""
    layout = get_layout(name)
    return layout.convert_into(entry, to_root if to_root is not None else layout.default_root().path)[0]


def push_entry(store: Store, plan: TuningPlan, entry: CacheEntry) -> PushResult:
    """One written entry to the store (bundle first, then its record)."""
    layout = plan.layout_obj
    result = store.push(layout, [(entry, bundle_of(layout, entry))])
    sweep_store(store)  # the bundle a new record replaced (the entry pushed again with other bytes)
    return result


@dataclass(frozen=True)
class Published:
    converted: dict = field(default_factory=dict)  # layout name -> what was written there
    pushed: PushResult | None = None


def publish(plan: TuningPlan, layouts: tuple[str, ...], store: Store | None) -> Published:
    """After a single warm: the derived layouts, then the push (errors raise: the entry stays written)."""
    names = derived(plan, layouts)
    if not names and store is None:
        return Published()
    entry = written_entry(plan)
    converted = {name: write_derived(entry, name) for name in names}
    return Published(converted, push_entry(store, plan, entry) if store is not None else None)
