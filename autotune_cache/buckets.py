"""Token-count buckets, from FlashInfer's own functions (flashinfer/fused_moe/utils.py).

The one rule that matters (docs/plan.md): a profile tuned under ``autotune(tuning_buckets=B)``
is stored under its own value ``b`` (the override mapper is the identity on B), while the
engine looks a runtime token count ``m`` up under FlashInfer's *default* mapping of ``m``.
So a plan holds grid values only - values the default mapping maps to themselves - and checks
that every key the engine's dummy pass would look up is among them.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def _fi():
    try:
        from flashinfer.fused_moe import utils
    except Exception as e:  # noqa: BLE001 - ImportError, or a CUDA library failing to load
        from .errors import UsageError

        raise UsageError(
            f"flashinfer is not importable here ({type(e).__name__}: {str(e)[:120]}): the planner takes its token "
            "buckets from flashinfer's own functions; install flashinfer-python (pip install flashinfer-python)"
        ) from None
    return utils


def hybrid_buckets(max_tokens: int) -> tuple[int, ...]:
    return tuple(_fi().get_hybrid_num_tokens_buckets(max_tokens))


def next_pow2(x: int) -> int:
    return _fi().next_positive_power_of_2(x)


def gemm_key(m: int) -> int:
    """Default lookup key of a GEMM called with m tokens (map_to_hybrid_bucket_uncapped)."""
    return _fi().map_to_hybrid_bucket_uncapped(m)


def moe_key(m: int, tune_max: int) -> int:
    """Default lookup key of a MoE call with m tokens and tune_max_num_tokens (clamped)."""
    return _fi().map_to_hybrid_bucket(m, tune_max)


def largest_key(rule: str, m: int, cap: int | None = None) -> int:
    """The largest key an op with ``rule`` looks up when fed up to ``m`` tokens."""
    if rule == "gemm":
        return gemm_key(m)
    tune_max = next_pow2(m) if cap is None else min(m, cap)
    return moe_key(tune_max, tune_max)


def engine_keys(rule: str, m: int, cap: int | None = None, tune_max: int | None = None) -> set[int]:
    """Every key one engine call with ``m`` tokens profiles (and so looks up) in tune mode.

    GEMMs generate hybrid(m) and store each under its default mapping (m itself may map up);
    MoE ops generate hybrid(tune_max_num_tokens) whatever m is.
    """
    if rule == "gemm":
        return {gemm_key(b) for b in hybrid_buckets(m)}
    if tune_max is None:
        tune_max = next_pow2(m) if cap is None else cap
    return {moe_key(b, tune_max) for b in hybrid_buckets(tune_max)}
