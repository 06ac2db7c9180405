"""FlashInfer's own managed autotune store (``flashinfer.autotune_v2``) as an engine: written
from another engine's tuned entry, read by any engine that enters ``autotune_v2``."""

from __future__ import annotations

from autotune_cache.plan.engine import Engine
from autotune_cache.tree.layouts.flashinfer_v2.layout import LAYOUT


class FlashInferV2(Engine):
    name = "flashinfer-v2"
    label = "FlashInfer"
    title = "FlashInfer's managed store"
    checks = True
    plans = False

    layouts = (LAYOUT,)


ENGINE = FlashInferV2()
