"""The skeleton model warm and verify run: one layer per distinct op, plus an LM head.

Built from a plan's encoded recipes (the JSON ``plan --json`` prints), with synthetic weights in
the exact dtypes, layouts and scale formats each call takes. Values are finite by construction:
FP8 data is cast from small normals, packed FP4 bytes have no NaN/Inf codes, UE8M0 scales sit
near 2^0. This module imports torch; the cache-tree commands never load it.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch
from torch import nn

from autotune_cache.autotuner.recipe import TOKEN_DIMS, token_dim
from autotune_cache.tune.workers.lm_head import empty_logits_like, lm_head_stubbed

Api = Callable[..., Any]


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _fill(shape: tuple[int, ...], dtype: torch.dtype, fill: str, layout: str, device, gen: torch.Generator | None, ctx: dict) -> torch.Tensor:
    if gen is None:  # the meta device: shapes, dtypes and strides only
        t = torch.empty(shape[:-2] + (shape[-1], shape[-2]) if layout == "column_major" else shape, dtype=dtype, device=device)
        return t.transpose(-2, -1) if layout == "column_major" else t
    if layout == "column_major":
        # Allocate the transpose and view it back: same logical shape, column-major strides.
        t = _fill(shape[:-2] + (shape[-1], shape[-2]), dtype, fill, "row_major", device, gen, ctx)
        return t.transpose(-2, -1)
    if fill == "topk_ids":
        experts = ctx["num_experts"]
        scores = torch.rand(shape[0], experts, generator=gen, device=device)
        return scores.topk(shape[1], dim=-1).indices.to(dtype)
    if fill == "topk_weights":
        w = torch.rand(shape, generator=gen, device=device, dtype=torch.float32) + 0.1
        return (w / w.sum(-1, keepdim=True)).to(dtype)
    if fill == "zeros":
        return torch.zeros(shape, dtype=dtype, device=device)
    if dtype == torch.uint8:
        if fill == "scale":  # UE8M0 exponents: 2^(e-127), kept near 1
            return torch.randint(118, 128, shape, generator=gen, device=device, dtype=torch.int32).to(torch.uint8)
        return torch.randint(0, 256, shape, generator=gen, device=device, dtype=torch.int32).to(torch.uint8)
    if dtype in (torch.int32, torch.int64):
        return torch.zeros(shape, dtype=dtype, device=device)
    if fill == "scale":
        return torch.ones(shape, device=device).to(dtype)
    scale = 1.0 if fill in ("activation", "router_logits") else 0.02
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale
    if fill == "bias":
        x = x * 0.1
    return x.to(dtype)


def _decode(value: Any, m: int, device, gen, ctx) -> Any:
    if isinstance(value, list):
        return [_decode(v, m, device, gen, ctx) for v in value]
    if isinstance(value, str) and value == "next_power_of_2(M)":
        return _next_pow2(m)
    if not isinstance(value, dict):
        return value
    if "tensor" in value:
        t = value["tensor"]
        shape = tuple(ctx["num_pages"] if d == "num_pages" else token_dim(d, m) for d in t["shape"])
        return _fill(shape, _dtype(t["dtype"]), t["fill"], t["layout"], device, gen, ctx)
    if "dtype" in value:
        return _dtype(value["dtype"])
    if "enum" in value:
        module, _, rest = value["enum"].rpartition(".")
        module, _, cls = module.rpartition(".")
        return getattr(getattr(importlib.import_module(module), cls), rest)
    return value


def resolve_api(name: str) -> Api:
    module, _, fn = name.rpartition(".")
    return getattr(importlib.import_module(module), fn)


def _experts(kwargs: dict) -> int:
    """Global expert count: what routing ids range over (cutlass takes local weights x EP)."""
    if isinstance(kwargs.get("num_experts"), int):
        return kwargs["num_experts"]
    w = kwargs.get("fc1_expert_weights") or kwargs.get("gemm1_weights")
    local = w["tensor"]["shape"][0] if isinstance(w, dict) else 1
    return local * int(kwargs.get("ep_size") or 1)


class OpLayer(nn.Module):
    """One FlashInfer tunable call. Weights (M-free arguments) are built once; token-shaped
    arguments are built per call for the M the forward pass feeds - the same values every time
    for one (seed, M).

    Why the same: a MoE call's time depends on its routing. At 2 tokens Mixtral's top-2 of 8
    experts touches 3 or 4 experts (43% / 54% of draws), and the call takes 0.22 or 0.27 ms
    (H100); at 512 tokens the per-expert loads of a draw moved two tactics' order by 1.7%. Drawn
    anew per call, every race of an (op, bucket) - careful's first race, its pair round, the
    exhaustive reference, ``diff --measure`` - timed another input, and their rankings disagreed by
    1-3% for that reason alone (docs/quality.md, "Routing, not noise")."""

    def __init__(self, op: dict, device, seed: int = 0, api: Api | None = None):
        super().__init__()
        self.op = op
        self.device = device
        self.seed = seed
        self.api = api or resolve_api(op["api"])
        self.gen = None if torch.device(device).type == "meta" else torch.Generator(device=device).manual_seed(seed)
        self.ctx = {"num_experts": _experts(op["kwargs"]), "num_pages": 1}
        self.static = {k: _decode(v, 0, device, self.gen, self.ctx) for k, v in op["kwargs"].items() if not _has_m(v)}

    def call_kwargs(self, m: int, draw: int = 0) -> dict:
        """The call's arguments at ``m`` tokens; ``draw`` picks another set of token inputs (a
        race may rotate a few, so that no single routing decides: ``race.py``)."""
        gen = None if self.gen is None else torch.Generator(device=self.device).manual_seed(
            self.seed * 1_000_003 + 7 * int(m) + 1 + 104_729 * int(draw))
        dynamic = {k: _decode(v, m, self.device, gen, self.ctx) for k, v in self.op["kwargs"].items() if _has_m(v)}
        return {**self.static, **dynamic}

    def forward(self, m: int) -> Any:
        return self.api(**self.call_kwargs(m))


def _has_m(value: Any) -> bool:
    if isinstance(value, list):
        return any(_has_m(v) for v in value)
    if isinstance(value, str):
        return value == "next_power_of_2(M)"
    return isinstance(value, dict) and "tensor" in value and any(d in TOKEN_DIMS for d in value["tensor"]["shape"])


class LMHead(nn.Module):
    """An engine-style LM head: local logits ``[tokens x dp, vocab/tp]``, then the TP all-gather
    to ``[tokens x dp, vocab]`` in fp32 (a single GPU stands in for the TP group by concatenation).
    Under ``lm_head_stub()`` it returns ``[tokens, 0]`` before allocating anything."""

    def __init__(self, hidden: int, vocab: int, tp: int, dp: int, dtype: torch.dtype, device):
        super().__init__()
        self.tp, self.dp = tp, dp
        self.weight = nn.Parameter(torch.empty(-(-vocab // tp), hidden, dtype=dtype, device=device).normal_(0, 0.02), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if lm_head_stubbed():
            return empty_logits_like(hidden)
        gathered = hidden.repeat(self.dp, 1)  # the dp-attention gather
        local = gathered @ self.weight.t()
        return torch.cat([local] * self.tp, dim=-1).float()  # the TP all-gather


class SkeletonModel(nn.Module):
    """Layers in the order of the real model's block (one per distinct op), then the LM head."""

    def __init__(self, ops: list[dict], *, hidden: int, vocab: int, tp: int, dp: int, dtype: str, device, apis: dict | None = None):
        super().__init__()
        self.layers = nn.ModuleList(OpLayer(op, device, seed=i, api=(apis or {}).get(op["api"])) for i, op in enumerate(ops))
        self.lm_head = LMHead(hidden, vocab, tp, dp, _dtype(dtype), device)
        self.hidden = hidden
        self.hidden_dtype = _dtype(dtype)
        self.device = device

    def forward(self, tokens_for: Callable[[dict], int | None], lm_tokens: int) -> torch.Tensor:
        """Run each layer at the token count ``tokens_for(op)`` gives (None skips it), then the LM head."""
        for layer in self.layers:
            m = tokens_for(layer.op)
            if m is not None:
                layer(m)
        hidden = torch.zeros(lm_tokens, self.hidden, dtype=self.hidden_dtype, device=self.device)
        return self.lm_head(hidden)
