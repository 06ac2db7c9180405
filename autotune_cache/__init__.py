"""fi-autotune: ahead-of-time FlashInfer autotune caches, laid out exactly where engines look.

This package never imports torch or flashinfer at import time: the cache-tree commands
(ls, show, prune, rm, key, export, import) must start instantly on machines without CUDA.
"""

__version__ = "0.2.0"

from .errors import EntryLocked, ExitCode, FiAutotuneError, UsageError  # noqa: E402
from .keys import SCHEMAS, KeyFields, KeySchema, get_schema  # noqa: E402
from .layouts import LAYOUTS, CacheLayout, EntryId, default_layout, get_layout  # noqa: E402
from .lm_head import lm_head_stub, lm_head_stubbed  # noqa: E402
from .manifest import Manifest  # noqa: E402
from .scan import CacheEntry, CacheInfo, scan_cache  # noqa: E402
from .status import EntryStatus  # noqa: E402
from .topology import RankName, Topology  # noqa: E402

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
