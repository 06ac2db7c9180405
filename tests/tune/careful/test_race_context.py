"""A race's ``context`` (``race.race``): the call a benchmark puts between two timed runs of a
candidate, as a forward pass puts the layer's other ops between two calls of one GEMM. It must run
before every timed run, at the round's token count, and never inside the timed window (no GPU:
the stand-in clock of tests/support/gpu_clock.py)."""

from __future__ import annotations

import pytest

from autotune_cache.tune.careful import race as race_mod
from autotune_cache.tune.careful.settle import center
from tests.support.gpu_clock import GpuClock, Torch
from tests.tune.careful.test_span import _Layer, _Tuner


class _ColdLayer(_Layer):
    """Candidate 1 is 5% faster than 0 when it ran last, 5% slower after other kernels ran: what
    the race's composition did to qkv_proj @ 768 (docs/quality.md, "Race composition")."""

    cold = False

    def api(self, m, draw):
        self.seen.append((self.tuner.current, m, draw))
        GpuClock.now += (1.05 if self.cold else 0.95) if self.tuner.current == 1 else 1.0
        self.cold = False


def _race(tmp_path, span, context):
    tuner = _Tuner()
    layer = _ColdLayer(tuner, {})
    c = race_mod._Candidates(tuner, layer, 1024, [{}, {}], None, tmp_path, 1, span)
    errors, graphs, _ = race_mod._first_runs(Torch, c, 2, False)
    calls = []

    def ctx(tokens):
        calls.append((tuner.current, tokens))
        GpuClock.now += 50.0  # far longer than any call: in the window, it would swamp every sample
        layer.cold = True

    samples, tags = race_mod._timed_rounds(Torch, c, [0, 1], graphs, None, None, 10, 2, seed=3,
                                           context=ctx if context else None)
    return samples, tags, calls


def test_the_context_runs_before_every_timed_run_outside_the_window(tmp_path):
    samples, _, calls = _race(tmp_path, None, context=True)
    assert len(calls) == 2 * (10 + 2)  # every run of every round, warm-up included
    assert {cur for cur, _ in calls} == {0, 1}  # after the candidate's own file was loaded
    assert {t for _, t in calls} == {1024}
    assert max(max(s) for s in samples) < 2.0  # the context's 50 ms is in no sample
    assert center(samples[1]) == pytest.approx(1.05) and center(samples[0]) == pytest.approx(1.0)


def test_without_a_context_the_same_candidate_wins(tmp_path):
    samples, _, calls = _race(tmp_path, None, context=False)
    assert calls == [] and center(samples[1]) == pytest.approx(0.95)
    assert center(samples[1]) < center(samples[0])


def test_the_context_gets_the_rounds_count_over_a_span(tmp_path):
    _, tags, calls = _race(tmp_path, [769, 896, 1024], context=True)
    assert {t for _, t in calls} == {769, 896, 1024}
    assert sorted(set(tags[0])) == [0, 1, 2]
