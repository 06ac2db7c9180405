"""An eager race's span: the token counts whose lookups read a bucket's entry, and a race over them.

The counts come from our own restatement of FlashInfer's bucket rule (``autotuner/buckets.py``), so
here they are checked against FlashInfer's own mappers; the race's strata are checked on the real
``race._Candidates`` with a stand-in layer and tuner (no GPU here).
"""

from __future__ import annotations

import pytest

from autotune_cache.autotuner.buckets import hybrid_buckets, served_below
from autotune_cache.tune.careful import race as race_mod
from autotune_cache.tune.careful.quality import bucket_span
from autotune_cache.tune.careful.settle import center
from tests.support.gpu_clock import GpuClock, Torch


def test_the_span_is_exactly_what_flashinfers_mappers_send_to_the_bucket():
    utils = pytest.importorskip("flashinfer.fused_moe.utils")
    gemm = utils.map_to_hybrid_bucket_uncapped
    moe = utils.make_hybrid_bucket_mapper(16384) if hasattr(utils, "make_hybrid_bucket_mapper") else None
    for bucket in hybrid_buckets(16384):
        below = served_below("gemm", bucket)
        assert below == served_below("moe_clamped", bucket)
        served = [m for m in range(max(1, below - 3), bucket + 4) if gemm(m) == bucket]
        assert served == list(range(below + 1, bucket + 1)), bucket  # (below, bucket], nothing else
        if moe is not None:
            assert all(moe(m) == bucket for m in served)
        counts = bucket_span("gemm", bucket, 5) or [bucket]
        assert counts == (bucket_span("moe_clamped", bucket, 5) or [bucket])
        assert counts[-1] == bucket and counts[0] == below + 1 and counts == sorted(set(counts))
        assert len(counts) == min(5, bucket - below) and all(gemm(m) == bucket for m in counts)
    for tune_max in (6144, 10000, 3000):  # a MoE's top bucket off the grid: everything from the grid value below
        below = served_below("moe_clamped", tune_max)
        mapper = utils.make_hybrid_bucket_mapper(tune_max) if moe is not None else None
        assert below == max(b for b in hybrid_buckets(tune_max) if b < tune_max)
        if mapper is not None:
            assert mapper(below) != tune_max and all(mapper(m) == tune_max for m in bucket_span("moe_clamped", tune_max, 5))
    assert served_below("mla", 1024) is None  # MLA decode maps a batch down onto its grid
    assert served_below("gemm", 1000) is None  # not a grid value: never a lookup key
    assert bucket_span("gemm", 1, 5) is None and bucket_span("gemm", 1024, 1) is None  # one count: no span
    assert bucket_span("mla", 1024, 5) is None and bucket_span("gemm", 1000, 5) is None


def test_span_within_keeps_the_bucket_and_spreads_the_rest():
    assert race_mod.span_within([1, 2, 3], 5) == [1, 2, 3]
    picked = race_mod.span_within(list(range(1, 41)), 20)
    assert len(picked) == 20 and picked[-1] == 40 and picked == sorted(set(picked))


class _Tuner:
    """FlashInfer's tuner as the race uses it: the loaded file decides the candidate."""

    def __init__(self):
        self.current = None

    def clear_cache(self):
        self.current = None

    def load_configs(self, path):
        self.current = int(path.rsplit("-", 1)[1].split(".")[0])
        return True


class _Layer:
    """A call whose time depends on the candidate and the token count, as cuBLAS's per-count
    algorithm lists make it: candidate 1 is 5% faster at the bucket and 5% slower below it."""

    static: dict = {}

    def __init__(self, tuner, times, fails_at=None):
        self.tuner, self.times, self.fails_at = tuner, times, fails_at or {}
        self.seen = []

    def call_kwargs(self, m, draw=0):
        return {"m": m, "draw": draw}

    def api(self, m, draw):
        self.seen.append((self.tuner.current, m, draw))
        if self.fails_at.get(self.tuner.current) == m:
            raise RuntimeError(f"no algorithm at {m}")
        GpuClock.now += self.times[self.tuner.current](m)


def _race(tmp_path, times, span, fails_at=None, rounds=12):
    tuner = _Tuner()
    layer = _Layer(tuner, times, fails_at)
    c = race_mod._Candidates(tuner, layer, 1024, [{}, {}], None, tmp_path, 1, span)
    errors, graphs, _ = race_mod._first_runs(Torch, c, 2, False)
    live = [i for i in range(2) if errors[i] is None]
    samples, tags = race_mod._timed_rounds(Torch, c, live, graphs, None, None, rounds, 2, seed=1)
    return c, layer, errors, samples, tags


TIMES = {0: lambda m: 1.0, 1: lambda m: 0.95 if m == 1024 else 1.05}


def test_a_tactic_fast_only_at_the_bucket_loses_over_the_span(tmp_path):
    _, _, _, alone, tags = _race(tmp_path, TIMES, None)
    assert tags is None and center(alone[1]) < center(alone[0])  # at the bucket alone it wins
    c, layer, errors, samples, tags = _race(tmp_path, TIMES, [769, 896, 1024])
    assert errors == [None, None] and c.counts == [769, 896, 1024]
    assert sorted(set(tags[0])) == [0, 1, 2] == sorted(set(tags[1]))  # one stratum a count
    assert center(samples[1], tags[1]) == pytest.approx((1.05 + 1.05 + 0.95) / 3)
    assert center(samples[1], tags[1]) > center(samples[0], tags[0]) == pytest.approx(1.0)
    timed = layer.seen[6:]  # after each candidate's first calls (three counts each)
    assert {m for _, m, _ in timed} == {769, 896, 1024}


def test_a_tactic_that_fails_at_any_count_it_would_serve_is_ruled_out_before_timing(tmp_path):
    _, _, errors, samples, _ = _race(tmp_path, TIMES, [769, 896, 1024], fails_at={1: 769})
    assert errors[0] is None and "no algorithm at 769" in errors[1] and samples[1] == []
    _, _, errors, _, _ = _race(tmp_path, TIMES, None, fails_at={1: 769})
    assert errors == [None, None]  # the bucket's own count alone never meets it
