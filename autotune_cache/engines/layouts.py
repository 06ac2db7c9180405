"""Engine cache layouts: one module per engine, one registry (see ``base.CacheLayout``)."""

from __future__ import annotations

from autotune_cache.errors import UsageError
from autotune_cache.tree.layout import DEFAULT_LAYOUT_NAME, CacheLayout, EntryId, NameKind, RootChoice
from autotune_cache.engines.flashinfer_v2.layout import FlashInferV2Layout
from autotune_cache.engines.sglang.layout import SGLangLayout
from autotune_cache.engines.vllm.layout import VllmDirLayout, VllmLayout

#: The layout a bare id (``<version>/<arch>/<key>``) and ``--cache-dir`` refer to.
DEFAULT_LAYOUT = DEFAULT_LAYOUT_NAME

LAYOUTS: dict[str, CacheLayout] = {
    layout.name: layout for layout in (SGLangLayout(), FlashInferV2Layout(), VllmLayout(), VllmDirLayout())
}


def get_layout(name: str) -> CacheLayout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise UsageError(f"unknown layout {name!r}; known: {', '.join(sorted(LAYOUTS))}") from None


def default_layout() -> CacheLayout:
    return LAYOUTS[DEFAULT_LAYOUT]


__all__ = ["CacheLayout", "DEFAULT_LAYOUT", "EntryId", "LAYOUTS", "NameKind", "RootChoice", "default_layout", "get_layout"]
