"""A race *in context*: the workload's other ops run, untimed, before every timed run of a candidate.

Why: a 15-20 us GEMM reads differently depending on what ran just before it. At Llama-3.1-70B FP8
TP8 qkv_proj @ 768 (H200) tactic 1 read 1.5-2.6% ahead of FlashInfer's default in races of two or
three candidates and 1.0% ahead to 0.4% behind in races of all nine; careful's race (all nine) read
it 1.0% behind, its floor kept the default, and the reference put that 1.5% behind the best. With the
layer's other three GEMMs run before every timed run - what a forward pass runs between two calls
of qkv_proj - tactic 1 read 2.0% and 1.5% ahead in the two compositions (docs/quality.md, "A race in
context"). One process, one run: so careful races in context only where asked
(``FI_AUTOTUNE_RACE_CONTEXT=1``, ``QualitySettings.race_context``) until the reference has judged it.

Which ops are neighbours (``race_contexts``): those that run beside the raced op on every rank
that runs it (its workloads' common ops: a pipeline stage without dense layers gives the MoE no
dense neighbours), counting tokens the same way (``tokens``: a MoE's count is gathered over the DP
ranks, a GEMM's is this rank's, so one count would mean two batch sizes) and in the same phases (two
MLA decode variants, eager and CUDA-graph, never run in one pass). Each is called at the round's
count, clamped to its own ``max_tokens``. Only the dense FP8 GEMMs have been measured this way.

The neighbours' lookups miss the race's loaded cache file (another shape), so each runs FlashInfer's
default, as an op with no entry does; FlashInfer logs every such miss, once per file load - that is
once per timed run here - so those lines alone are dropped while the neighbours run.
"""

from __future__ import annotations

import logging


def race_contexts(ops: list[dict], workloads: list[list[int]]) -> dict[int, list[int]]:
    """Each op's neighbours (module docstring), by index into ``ops``; ``workloads``: each
    workload's op indices. An op with none is absent."""
    out = {}
    for i, op in enumerate(ops):
        mine = [set(w) for w in workloads if i in w]
        common = set.intersection(*mine) - {i} if mine else set()
        near = [j for j in sorted(common) if ops[j].get("tokens") == op.get("tokens")
                and list(ops[j].get("phases") or ()) == list(op.get("phases") or ())]
        if near:
            out[i] = near
    return out


def neighbour_specs(ops: list[dict], indices: list[int]) -> list[dict]:
    """A race spec's ``context``: each neighbour with the layer index the worker builds it under
    (the same layer its own tunes used)."""
    return [{"layer": j, "op": ops[j]} for j in indices]


class _DropMisses(logging.Filter):
    """FlashInfer's "No tuned config covers ..." warning, which every neighbour call would log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "No tuned config covers" not in record.getMessage()


class Neighbours:
    """The workload's other ops, called one after another at a token count (``race.race``'s
    ``context``), each clamped to its ``caps`` entry. Each op's arguments at a count are built
    once and reused, so a timed run is preceded by the same calls every round."""

    def __init__(self, layers: list, ids: list[str], caps: list[int | None] | None = None,
                 logger: logging.Logger | None = None):
        self.layers, self.ids = layers, ids
        self.caps = caps if caps is not None else [None] * len(layers)
        self.kwargs: dict[tuple[int, int], dict] = {}
        self.logger = logger if logger is not None else _flashinfer_logger()
        self._drop = _DropMisses()

    def __call__(self, tokens: int) -> None:
        self.logger.addFilter(self._drop)
        try:
            for j, layer in enumerate(self.layers):
                m = tokens if self.caps[j] is None else min(tokens, self.caps[j])
                kw = self.kwargs.get((j, m))
                if kw is None:
                    kw = self.kwargs[(j, m)] = layer.call_kwargs(m)
                layer.api(**kw)
        finally:
            self.logger.removeFilter(self._drop)


def _flashinfer_logger() -> logging.Logger:
    try:
        from flashinfer.jit.core import logger
    except ImportError:  # no FlashInfer (a CPU test): the name it registers under
        return logging.getLogger("flashinfer.jit")
    return logger
