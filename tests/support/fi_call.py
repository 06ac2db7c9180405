"""One ``cutlass_fused_moe`` call as data: a recipe's arguments materialized (empty CPU tensors of
the right shapes and dtypes) and bound to FlashInfer's own signature with its defaults filled in,
so two calls compare argument by argument - everything FlashInfer's cache key is made of.
Needs torch and FlashInfer (CPU is enough), not vLLM."""

import enum
import importlib
import inspect

import torch
from flashinfer.fused_moe import cutlass_fused_moe

from autotune_cache.autotuner.recipe import token_dim


def materialize(v, m: int):
    """An fi-autotune recipe value (``recipes.encode``) as the object the worker passes."""
    if isinstance(v, list):
        return [materialize(x, m) for x in v]
    if isinstance(v, dict) and "tensor" in v:
        t = v["tensor"]
        return torch.empty([token_dim(d, m) for d in t["shape"]], dtype=getattr(torch, t["dtype"]))
    if isinstance(v, dict) and "dtype" in v:
        return getattr(torch, v["dtype"])
    if isinstance(v, dict) and "enum" in v:
        module, cls, member = v["enum"].rsplit(".", 2)
        return getattr(getattr(importlib.import_module(module), cls), member)
    return v


def bound(kwargs: dict) -> dict:
    """Every parameter of ``cutlass_fused_moe`` as this call sets it (defaults included), as JSON."""
    b = inspect.signature(cutlass_fused_moe).bind(**kwargs)
    b.apply_defaults()
    return {k: plain(v) for k, v in b.arguments.items()}


def plain(v):
    if isinstance(v, torch.Tensor):
        return [list(v.shape), str(v.dtype)]
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, enum.Enum):
        return int(v.value)
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v


