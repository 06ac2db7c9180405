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


# -- careful in context (context.py, FI_AUTOTUNE_RACE_CONTEXT) ------------------------------------------

import json  # noqa: E402
import logging  # noqa: E402

from autotune_cache.plan.flags import ServerFlags  # noqa: E402
from autotune_cache.plan.request import TuneRequest  # noqa: E402
from autotune_cache.tune.careful.context import Neighbours, neighbour_specs, race_contexts  # noqa: E402
from autotune_cache.tune.careful.quality import QualitySettings  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.tune.careful.test_quality import careful  # noqa: E402


class _Logging:
    """An op whose call logs a miss, as FlashInfer does for every neighbour after a file load."""

    def __init__(self, name, logger, built, calls, fail_at=None):
        self.name, self.logger, self.built, self.calls, self.fail_at = name, logger, built, calls, fail_at

    def call_kwargs(self, m):
        self.built.append((self.name, m))
        return {"m": m}

    def api(self, m):
        self.calls.append((self.name, m))
        self.logger.warning("[AutoTuner]: No tuned config covers fp8_gemm input_shapes=%s", m)
        if m == self.fail_at:
            raise RuntimeError("kernel failed")


def _capture(name):
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger.addHandler(handler)
    return logger, seen


def test_neighbours_call_each_op_at_the_count_with_flashinfers_misses_held_back():
    logger, seen = _capture("test.race_context.quiet")
    built, calls = [], []
    ctx = Neighbours([_Logging(n, logger, built, calls, fail_at=7) for n in ("o_proj", "down_proj")],
                     ["linear.o_proj", "linear.down_proj"], [None, 1000], logger)
    for m in (769, 1024, 769):
        ctx(m)
    assert calls == [("o_proj", 769), ("down_proj", 769), ("o_proj", 1024),
                     ("down_proj", 1000),  # clamped to its own max_tokens
                     ("o_proj", 769), ("down_proj", 769)]
    assert sorted(built) == sorted(set(calls))  # arguments built once per (op, count)
    assert seen == []  # up to 3 x rounds x candidates lines a race, none logged
    with pytest.raises(RuntimeError):
        ctx(7)
    assert not logger.filters  # the filter goes when a call fails too
    logger.warning("[AutoTuner]: No tuned config covers x")  # outside the context: logged
    assert len(seen) == 1


def test_neighbours_drop_only_the_miss_line():
    logger, seen = _capture("test.race_context.only")

    class Other(_Logging):
        def api(self, m):
            self.logger.warning("something else at %s", m)

    Neighbours([Other("o", logger, [], [])], ["o"], None, logger)(8)
    assert [r.getMessage() for r in seen] == ["something else at 8"] and logger.level == logging.INFO


def test_race_contexts_are_the_common_ops_that_count_tokens_alike_in_the_same_phases():
    ops = [{"id": "moe.experts", "tokens": "moe"},                            # 0
           {"id": "linear.gate_up_proj", "tokens": "dense"},                  # 1: stage 0 only
           {"id": "linear.down_proj", "tokens": "dense"},                     # 2: stage 0 only
           {"id": "moe.shared", "tokens": "moe"},                             # 3
           {"id": "attn.mla_decode.decode", "tokens": "moe", "phases": ["decode"]},    # 4
           {"id": "attn.mla_decode.serving", "tokens": "moe", "phases": ["serving"]},  # 5
           {"id": "moe.stage0_gate", "tokens": "moe"}]                        # 6: stage 0 only
    stages = [[0, 1, 2, 3, 4, 5, 6], [0, 3, 4, 5]]
    got = race_contexts(ops, stages)
    # the MoE runs on both stages: only what runs beside it on both (3), not stage 0's 6; no MLA (phases)
    assert got[0] == [3] and got[3] == [0] and got[6] == [0, 3]
    assert got[1] == [2] and got[2] == [1]  # the dense ops only run on stage 0: each other
    assert 4 not in got and 5 not in got  # the two MLA variants never run in one pass
    assert race_contexts(ops[:1], [[0]]) == {}
    assert neighbour_specs(ops, [2, 0]) == [{"layer": 2, "op": ops[2]}, {"layer": 0, "op": ops[0]}]


def test_a_context_that_fails_is_dropped_and_said_not_the_race(tmp_path):
    """``race._context_runs``: every count once before any timed run; a neighbour that cannot run
    there (out of memory at a large count) leaves the race without a context, and says why."""
    calls = []

    def ctx(m):
        calls.append(m)
        if m > 1000:
            raise RuntimeError("CUDA out of memory")

    kept, err = race_mod._context_runs(Torch, ctx, [513, 768])
    assert kept is ctx and err is None and calls == [513, 768]
    kept, err = race_mod._context_runs(Torch, ctx, [768, 2048])
    assert kept is None and err == "RuntimeError: CUDA out of memory"
    assert race_mod._context_runs(Torch, None, [1]) == (None, None)


