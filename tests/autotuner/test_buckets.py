"""Our bucket rules against FlashInfer's own functions (flashinfer imports without a GPU)."""

from __future__ import annotations

import pytest

from autotune_cache.autotuner import buckets as B

from ..support.lazy import importorskip_lazily

utils = importorskip_lazily("flashinfer.fused_moe.utils")
fi_utils = importorskip_lazily("flashinfer.utils")

MAXIMA = sorted({*range(1, 600), *range(600, 20000, 37), 2048, 4096, 8192, 16384, 32768, 65536, 131072, 12345, 3000})


def test_next_pow2_matches():
    for x in range(-3, 1 << 17):
        assert B.next_pow2(x) == fi_utils.next_positive_power_of_2(x), x


def test_hybrid_buckets_match():
    for m in MAXIMA:
        assert B.hybrid_buckets(m) == tuple(utils.get_hybrid_num_tokens_buckets(m)), m


def test_gemm_and_moe_keys_match():
    for x in range(-2, 1 << 17):
        assert B.gemm_key(x) == utils.map_to_hybrid_bucket_uncapped(x), x
    for tune_max in (1, 2, 3, 64, 256, 257, 1000, 2048, 3000, 4096, 8192, 16384):
        for x in range(-2, 20000):
            assert B.moe_key(x, tune_max) == utils.map_to_hybrid_bucket(x, tune_max), (x, tune_max)
