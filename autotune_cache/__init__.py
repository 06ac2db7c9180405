"""fi-autotune: ahead-of-time FlashInfer autotune caches, laid out exactly where engines look.

This package never imports torch or flashinfer at import time: the cache-tree commands
(ls, show, prune, key, export, import) must start instantly on machines without CUDA.
"""

__version__ = "0.1.0"

from .errors import EntryLocked, FiAutotuneError, UsageError  # noqa: E402
from .keys import SCHEMAS, KeyFields, KeySchema, get_schema  # noqa: E402
from .lm_head import lm_head_stub, lm_head_stubbed  # noqa: E402
from .layout import RankName, Topology, sglang_cache_root  # noqa: E402
from .manifest import Manifest  # noqa: E402
from .scan import CacheEntry, CacheInfo, EntryStatus, scan_cache  # noqa: E402

__all__ = [
    "__version__",
    "CacheEntry",
    "CacheInfo",
    "EntryLocked",
    "EntryStatus",
    "FiAutotuneError",
    "KeyFields",
    "KeySchema",
    "Manifest",
    "RankName",
    "SCHEMAS",
    "Topology",
    "UsageError",
    "get_schema",
    "lm_head_stub",
    "lm_head_stubbed",
    "scan_cache",
    "sglang_cache_root",
]
