"""fi-autotune: ahead-of-time FlashInfer autotune caches, laid out exactly where engines look.

This package never imports torch or flashinfer at import time: the cache-tree commands
(ls, show, prune, rm, key, export, import) must start instantly on machines without CUDA.
"""

__version__ = "0.2.0"

from autotune_cache.errors import EntryLocked, ExitCode, FiAutotuneError, UsageError  # noqa: E402
from autotune_cache.plan.keys import SCHEMAS, KeyFields, KeySchema, get_schema  # noqa: E402
from autotune_cache.engines.layouts import LAYOUTS, CacheLayout, EntryId, default_layout, get_layout  # noqa: E402
from autotune_cache.tune.lm_head import lm_head_stub, lm_head_stubbed  # noqa: E402
from autotune_cache.tree.manifest import Manifest  # noqa: E402
from autotune_cache.tree.scan import CacheEntry, CacheInfo, scan_cache  # noqa: E402
from autotune_cache.tree.status import EntryStatus  # noqa: E402
from autotune_cache.plan.topology import RankName, Topology  # noqa: E402

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
    "scan_cache",
]
