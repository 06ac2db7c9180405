"""``diff --measure``: time each side's tactics for the (op, bucket)s two caches disagree on.

Each changed (op, bucket) is raced on this GPU (``race.py``: interleaved, CUDA-graph replays at
decode sizes, cold L2, median; the token inputs rotating over careful's input draws, an eager
bucket timed over careful's span of the token counts it serves): side A's entries for that call
against side B's, every other lookup of the call left as each side has it. The layer is built from the plan of the entry's
recorded request, exactly as ``warm`` tunes it. Imports torch (the skeleton) when imported, flashinfer
when run; needs a GPU.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

from autotune_cache.errors import UsageError
from autotune_cache.tree.diff import Comparison, op_slots, pick_slots
from autotune_cache.tune.careful.quality import QualitySettings, bucket_span
from autotune_cache.tune.careful.race import race
from autotune_cache.tune.workers.skeleton import OpLayer
from autotune_cache.tune.session.work import distinct_ops


def measure(plan, comparisons: list[tuple[str, Comparison]], *, rounds: int = 50, warmup: int = 5,
            cold_l2: bool = True) -> list[dict]:
    try:
        import torch
        from flashinfer.autotuner import autotune
    except ImportError as e:
        raise UsageError(f"--measure needs torch and flashinfer in this Python ({e})") from None

    if not torch.cuda.is_available():
        raise UsageError("--measure needs a CUDA GPU (this machine has none)")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    ops, _ = distinct_ops(plan)
    lookups = {(op_i, b): op_slots(op, b) for op_i, op in enumerate(ops) for b in op["buckets"]}
    owner = {slot: ib for ib, slots in lookups.items() for slot in slots}
    graph_max = plan.resolution.decode_batch * plan.resolution.attn_dp_size
    careful = QualitySettings("careful")  # careful's own draws, instances and span (their env variables apply here too)
    draws, instances = careful.input_draws, careful.graph_instances
    layers: dict[int, OpLayer] = {}
    rows = []
    with tempfile.TemporaryDirectory(prefix="fi-autotune-measure-") as tmp:
        for label, comp in comparisons:
            groups = sorted({owner.get((c.slot.custom_op, c.slot.profile), (-1, c.slot.tokens or 0)) for c in comp.changes})
            for i, tokens in groups:
                row = {"entry": label, "file": comp.label, "op": ops[i]["id"] if i >= 0 else None, "tokens": tokens}
                if i < 0:
                    rows.append({**row, "error": "not a lookup of the recorded request's plan"})
                    continue
                slots = lookups[(i, tokens)]
                if i not in layers:
                    layers[i] = OpLayer(ops[i], device, seed=i)
                    with autotune(False):
                        layers[i](1)
                span = None if tokens <= graph_max else bucket_span(ops[i].get("bucket_rule"), tokens, careful.span)
                result = race(layers[i], tokens, [pick_slots(comp.a_configs, slots), pick_slots(comp.b_configs, slots)], None,
                              rounds=rounds, warmup=warmup, cold_l2=cold_l2, graph=tokens <= graph_max,
                              workdir=Path(tmp), input_draws=draws, graph_instances=instances, span=span)
                a, b = result["medians_ms"]
                rows.append({**row, "a_ms": _ms(a), "b_ms": _ms(b),
                             "b_vs_a": round(b / a - 1, 4) if math.isfinite(a) and math.isfinite(b) and a > 0 else None,
                             "graph": result["graph"], "runs": max(result["runs"]),
                             "relative_iqr": result["relative_iqr"],
                             **({"errors": result["errors"]} if any(result["errors"]) else {})})
    return rows


def _ms(x: float) -> float | None:
    return round(x, 5) if math.isfinite(x) else None
