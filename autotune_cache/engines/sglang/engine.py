"""SGLang 0.5.23 as an engine: its tree, its key, its startup autotune pass."""

from __future__ import annotations

from autotune_cache.engines.base import Engine
from autotune_cache.engines.sglang.layout import SGLangLayout


class SGLang(Engine):
    name = "sglang"
    title = "SGLang 0.5.23"

    def __init__(self) -> None:
        self._layouts = (SGLangLayout(),)

    @property
    def layouts(self):
        return self._layouts


ENGINE = SGLang()
