"""Token-count buckets, as FlashInfer 0.7.x computes them (``flashinfer/fused_moe/utils.py``).

The one rule that matters (docs/plan.md): a profile tuned under ``autotune(tuning_buckets=B)``
is stored under its own value ``b`` (the override mapper is the identity on B), while the
engine looks a runtime token count ``m`` up under FlashInfer's *default* mapping of ``m``.
So a plan holds grid values only - values the default mapping maps to themselves - and checks
that every key the engine's dummy pass would look up is among them.

These few lines restate FlashInfer's four-phase hybrid spacing rather than import it, because
importing flashinfer imports torch (seconds, and CUDA libraries), and ``plan``, ``key`` and
``check`` must run in a docker build with neither. ``tests/autotuner/test_buckets.py`` compares every
function here with FlashInfer's own over every token count up to 2^17 and many maxima.
"""

from __future__ import annotations

# flashinfer/fused_moe/utils.py: _PHASE1_END, _PHASE2_STEP, _PHASE2_END, _PHASE3_STEP, _PHASE3_END
_PHASE1_END = 256  # power-of-2 spacing up to here
_PHASE2_STEP, _PHASE2_END = 256, 2048  # then steps of 256
_PHASE3_STEP, _PHASE3_END = 512, 4096  # then steps of 512, then powers of two again


def next_pow2(x: int) -> int:
    """``flashinfer.utils.next_positive_power_of_2``."""
    return 1 if x < 1 else 1 << (x - 1).bit_length()


def _ceil_to_step(x: int, step: int) -> int:
    return ((x + step - 1) // step) * step


def hybrid_buckets(max_tokens: int) -> tuple[int, ...]:
    """``get_hybrid_num_tokens_buckets(max_tokens)``: the buckets tuned up to ``max_tokens``."""
    buckets = []
    m = 1
    while m <= min(max_tokens, _PHASE1_END):
        buckets.append(m)
        m *= 2
    m = _PHASE1_END + _PHASE2_STEP
    while m <= min(max_tokens, _PHASE2_END):
        buckets.append(m)
        m += _PHASE2_STEP
    m = _PHASE2_END + _PHASE3_STEP
    while m <= min(max_tokens, _PHASE3_END):
        buckets.append(m)
        m += _PHASE3_STEP
    m = _PHASE3_END * 2
    while m <= max_tokens:
        buckets.append(m)
        m *= 2
    if not buckets or buckets[-1] != max_tokens:
        buckets.append(max_tokens)
    return tuple(sorted(set(buckets)))


def gemm_key(m: int) -> int:
    """Default lookup key of a GEMM called with m tokens (``map_to_hybrid_bucket_uncapped``)."""
    if m <= 0:
        return 1
    if m <= _PHASE1_END:
        return next_pow2(m)
    if m <= _PHASE2_END:
        return _ceil_to_step(m, _PHASE2_STEP)
    if m <= _PHASE3_END:
        return _ceil_to_step(m, _PHASE3_STEP)
    return next_pow2(m)


def moe_key(m: int, tune_max: int) -> int:
    """Default lookup key of a MoE call with m tokens and tune_max_num_tokens
    (``map_to_hybrid_bucket``: clamped to ``[1, tune_max]``)."""
    if m <= 0:
        return 1
    if m >= tune_max:
        return tune_max
    return min(gemm_key(m), tune_max)


def served_below(rule: str | None, bucket: int) -> int | None:
    """The grid value just below ``bucket`` for an op whose lookup rounds a token count *up* to
    the grid (``gemm``, ``moe_clamped``): its entry serves every count in (that, bucket]. A MoE's
    top bucket may be its tune_max off the grid (SGLang's chunked prefill 6144: counts of 4097-6144
    map to it, ``moe_key``); it also serves the counts above it, which a span leaves out. None where
    the rule maps otherwise (``mla`` maps down) or a GEMM's ``bucket`` is not a grid value (never a key)."""
    if rule not in ("gemm", "moe_clamped") or bucket < 1 or (rule == "gemm" and gemm_key(bucket) != bucket):
        return None
    return max((b for b in hybrid_buckets(bucket) if b < bucket), default=0)


#: flashinfer/mla/_core.py trtllm_batch_decode_with_kv_cache_mla: its tuning config always
#: profiles the hybrid grid up to 8192 (whatever the batch), and maps a batch *down* onto it.
MLA_TUNE_MAX = 8192


def largest_key(rule: str, m: int, tune_max: int | None = None) -> int:
    """The largest key an op with ``rule`` looks up when fed up to ``m`` tokens (``tune_max``:
    a MoE call's fixed tune_max_num_tokens; None: SGLang passes next_power_of_2(m))."""
    if rule == "gemm":
        return gemm_key(m)
    if rule == "mla":
        return MLA_TUNE_MAX
    if tune_max is None:
        top = next_pow2(m)
        return moe_key(top, top)
    return moe_key(m, tune_max)


def engine_keys(rule: str, m: int, tune_max: int | None = None) -> set[int]:
    """Every key one engine call with ``m`` tokens profiles (and so looks up) in tune mode.

    GEMMs generate hybrid(m) and store each under its default mapping (m itself may map up);
    MoE ops generate hybrid(tune_max_num_tokens) whatever m is; MLA decode the grid to 8192.
    """
    if rule == "gemm":
        return {gemm_key(b) for b in hybrid_buckets(m)}
    if rule == "mla":
        return set(hybrid_buckets(MLA_TUNE_MAX))
    if tune_max is None:
        tune_max = next_pow2(m)
    return {moe_key(b, tune_max) for b in hybrid_buckets(tune_max)}
