"""An entry's tactics written into FlashInfer's managed store without tuning again: every key
of a complete rank-file entry becomes one store entry, exactly as FlashInfer publishes it, in
the environment the rank files' ``_metadata`` names (see ``store.py`` for the format)."""

from __future__ import annotations

from pathlib import Path

from autotune_cache.autotuner.rankfile import read_regular_file
from autotune_cache.tree.layout_kinds.flashinfer_v2.format import V2Result, merge_rank_files, write_store
from autotune_cache.tree.records import CacheEntry


def write_entry(entry: CacheEntry, to_root: Path) -> tuple[V2Result, dict]:
    """(what was written, key -> v1 value) for one complete entry's rank files under ``to_root``."""
    files = {rf.name: read_regular_file(rf.path) for rf in entry.rank_files if rf.ok}
    metadata, values = merge_rank_files(files)
    return write_store(to_root, metadata, values), values
