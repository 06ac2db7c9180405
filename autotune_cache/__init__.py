"""fi-autotune: ahead-of-time FlashInfer autotune caches, laid out exactly where engines look.

This package never imports torch or flashinfer at import time: the cache-tree commands
(ls, show, prune, rm, key, export, import) must start instantly on machines without CUDA.
"""

from autotune_cache.version import __version__
from autotune_cache.errors import EntryLocked, ExitCode, FiAutotuneError, UsageError
from autotune_cache.plan.entry_key import KeyFields, KeySchema, get_schema, key_schemas
from autotune_cache.registry import default_layout, get_layout, layouts
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId
from autotune_cache.tune.workers.lm_head import lm_head_stub, lm_head_stubbed
from autotune_cache.tree.manifest import Manifest
from autotune_cache.tree.scanner.scan import CacheEntry, CacheInfo, scan_cache
from autotune_cache.tree.status import EntryStatus
from autotune_cache.plan.topology import RankName, Topology

__all__ = [
    "__version__",
    "CacheEntry",
    "CacheInfo",
    "CacheLayout",
    "EntryId",
    "EntryLocked",
    "EntryStatus",
    "ExitCode",
    "FiAutotuneError",
    "KeyFields",
    "KeySchema",
    "LAYOUTS",
    "Manifest",
    "RankName",
    "SCHEMAS",
    "Topology",
    "UsageError",
    "default_layout",
    "get_layout",
    "get_schema",
    "lm_head_stub",
    "lm_head_stubbed",
    "layouts",
    "scan_cache",
]


def __getattr__(name: str):
    """``LAYOUTS``, the layouts by name, and ``SCHEMAS``, every engine's key schemas by name, as
    the registry knows them (read when asked: the registry imports no engine until someone wants one)."""
    if name == "LAYOUTS":
        return layouts()
    if name == "SCHEMAS":
        return key_schemas()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
