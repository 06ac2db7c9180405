"""What follows a warm's write: the same tuning in FlashInfer's own store (``--layout
flashinfer-v2``) and the entry pushed to a store (``--push``) - from one scan of the entry."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune_cache.autotuner.rankfile import read_regular_file
from autotune_cache.engines.flashinfer_v2.store import V2Result, merge_rank_files, write_store
from autotune_cache.registry import get_layout
from autotune_cache.errors import UsageError
from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tree.scan import CacheEntry, scan_entry
from autotune_cache.tree.store import PushResult, Store, bundle_of, is_store_url

#: The layouts a warm writes; flashinfer-v2 is written from the sglang tuning.
WARM_LAYOUTS = ("sglang", "flashinfer-v2", "vllm", "vllm-dir")


def writable_store(url: str | None) -> Store | None:
    """The --push store, checked before any tuning (a typo costs nothing then)."""
    if url is None:
        return None
    if not is_store_url(url):
        raise UsageError(f"--push {url!r}: give a store URL (s3://, gs://, file://)")
    store = Store(url)
    store.check_writable()
    return store


def written_entry(plan: TuningPlan) -> CacheEntry:
    """The entry a warm of ``plan`` wrote (or found complete), scanned once for what follows."""
    return scan_entry(plan.layout_obj, plan.key_dir, plan.entry_id)


def write_v2(entry: CacheEntry, to_root: Path | None = None) -> tuple[V2Result, dict]:
    """A complete SGLang entry written into FlashInfer's managed store (default: its own root);
    the values written (``convert`` warns about those without a measurement policy)."""
    files = {rf.name: read_regular_file(rf.path) for rf in entry.rank_files if rf.ok}
    metadata, values = merge_rank_files(files)
    root = to_root if to_root is not None else get_layout("flashinfer-v2").default_root().path
    return write_store(root, metadata, values), values


def push_entry(store: Store, plan: TuningPlan, entry: CacheEntry) -> PushResult:
    """One written entry to the store (bundle first, then its record)."""
    layout = plan.layout_obj
    return store.push(layout, [(entry, bundle_of(layout, entry))])


@dataclass(frozen=True)
class Published:
    v2: V2Result | None = None
    pushed: PushResult | None = None


def publish(plan: TuningPlan, layouts: tuple[str, ...], store: Store | None) -> Published:
    """After a single warm: v2 if asked for, then the push (errors raise: the entry stays written)."""
    if "flashinfer-v2" not in layouts and store is None:
        return Published()
    entry = written_entry(plan)
    v2 = write_v2(entry)[0] if "flashinfer-v2" in layouts else None
    return Published(v2, push_entry(store, plan, entry) if store is not None else None)
