"""vLLM 0.33 as an engine: per-rank files keyed by vLLM's own config hash."""

from __future__ import annotations

from autotune_cache.engines.base import Engine
from autotune_cache.engines.vllm.layout import VllmDirLayout, VllmLayout


class Vllm(Engine):
    name = "vllm"
    title = "vLLM 0.33"

    def __init__(self) -> None:
        self._layouts = (VllmLayout(), VllmDirLayout())

    @property
    def layouts(self):
        return self._layouts


ENGINE = Vllm()
