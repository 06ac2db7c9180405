"""A recipe: one FlashInfer tunable call, as data - the exact shapes, dtypes and flags a rank runs.

Keyword arguments hold ``T`` specs for tensors, with ``"M"`` standing for the token dimension.
``warm`` materializes them on a GPU; ``plan`` prints them; ``file_keys`` says which FlashInfer
cache keys a bucket produces (``autotuner.keys``), so a plan can be checked against what an
engine looks up without running anything. Which calls a model makes is each engine's business
(``engines/<engine>/recipes``); what a call is, and the keys it makes, is FlashInfer's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune_cache.autotuner.buckets import gemm_key
from autotune_cache.autotuner.lookup_keys import BUILDERS
from autotune_cache.errors import UsageError

M = "M"  # the dynamic token dimension
#: The token dimension rounded up to 128: an NVFP4 activation's swizzled scale factors have that many
#: rows (SGLang's recorded mm_fp4 calls: a of 24 rows with a_descale of 128), and the kernel reads
#: them all, so a tensor of M rows would be read past its end at any M not a multiple of 128.
M128 = "M128"
TOKEN_DIMS = (M, M128)


def token_dim(d, m: int):
    """One dimension of a recipe's shape at ``m`` tokens (the one place ``M`` symbols are read)."""
    if d == M:
        return m
    if d == M128:
        return -(-m // 128) * 128
    return d


@dataclass(frozen=True)
class T:
    """A tensor argument: shape (ints and "M"), torch dtype name, layout, and how to fill it."""

    shape: tuple
    dtype: str
    layout: str = "row_major"  # or "column_major" (bmm_fp8's weight)
    fill: str = "weight"  # weight | activation | scale | topk_ids | topk_weights | router_logits | bias | zeros

    def concrete(self, m: int) -> tuple[int, ...]:
        return tuple(token_dim(d, m) for d in self.shape)

    def to_dict(self) -> dict:
        return {"tensor": {"shape": list(self.shape), "dtype": self.dtype, "layout": self.layout, "fill": self.fill}}


@dataclass(frozen=True)
class Dtype:
    name: str

    def to_dict(self) -> dict:
        return {"dtype": self.name}


@dataclass(frozen=True)
class Enum:
    qualname: str  # e.g. "flashinfer.fused_moe.core.ActivationType.Swiglu"
    value: int

    def to_dict(self) -> dict:
        return {"enum": self.qualname, "value": self.value}


def encode(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    return value


def decode(value: Any) -> Any:
    """The inverse of ``encode``: a plan's JSON kwargs back to T / Dtype / Enum."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        if "tensor" in value:
            t = value["tensor"]
            return T(tuple(t["shape"]), t["dtype"], t["layout"], t["fill"])
        if "dtype" in value:
            return Dtype(value["dtype"])
        if "enum" in value:
            return Enum(value["enum"], value["value"])
    return value


@dataclass(frozen=True)
class OpRecipe:
    id: str  # unique within a workload, e.g. "moe.experts", "linear.qkv_proj"
    api: str  # the FlashInfer function called
    custom_ops: tuple[str, ...]  # the AutoTuner custom_op names it tunes
    kwargs: dict = field(repr=False)
    tokens: str  # "moe": dp-gathered tokens; "dense": this rank's tokens; "decode": this rank's decode batch only
    bucket_rule: str  # "moe_clamped" (tune_max_num_tokens, clamped mapper) | "gemm" (from M, uncapped)
    layers: int  # how many layers of the real model run this exact call
    mirrors: str  # the SGLang function whose call this reproduces
    engine_tune_max_cap: int | None = None  # e.g. cutlass MoE: SGLang caps tune_max_num_tokens at 8192
    verified: bool = False  # run on a real GPU and keys checked
    #: The dummy passes (DummyPass.phase) this call belongs to; empty: every pass. A recipe of
    #: serving shapes only (no engine pass makes it) has ("serving",).
    phases: tuple[str, ...] = ()
    #: Its FlashInfer keys were checked against FlashInfer's own key construction (tests/oracle).
    keys_checked: bool = False

    def skipped_by(self, skip_ops) -> bool:
        """Whether ``autotune(skip_ops=...)`` leaves this call untuned: FlashInfer skips each custom
        op whose name is in the set, so a call is skipped when all of its ops are. Some of them only
        (``gemm2`` of the cutlass MoE's two) tunes the rest, which a plan of whole calls does not
        model: a usage error, never a plan that drops or tunes the whole call."""
        hit = set(self.custom_ops) & set(skip_ops)
        if hit and hit != set(self.custom_ops):
            raise UsageError(f"skipping {', '.join(sorted(hit))} but not {', '.join(sorted(set(self.custom_ops) - hit))} "
                             f"of {self.api}: the engine then tunes the rest of the call, which fi-autotune does not "
                             "model (skip all of its ops, or none)")
        return bool(hit)

    def signature(self) -> tuple:
        """What makes two ranks' calls produce the same cache keys (rank offsets excluded)."""
        return (self.api, tuple(sorted((k, repr(encode(v))) for k, v in self.kwargs.items() if k not in RANK_ONLY)))

    def file_keys(self, bucket: int) -> list[str]:
        """One key per custom op: the first candidate runner's (the only one, for most ops)."""
        return [group[0] for group in self.candidate_keys(bucket)]

    def candidate_keys(self, bucket: int) -> list[list[str]]:
        """Per custom op, the keys one profile may be stored under: one per candidate runner
        (FlashInfer stores the winner's, which only a GPU decides)."""
        if self.bucket_rule == "gemm":
            # A bucket off FlashInfer's grid (the dummy pass's own M, appended as the last bucket)
            # is stored under its mapped value: 288 tokens profile as 288 and key as 512.
            bucket = gemm_key(bucket)
        return [[str(k) for k in group] for group in BUILDERS[self.api](self, bucket)]

    @classmethod
    def from_dict(cls, d: dict) -> "OpRecipe":
        return cls(d["id"], d["api"], tuple(d["custom_ops"]), {k: decode(v) for k, v in d["kwargs"].items()},
                   d["tokens"], d["bucket_rule"], d["layers"], d["mirrors"], d["engine_tune_max_cap"], d["verified"],
                   tuple(d.get("phases") or ()), bool(d.get("keys_checked", False)))

    def to_dict(self) -> dict:
        return {
            "id": self.id, "api": self.api, "custom_ops": list(self.custom_ops),
            "kwargs": {k: encode(v) for k, v in self.kwargs.items()},
            "tokens": self.tokens, "bucket_rule": self.bucket_rule, "layers": self.layers,
            "mirrors": self.mirrors, "engine_tune_max_cap": self.engine_tune_max_cap, "verified": self.verified,
            "phases": list(self.phases), "keys_checked": self.keys_checked,
        }


# Arguments that differ between ranks but never reach a cache key.
RANK_ONLY = {"ep_rank", "tp_rank", "local_expert_offset"}