def test_race_context_is_off_unless_asked_and_named_in_the_settings_only_when_on(monkeypatch):
    monkeypatch.delenv("FI_AUTOTUNE_RACE_CONTEXT", raising=False)
    off = QualitySettings("careful")
    assert not off.race_context and "race_context" not in off.to_dict()
    monkeypatch.setenv("FI_AUTOTUNE_RACE_CONTEXT", "1")
    on = QualitySettings("careful")
    assert on.race_context and on.to_dict()["race_context"] is True
    for word, on in (("yes", True), ("true", True), ("0", False), ("no", False), ("", False)):
        monkeypatch.setenv("FI_AUTOTUNE_RACE_CONTEXT", word)
        assert QualitySettings("careful").race_context is on


@pytest.fixture
def dense_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    request = TuneRequest("nvidia/Llama-3.1-70B-Instruct-FP8", ServerFlags(tp=8), arch="sm90",
                          flashinfer_version="0.7.2.post1")
    return request.plan(tmp_path / "root")


@pytest.mark.parametrize("on", [True, False])
def test_careful_in_context_races_every_op_beside_the_others(dense_plan, monkeypatch, tmp_path, on):
    """Every race spec (first race and pair round) names the workload's other ops, each under the
    layer index its tunes used, only when asked (tests/standins/fake_worker.py logs them)."""
    log = tmp_path / "races.log"
    monkeypatch.setenv("FAKE_RACE_LOG", str(log))
    r = careful(dense_plan, monkeypatch, q={"race_context": on})
    assert r.status == "written"
    ids = [op.recipe.id for op in dense_plan.workloads[0].ops]
    assert len(ids) >= 2
    races = [json.loads(x) for x in log.read_text().splitlines()]
    assert races
    if not on:
        assert all(x["context"] is None for x in races)
        return
    by_op = {}
    for x in races:
        missing = set(ids) - set(x["context"])
        assert len(missing) == 1 and len(x["context"]) == len(ids) - 1, x  # every op but the raced one
        by_op.setdefault(missing.pop(), 0)
        by_op[next(iter(set(ids) - set(x["context"])))] += 1
    assert set(by_op) == set(ids)  # every op was raced, each in its neighbours' context


def test_the_worker_builds_the_context_layers_and_passes_them_to_the_race(tmp_path, monkeypatch):
    """``race.run_spec`` (the worker's race): the spec's context ops are built as the worker builds any layer (by index:
    one layer per op, shared with its tunes) and handed to ``race`` as one call."""
    got = {}

    def fake_race(layer, bucket, assignments, metadata, *, workdir, seed, context, **settings):
        got.update(layer=layer, bucket=bucket, context=context, settings=settings)
        if context is not None:
            context(bucket)
        return {"medians_ms": [1.0]}

    monkeypatch.setattr(race_mod, "race", fake_race)
    built, calls = [], []

    class L:
        def __init__(self, i):
            self.i = i

        def call_kwargs(self, m):
            return {"m": m}

        def api(self, m):
            calls.append((self.i, m))

    def build_layer(index, op):
        built.append((index, op["id"]))
        return L(index)

    ops = [{"id": "linear.qkv_proj"}, {"id": "linear.o_proj"}, {"id": "linear.down_proj"}]
    spec = tmp_path / "race.op1.b768.json"
    spec.write_text(json.dumps({"layer": 1, "op": ops[1], "bucket": 768, "assignments": [{}], "metadata": None,
                                "settings": {"rounds": 5}, "result": str(tmp_path / "r.json"), "seed": 3,
                                "context": neighbour_specs(ops, [0, 2])}))
    race_mod.run_spec(str(spec), build_layer)
    # the neighbours, then the raced op last: the op in hand while the race loads kernel modules
    assert built == [(0, "linear.qkv_proj"), (2, "linear.down_proj"), (1, "linear.o_proj")]
    assert got["context"].ids == ["linear.qkv_proj", "linear.down_proj"] and calls == [(0, 768), (2, 768)]
    assert got["settings"] == {"rounds": 5} and json.loads((tmp_path / "r.json").read_text()) == {"medians_ms": [1.0]}
    spec.write_text(json.dumps({**json.loads(spec.read_text()), "context": []}))
    built.clear()
    race_mod.run_spec(str(spec), build_layer)
    assert built == [(1, "linear.o_proj")] and got["context"] is None
