"""fi-autotune: ahead-of-time FlashInfer autotune caches, laid out exactly where engines look.

This package never imports torch or flashinfer at import time: the cache-tree commands
(ls, show, prune, rm, key, export, import) must start instantly on machines without CUDA.
"""

import importlib

from autotune_cache.version import __version__

#: The public names and the module each lives in, imported when first asked for (PEP 562): importing
#: one module of the package (``autotune_cache.errors``, as the console entry point does first)
#: runs no other, so a Ctrl-C in the first milliseconds lands in our own guard, and a library user
#: pays for the names used.
_EXPORTS = {
    "EntryLocked": "autotune_cache.errors", "ExitCode": "autotune_cache.errors",
    "FiAutotuneError": "autotune_cache.errors", "UsageError": "autotune_cache.errors",
    "KeyFields": "autotune_cache.plan.entry_key", "KeySchema": "autotune_cache.plan.entry_key",
    "get_schema": "autotune_cache.plan.entry_key", "key_schemas": "autotune_cache.plan.entry_key",
    "default_layout": "autotune_cache.registry", "get_layout": "autotune_cache.registry",
    "layouts": "autotune_cache.registry",
    "CacheLayout": "autotune_cache.tree.layouts.base", "EntryId": "autotune_cache.tree.layouts.values",
    "lm_head_stub": "autotune_cache.tune.workers.lm_head", "lm_head_stubbed": "autotune_cache.tune.workers.lm_head",
    "Manifest": "autotune_cache.tree.manifest",
    "CacheEntry": "autotune_cache.tree.scanner.scan", "CacheInfo": "autotune_cache.tree.scanner.scan",
    "scan_cache": "autotune_cache.tree.scanner.scan",
    "EntryStatus": "autotune_cache.tree.status",
    "RankName": "autotune_cache.plan.topology", "Topology": "autotune_cache.plan.topology",
}

__all__ = sorted(["__version__", "LAYOUTS", "SCHEMAS", *_EXPORTS])


def __getattr__(name: str):
    """A public name, from its module (``_EXPORTS``); ``LAYOUTS``, the layouts by name, and
    ``SCHEMAS``, every engine's key schemas by name, as the registry knows them (read when asked:
    the registry imports no engine until someone wants one)."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name == "LAYOUTS":
        return importlib.import_module("autotune_cache.registry").layouts()
    if name == "SCHEMAS":
        return importlib.import_module("autotune_cache.plan.entry_key").key_schemas()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
