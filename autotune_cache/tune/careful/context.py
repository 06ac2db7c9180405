"""A race *in context*: the workload's other ops run, untimed, before every timed run of a candidate.

Why: a 15-20 us GEMM reads differently depending on what ran just before it. At Llama-3.1-70B FP8
TP8 qkv_proj @ 768 (H200) tactic 1 read 1.5-2.6% ahead of FlashInfer's default in races of two or
three candidates and 1.0% ahead to 0.4% behind in races of all nine; careful's race (all nine) read
it 1.0% behind, its floor kept the default, and the reference put that 1.5% behind the best. With the
layer's other three GEMMs run before every timed run - what a forward pass runs between two calls
of qkv_proj - tactic 1 read 2.0% and 1.5% ahead in the two compositions (docs/quality.md, "A race in
context"). One process, one run: so careful races in context only where asked
(``FI_AUTOTUNE_RACE_CONTEXT=1``, ``QualitySettings.race_context``) until the reference has judged it.

The neighbours' lookups miss the race's loaded cache file (another shape), so each runs FlashInfer's
default, as an op with no entry does; FlashInfer logs every such miss, once per file load - that is
once per timed run here - so its logger is held at ERROR while they run.
"""

from __future__ import annotations

import logging


def neighbour_specs(ops: list[dict], index: int) -> list[dict]:
    """The context of op ``index`` in a race spec: every other op of the workload, with the layer
    index the worker builds it under (the same layer its own tunes used)."""
    return [{"layer": j, "op": op} for j, op in enumerate(ops) if j != index]


class Neighbours:
    """The workload's other ops, called one after another at a token count (``race.race``'s
    ``context``). Each op's arguments at a count are built once and reused, so a timed run is
    preceded by the same calls every round."""

    def __init__(self, layers: list, ids: list[str], logger: logging.Logger | None = None):
        self.layers, self.ids = layers, ids
        self.kwargs: dict[tuple[int, int], dict] = {}
        self.logger = logger if logger is not None else _flashinfer_logger()

    def __call__(self, tokens: int) -> None:
        level = self.logger.level
        self.logger.setLevel(logging.ERROR)
        try:
            for j, layer in enumerate(self.layers):
                kw = self.kwargs.get((j, tokens))
                if kw is None:
                    kw = self.kwargs[(j, tokens)] = layer.call_kwargs(tokens)
                layer.api(**kw)
        finally:
            self.logger.setLevel(level)


def _flashinfer_logger() -> logging.Logger:
    try:
        from flashinfer.jit.core import logger
    except ImportError:  # no FlashInfer (a CPU test): the name it registers under
        return logging.getLogger("flashinfer.jit")
    return logger
