"""Careful's stop rule (autotune_cache.tune.careful.settle), the exhaustive reference's report
(benchmarks/exhaustive_report.py) and the benchmark's enumeration hooks
(benchmarks/tactic_exhaustive.py) on a stand-in autotuner; the GPU run is marked."""

from __future__ import annotations

import importlib.util
import os
import json
import math
import random
from pathlib import Path

import pytest

from autotune_cache.tune.careful.settle import bootstrap, center, relative_iqr, settle, shortlist, stable
from autotune_cache.tune.careful.quality import DEFAULT_GRAPH_INSTANCES, DEFAULT_INPUT_DRAWS, QualitySettings
from tests.support.gpu_clock import Graph as _Graph, GpuClock as _GpuClock, Torch as _Torch

REPO = Path(__file__).resolve().parents[3]


def _report():
    """The benchmark's report module (benchmarks/exhaustive_report.py), loaded from its file."""
    spec = importlib.util.spec_from_file_location("exhaustive_report", REPO / "benchmarks" / "exhaustive_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


summarize, table = _report().summarize, _report().table
repeated, repeated_table = _report().repeated, _report().repeated_table
identical_spreads, aa_table = _report().identical_spreads, _report().aa_table
sweep_vs_h2h, sweep_h2h_table = _report().sweep_vs_h2h, _report().sweep_h2h_table


def _noisy(mu: float, n: int, rel: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [mu * (1 + rng.gauss(0, rel)) for _ in range(n)]


def test_bootstrap_clear_winner_is_certain():
    s = [_noisy(1.10, 60, 0.01, 1), _noisy(1.00, 60, 0.01, 2), _noisy(1.05, 60, 0.01, 3)]
    b = bootstrap(s, iters=300)
    assert b["best"] == 1 and b["ranked"] == [1, 2, 0]
    assert b["p_top1"] == 1.0 and b["p_within_tie"] == 1.0
    assert b["runner_up_gap"] == pytest.approx(0.05, abs=0.01)
    assert stable(b)


def test_bootstrap_identical_candidates_are_a_coin_toss_but_a_tie():
    s = [_noisy(1.0, 200, 0.02, seed) for seed in range(4)]
    b = bootstrap(s, iters=400, tie=0.01)
    assert 0.1 < b["p_top1"] < 0.9  # no candidate is reliably fastest ...
    assert b["p_within_tie"] > 0.95  # ... but the observed fastest is within 1% of it
    assert stable(b)  # a tie is settled for the 1% target
    assert not stable(bootstrap(s, iters=400, tie=0.0001))


def test_bootstrap_close_pair_needs_more_runs():
    few = [_noisy(1.000, 10, 0.03, 1), _noisy(1.012, 10, 0.03, 2)]
    many = [_noisy(1.000, 2000, 0.03, 1), _noisy(1.012, 2000, 0.03, 2)]
    b_few, b_many = bootstrap(few, iters=400, tie=0.001), bootstrap(many, iters=400, tie=0.001)
    assert b_many["best"] == 0 and b_many["p_top1"] >= 0.95
    assert b_few["p_top1"] < b_many["p_top1"]


def test_bootstrap_edge_cases():
    assert bootstrap([[], []])["best"] is None and stable(bootstrap([[], []]))
    one = bootstrap([[], [1.0, 1.1]])
    assert one["best"] == 1 and one["p_top1"] == 1.0 and one["runner_up_gap"] is None
    assert bootstrap([[2.0] * 5, [1.0] * 5, [math.inf]])["best"] == 1
    # deterministic for a seed
    s = [_noisy(1.0, 30, 0.02, 1), _noisy(1.005, 30, 0.02, 2)]
    assert bootstrap(s, seed=3)["p_top1"] == bootstrap(s, seed=3)["p_top1"]


def test_shortlist_keeps_the_close_ones_and_a_minimum():
    meds = [1.00, 1.02, 1.10, math.inf, 1.029, 1.5, 1.2]
    assert shortlist(meds, keep=0.03, k_min=2) == [0, 1, 4]
    assert shortlist(meds, keep=0.03, k_min=5) == [0, 1, 4, 2, 6]
    assert shortlist(meds, keep=0.0, k_min=1) == [0]
    assert shortlist([math.inf, math.inf]) == []


class _Clock:
    """Stands in for race.py's timed rounds: candidate i's runs are noisy around ``mus[i]`` (None:
    it failed to run); records every call (which candidates, how many rounds)."""

    def __init__(self, mus, rel=0.01):
        self.mus, self.rel, self.calls = mus, rel, []

    def __call__(self, live, k, seed):
        self.calls.append((list(live), k))
        out = [[] for _ in self.mus]
        for i in live:
            if self.mus[i] is not None:
                rng = random.Random(seed * 1000 + i)
                out[i] = [self.mus[i] * (1 + rng.gauss(0, self.rel)) for _ in range(k)]
        return out


def test_settle_screens_everyone_then_races_only_the_close_ones():
    clock = _Clock([1.30, 1.00, 1.002, 1.50, None, 1.10, 1.01] + [2.0] * 40)
    samples, draws, info = settle(clock, 47, rounds=50, screen_rounds=20, batch_rounds=50, max_rounds=300, keep=0.03, keep_min=3)
    assert clock.calls[0] == (list(range(47)), 20)  # the screen: every candidate
    assert sorted(info["top"]) == [1, 2, 6] and info["shortlist"] == 3  # within 3% (and at least 3)
    assert all(sorted(live) == [1, 2, 6] for live, _ in clock.calls[1:])
    assert clock.calls[1][1] == 30  # first on to `rounds` in all
    assert [len(s) for s in samples[:7]] == [20, info["rounds"], info["rounds"], 20, 0, 20, info["rounds"]]
    assert info["rounds"] >= 50 and info["stable"] is (info["rounds"] < 300 or info["stable"])


def test_settle_stops_at_rounds_when_clear_and_races_on_when_close():
    clear = _Clock([1.0, 1.2, 1.3, 1.4])
    _, _, info = settle(clear, 4, rounds=50, screen_rounds=20, batch_rounds=50, max_rounds=300, keep_min=2)
    assert info["rounds"] == 50 and info["stable"] and info["p_top1"] == 1.0
    close = _Clock([1.0, 1.01, 1.5], rel=0.1)  # 1% apart at 10% noise: not settled at 50 rounds
    _, _, info = settle(close, 3, rounds=50, screen_rounds=20, batch_rounds=50, max_rounds=300, keep_min=2)
    assert info["rounds"] > 50 and len(close.calls) > 2
    capped = _Clock([1.0, 1.0, 1.0], rel=0.05)
    _, _, info = settle(capped, 3, rounds=50, screen_rounds=20, batch_rounds=40, max_rounds=130, keep=0.5,
                     confidence=1.01)  # never confident: stops at the cap
    assert info["rounds"] == 130 and [k for _, k in capped.calls] == [20, 30, 40, 40] and not info["stable"]


def test_settle_edge_cases():
    _, _, info = settle(_Clock([None, None]), 2, rounds=50, screen_rounds=20, batch_rounds=50, max_rounds=300)
    assert info["shortlist"] == 0 and info["rounds"] == 20 and info["stable"]
    one = _Clock([None, 1.0])
    _, _, info = settle(one, 2, rounds=50, screen_rounds=20, batch_rounds=50, max_rounds=300)
    assert info["top"] == [1] and info["rounds"] == 50 and info["p_top1"] == 1.0
    zero = _Clock([1.0, 1.0], rel=0.05)  # batch_rounds 0 must not loop forever
    _, _, info = settle(zero, 2, rounds=20, screen_rounds=20, batch_rounds=0, max_rounds=25, confidence=1.01)
    assert info["rounds"] == 25


def test_careful_races_screen_every_tactic_and_keep_rounds_bounded():
    q = QualitySettings("careful", graph_max_tokens=256)
    s = q.race_settings(1)
    assert s["graph"] and s["screen_rounds"] == 20 and s["rounds"] == 50 and s["max_rounds"] == 300
    assert not q.race_settings(512)["graph"]
    assert q.top_k >= 45  # every tactic a Hopper cutlass MoE tune times (45 per GEMM)
    few = QualitySettings("careful", race_rounds=5).race_settings(1)
    assert few["screen_rounds"] == 5 and few["max_rounds"] == 300  # the screen is never longer than the race
    many = QualitySettings("careful", race_rounds=1000).race_settings(1)
    assert many["max_rounds"] == 1000
    assert "screen_rounds" not in QualitySettings("careful", screen_rounds=0).race_settings(1)
    assert s["input_draws"] == DEFAULT_INPUT_DRAWS > 1  # the token inputs rotate unless told not to
    assert "input_draws" not in QualitySettings("careful", input_draws=1).race_settings(1)
    assert QualitySettings("careful").to_dict()["input_draws"] == DEFAULT_INPUT_DRAWS


def test_race_input_draws_from_the_environment(monkeypatch):
    monkeypatch.setenv("FI_AUTOTUNE_RACE_INPUTS", "4")
    assert QualitySettings("careful").race_settings(1)["input_draws"] == 4
    monkeypatch.setenv("FI_AUTOTUNE_RACE_INPUTS", "0")
    assert QualitySettings("careful").input_draws == 1
    monkeypatch.setenv("FI_AUTOTUNE_RACE_INPUTS", "1")
    assert "input_draws" not in QualitySettings("careful").race_settings(1)


def test_graph_races_time_several_graphs_per_candidate_and_eager_races_one(monkeypatch):
    monkeypatch.delenv("FI_AUTOTUNE_GRAPH_INSTANCES", raising=False)
    q = QualitySettings("careful", graph_max_tokens=256)
    assert q.race_settings(8)["graph_instances"] == DEFAULT_GRAPH_INSTANCES > 1
    assert "graph_instances" not in q.race_settings(512)  # eager: no graph to capture again
    assert q.to_dict()["graph_instances"] == DEFAULT_GRAPH_INSTANCES
    monkeypatch.setenv("FI_AUTOTUNE_GRAPH_INSTANCES", "1")
    assert "graph_instances" not in QualitySettings("careful", graph_max_tokens=256).race_settings(8)
    monkeypatch.setenv("FI_AUTOTUNE_GRAPH_INSTANCES", "0")
    assert QualitySettings("careful").graph_instances == 1


def test_graph_instances_are_strata_a_biased_graph_cannot_crown_its_tactic():
    """Tactic A is 1% faster than B, but B's first graph reads 2% fast (its own memory pool): one
    graph per candidate crowns B; the mean over three graphs' medians (strata) crowns A."""
    rng = random.Random(5)
    a = [[1.00 * (1 + rng.gauss(0, 0.005)) for _ in range(30)] for _ in range(3)]
    b = [[1.01 * (0.98 if k == 0 else 1.0) * (1 + rng.gauss(0, 0.005)) for _ in range(30)] for k in range(3)]
    assert center(b[0]) < center(a[0])  # one instance each: the biased graph wins
    tags = [k for k in range(3) for _ in range(30)]
    assert center(sum(a, []), tags) < center(sum(b, []), tags)


def test_relative_iqr():
    assert relative_iqr([1.0, 1.0, 1.0]) is None
    assert relative_iqr([1.0, 1.0, 1.0, 1.0]) == 0.0
    assert relative_iqr([0.9, 1.0, 1.0, 1.1, 1.0]) > 0


def _two_draws(mu: float, rounds: int, seed: int, modes=(1.0, 1.22), rel=0.01):
    """Runs that rotate over two input draws whose calls differ by 22% (Mixtral at 2 tokens: 3 or 4
    experts touched), 1% noise within a draw; with the draw of each run."""
    rng = random.Random(seed)
    xs, ds = [], []
    for r in range(rounds):
        xs.append(mu * modes[r % len(modes)] * (1 + rng.gauss(0, rel)))
        ds.append(r % len(modes))
    return xs, ds


def test_center_is_the_mean_of_each_draws_median():
    assert center([3.0, 1.0, 2.0]) == 2.0 and center([]) == math.inf
    assert center([1.0, 5.0, 1.2, 5.2, 1.1], [0, 1, 0, 1, 0]) == pytest.approx((1.1 + 5.1) / 2)
    assert center([1.0, 2.0], [7, 7]) == 1.5  # one draw: the median
    # a run that failed (inf) counts in neither the center nor the bootstrap
    assert center([1.0, math.inf, 1.0], [0, 0, 1]) == 1.0
    b = bootstrap([[1.0] * 5 + [math.inf] * 5, [1.1] * 10], iters=100, draws=[[0] * 5 + [1] * 5] * 2)
    assert b["best"] == 0 and b["p_top1"] == 1.0
    # one draw more of the slow routing moves the pooled median by the gap between modes, not the center
    xs, ds = [1.0, 1.0, 1.2, 1.2, 1.2], [0, 0, 1, 1, 1]
    assert center(xs) == 1.2 and center(xs, ds) == pytest.approx(1.1)


def test_bootstrap_within_draws_settles_what_the_pooled_median_cannot():
    a, da = _two_draws(1.00, 50, 1)
    b, db = _two_draws(1.01, 50, 101)  # 1% slower in every draw
    strat = bootstrap([a, b], iters=400, draws=[da, db])
    assert strat["best"] == 0 and strat["p_top1"] >= 0.95 and stable(strat)
    assert strat["runner_up_gap"] == pytest.approx(0.01, abs=0.004)
    pooled = bootstrap([a, b], iters=400)  # the same runs, draws ignored: the median sits between the modes
    assert pooled["p_top1"] < 0.9 and not stable(pooled)
    # the noise within a draw, not the spread between routings
    assert relative_iqr(a) > 0.15 and relative_iqr(a, da) < 0.03


def test_settle_keeps_each_samples_draw():
    def clock(live, k, seed):
        out, tags = [[] for _ in range(3)], [[] for _ in range(3)]
        for i in live:
            out[i], tags[i] = _two_draws((1.0, 1.01, 1.3)[i], k, seed * 10 + i)
        return out, tags
    samples, draws, info = settle(clock, 3, rounds=50, screen_rounds=20, batch_rounds=50, max_rounds=300, keep_min=2)
    assert info["top"] == [0, 1] and info["stable"] and info["p_top1"] >= 0.95 and info["rounds"] == 50
    assert [len(d) for d in draws] == [len(s) for s in samples] == [50, 50, 20]
    assert set(draws[0]) == {0, 1}
    _, none, _ = settle(_Clock([1.0, 1.2]), 2, rounds=20, screen_rounds=20, batch_rounds=50, max_rounds=300)
    assert none is None  # no draws given, none invented


def _row(slot, bucket, best_ms, picks, h2h=None, **kw):
    r = {"slot": slot, "bucket": bucket, "candidates": 40, "best_ms": best_ms, "best_label": "MoERunner:3",
         "p_top1": 0.97, "p_within_tie": 1.0, "stable": True, "best_relative_iqr": 0.01, "runner_up_gap": 0.004,
         "picks": {k: {"label": "x", "exhaustive_ms": v, "is_best": v == best_ms} for k, v in picks.items()}}
    if h2h is not None:
        r["head_to_head"] = h2h
    return r | kw


def test_summarize_gaps_shares_and_target():
    items = [
        _row("gemm1", 1, 0.040, {"quick": 0.041, "careful": 0.040, "engine": 0.0436}),
        # the head-to-head overrides the exhaustive race's numbers
        _row("gemm2", 1, 0.040, {"quick": 0.050, "careful": 0.0401, "engine": 0.040},
             h2h={"best": 0.0400, "quick": 0.0402, "careful": 0.0404, "engine": 0.0399}),
        _row("gemm1", 2, 0.050, {"quick": 0.050, "careful": 0.0503, "engine": 0.050}, p_top1=0.5, stable=False),
    ]
    res = {"workload": "w", "gpu": "H100", "items": items,
           "layer": [{"tokens": 1, "graph": True, "best_ms": 0.080, "quick": 0.0808, "careful": 0.0800, "engine": 0.0880}]}
    s = summarize(res)
    assert s["items"] == 3 and s["tactics"] == 120 and s["stable"] == 2
    q, c, e = s["kinds"]["quick"], s["kinds"]["careful"], s["kinds"]["engine"]
    assert q["within"] == pytest.approx(2 / 3) and q["worst_gap"] == pytest.approx(0.025) and q["worst_at"] == "gemm1 @ 1"
    assert c["within"] == 1.0 and c["worst_gap"] == pytest.approx(0.01) and c["meets_target"]
    assert e["worst_gap"] == pytest.approx(0.09) and e["over_limit"] == 1 and not e["meets_target"]
    assert e["geomean_gap"] >= 0  # a pick faster than best in the head-to-head counts as 0
    assert s["p_top1_min"] == 0.5
    assert s["layer"][0]["careful"] == 0.0 and s["layer"][0]["engine"] == pytest.approx(0.1)
    text = table(res)
    assert "| careful | 100.0% (3) |" in text and "| 1 | 80.0 |" in text and "gemm2 | 1 |" in text


def test_summarize_without_picks():
    s = summarize({"items": [_row("gemm1", 1, 0.04, {})], "layer": []})
    assert s["kinds"] == {} and s["items"] == 1
    assert "gemm1" in table({"items": [_row("gemm1", 1, 0.04, {})], "layer": []})


def _run(rows, layer=()):
    return {"workload": "w", "label": "W", "gpu": "H200", "items": rows, "layer": list(layer)}


def _h2h_row(slot, bucket, careful, engine=0.0, op="op", labels=("c", "e")):
    """One (op, bucket, slot): careful's and the engine's gaps to the best, through the head-to-head."""
    r = _row(slot, bucket, 0.010, {"careful": 0.010, "engine": 0.010}, op=op,
             h2h={"best": 0.010, "careful": 0.010 * (1 + careful), "engine": 0.010 * (1 + engine)})
    r["picks"]["careful"]["label"], r["picks"]["engine"]["label"] = labels
    return r


def test_repeated_counts_a_miss_only_where_every_run_puts_it_over():
    a = _run([_h2h_row("g", 1, 0.015), _h2h_row("g", 2, 0.020), _h2h_row("g", 4, 0.002)])
    b = _run([_h2h_row("g", 1, 0.004), _h2h_row("g", 2, 0.012), _h2h_row("g", 4, 0.013)])
    c = repeated([a, b])["kinds"]["careful"]
    assert c["within_each_run"] == pytest.approx([1 / 3, 1 / 3])  # strict, per run: 1 of 3 each
    assert c["misses"] == ["g @ 2"] and c["ties"] == 2 and c["within"] == pytest.approx(2 / 3)
    # the runs' best case has a mean-gap figure beside it: g @ 1 (mean 0.95%) passes, g @ 4 (0.75%) too
    assert c["within_mean"] == pytest.approx(2 / 3)
    assert c["worst_gap"] == pytest.approx(0.012) and c["worst_single_run"] == pytest.approx(0.020)
    assert not c["meets_target"]
    assert repeated([a, a])["kinds"]["careful"]["misses"] == ["g @ 1", "g @ 2"]  # a run that agrees: no tie
    with pytest.raises(ValueError):
        repeated([a])


def test_repeated_refuses_runs_of_different_picks_or_buckets():
    a = _run([_h2h_row("g", 1, 0.0)])
    b = _run([_h2h_row("g", 1, 0.0, labels=("other", "e"))])
    with pytest.raises(ValueError, match="different picks"):
        repeated([a, b])
    with pytest.raises(ValueError, match="in every run"):  # two halves of one workload's buckets
        repeated([a, _run([_h2h_row("g", 2, 0.0)])])


def test_repeated_judges_an_item_by_the_runs_that_timed_it():
    a = _run([_h2h_row("g", 1, 0.05), _h2h_row("g", 2, 0.0)])
    untimed = _h2h_row("g", 1, 0.0)
    untimed["head_to_head"] = {"best": None}
    untimed["picks"]["careful"]["exhaustive_ms"] = None  # run b did not time careful's pick
    c = repeated([a, _run([untimed, _h2h_row("g", 2, 0.0)])])["kinds"]["careful"]
    assert c["items"] == 2 and c["misses"] == ["g @ 1"] and c["within_each_run"] == [0.5, 1.0]
    c = repeated([_run([untimed, _h2h_row("g", 2, 0.0)])] * 2)["kinds"]["careful"]
    assert c["items"] == 1 and c["unjudged"] == 1
    nulled = _h2h_row("g", 1, 0.0)
    nulled["head_to_head"]["careful"] = None  # a non-finite time is saved as null
    assert repeated([_run([nulled]), _run([nulled])])["kinds"]["careful"]["within"] == 1.0


def test_repeated_interaction_tie_needs_the_whole_call_faster_in_every_run():
    """gemm1 over 1% in both runs, gemm2 fine; the kind's whole call at that token count decides."""
    rows = [_h2h_row("gemm1", 1, 0.019), _h2h_row("gemm2", 1, 0.004)]
    fast = {"op": "op", "tokens": 1, "best_ms": 0.045, "careful": 0.045 * 0.94, "engine": 0.045 * 1.004}
    level = {**fast, "careful": 0.045 * 1.005}  # within 1%, but not faster: inside the whole-call race's noise
    slow = {**fast, "careful": 0.045 * 1.02}
    c = repeated([_run(rows, [fast]), _run(rows, [fast])])["kinds"]["careful"]
    assert c["misses"] == [] and c["interaction_ties"] == ["gemm1 @ 1"] and c["within"] == 1.0
    assert c["slower_than_engine"] == [] and c["whole_call_misses"] == []  # its slot 1.9% behind the engine's, its call 6% ahead
    c = repeated([_run(rows, [level]), _run(rows, [level])])["kinds"]["careful"]
    assert c["misses"] == ["gemm1 @ 1"] and c["interaction_ties"] == []
    c = repeated([_run(rows, [fast]), _run(rows, [slow])])["kinds"]["careful"]
    assert c["misses"] == ["gemm1 @ 1"] and c["interaction_ties"] == []
    assert c["slower_than_engine"] == []  # its whole call ahead of the engine's in one run
    c = repeated([_run(rows, [slow]), _run(rows, [slow])])["kinds"]["careful"]
    assert c["misses"] == ["gemm1 @ 1"] and c["slower_than_engine"] == ["gemm1 @ 1"]
    assert c["whole_call_misses"] == ["1 tokens"]  # reported, not folded into the share
    one_slot = [_h2h_row("gemm1", 1, 0.019)]  # a single-slot call: its layer row is no second opinion
    assert repeated([_run(one_slot, [fast]), _run(one_slot, [fast])])["kinds"]["careful"]["misses"] == ["gemm1 @ 1"]
    # a run that lacks gemm2's row still sees a call of two slots
    c = repeated([_run(rows, [fast]), _run(rows[:1], [fast])])["kinds"]["careful"]
    assert c["interaction_ties"] == ["gemm1 @ 1"]
    # a layer row of another op is not this call's
    other = {**fast, "op": "other"}
    assert repeated([_run(rows, [other]), _run(rows, [other])])["kinds"]["careful"]["misses"] == ["gemm1 @ 1"]


def test_identical_candidates_in_one_race_give_the_races_own_spread():
    """A/A: the kinds whose caches hold the reference's best assignment (quick and the engine here) were
    timed as separate candidates of one thing; careful's other tactic is no part of it."""
    rows = []
    for slot in ("gemm1", "gemm2"):
        r = _row(slot, 2, 0.09, {"quick": 0.09, "careful": 0.09, "engine": 0.09}, op="op", graph=True)
        r["best_label"] = "MoERunner:21"
        for kind in ("quick", "engine"):
            r["picks"][kind]["label"] = "MoERunner:21 (default)" if kind == "engine" else "MoERunner:21"
        r["picks"]["careful"]["label"] = "MoERunner:19"
        rows.append(r)
    layer = [{"op": "op", "tokens": 2, "graph": True, "best_ms": 0.020, "quick": 0.0202, "careful": 0.03, "engine": 0.0201}]
    (got,) = identical_spreads(_run(rows, layer))
    assert got["candidates"] == 3 and got["graph"] and got["spread"] == pytest.approx(0.01)
    eager = [{**layer[0], "graph": False, "best_ms": 0.5, "quick": 0.5005, "engine": 0.5}]
    assert identical_spreads(_run(rows, eager))[0]["spread"] == pytest.approx(0.001)
    assert identical_spreads(_run(rows, [{**layer[0], "op": "other"}])) == []  # another call's row
    text = aa_table([_run(rows, layer), _run(rows, eager)])
    assert "| CUDA graph | < 30 us | 1 | 1.00% |" in text and "| eager | > 100 us | 1 | 0.10% |" in text


def test_a_picks_gap_is_read_in_the_sweep_and_in_the_head_to_head():
    """The sweep (every tactic) and the head-to-head (the picks alone) each put a gap on a pick that
    is not the best; the pick that is the best, or one without a head-to-head, offers none."""
    item = {"bucket": 768, "graph": False, "best_ms": 0.018,
            "ranking": [{"label": "R:1", "median_ms": 0.0180}, {"label": "R:-1 (default)", "median_ms": 0.01809}],
            "picks": {"careful": {"label": "R:-1"}, "engine": {"label": "R:1"}},
            "head_to_head": {"best": 0.0180, "best_label": "R:1", "careful": 0.01827, "engine": 0.0180}}
    (got,) = sweep_vs_h2h({"items": [item, {**item, "head_to_head": {"note": "every pick is the best"}}]})
    assert got["h2h"] == pytest.approx(0.015) and got["sweep"] == pytest.approx(0.005) and not got["graph"]
    text = sweep_h2h_table([{"items": [item]}])
    assert "| eager | < 30 us | 1 | +1.00 pt |" in text and text.endswith("| 1 | 0 |")


def test_repeated_behind_the_engine_in_every_run():
    a = _run([_h2h_row("g", 1, 0.008), _h2h_row("g", 2, 0.008), _h2h_row("g", 4, 0.008, labels=("e", "e"))])
    b = _run([_h2h_row("g", 1, 0.007), _h2h_row("g", 2, 0.003), _h2h_row("g", 4, 0.008, labels=("e", "e"))])
    s = repeated([a, b])
    assert s["kinds"]["careful"]["slower_than_engine"] == ["g @ 1"]  # g @ 2 is behind in one run only; g @ 4 is the same pick
    assert s["kinds"]["engine"]["slower_than_engine"] == []
    text = repeated_table([a, b])
    assert "| careful | 100.0% / 100.0% | 100.0% | 100.0% (3/3) | 0 | 0 | 0 |" in text and "behind engine g @ 1" in text
    assert s["kinds"]["careful"]["engine_sweep_disagrees"] == ["g @ 1"]  # these rows' sweeps read the two alike


def test_repeated_lists_a_loss_to_the_engine_the_reference_sweep_contradicts():
    """Head-to-head +0.8% in both runs, but each run's sweep put careful's pick ahead of the engine's:
    still counted behind, and listed as contradicted. Behind in one run's sweep only: not listed."""
    runs = []
    for sweep_careful in ((0.0099, 0.0101), (0.0099, 0.0099)):
        rows = [_h2h_row("g", 1, 0.008), _h2h_row("g", 2, 0.008)]
        for r, ms in zip(rows, sweep_careful):
            r["picks"]["careful"]["exhaustive_ms"], r["picks"]["engine"]["exhaustive_ms"] = ms, 0.0100
        runs.append(_run(rows))
    k = repeated(runs)["kinds"]["careful"]
    assert k["slower_than_engine"] == ["g @ 1", "g @ 2"] and k["engine_sweep_disagrees"] == ["g @ 1"]
    assert "(of which the runs' own sweeps put within 0.5% of the engine: g @ 1)" in repeated_table(runs)


def _bench():
    spec = importlib.util.spec_from_file_location("tactic_exhaustive", REPO / "benchmarks" / "tactic_exhaustive.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Runner:
    def __init__(self, extras):
        self.extras = extras

    def get_cache_key_extras(self, inputs):
        return self.extras


class Cublas(_Runner):
    pass


class Cudnn(_Runner):
    pass


class _Tuner:
    """Stands in for FlashInfer's AutoTuner: choose_one profiles every tactic of every runner."""

    def choose_one(self, custom_op, runners, tuning_config, inputs, **kwargs):
        for r, tactics in zip(runners, tuning_config):
            for t in tactics:
                try:
                    self._profile_single_kernel(r, inputs, t, tuning_config)
                except RuntimeError:
                    pass
        return runners[0], -1

    def _profile_single_kernel(self, runner, inputs, tactic, tuning_config, **kwargs):
        if tactic == 13:
            raise RuntimeError("no smem")
        return 0.01 * (tactic + 1)


def test_enumerator_records_every_profiled_tactic_and_restores_the_tuner():
    mod = _bench()
    orig = (_Tuner.choose_one, _Tuner._profile_single_kernel)
    with mod.Enumerator(_Tuner) as enum:
        _Tuner().choose_one("fp8_gemm", [Cublas(("a",)), Cudnn(("b",))], [[0, 1], [13, 2]], [])
    assert (_Tuner.choose_one, _Tuner._profile_single_kernel) == orig
    assert enum.first == {"fp8_gemm": ("Cublas", ("a",))}
    got = [(r["custom_op"], r["runner"], r["extras"], r["tactic"], r["error"] is None) for r in enum.records]
    assert got == [("fp8_gemm", "Cublas", ("a",), 0, True), ("fp8_gemm", "Cublas", ("a",), 1, True),
                   ("fp8_gemm", "Cudnn", ("b",), 13, False), ("fp8_gemm", "Cudnn", ("b",), 2, True)]
    assert enum.records[1]["ms"] == pytest.approx(0.02)


def test_report_mode_prints_a_table(tmp_path, capsys, monkeypatch):
    mod = _bench()
    res = {"workload": "moe-bf16", "label": "Qwen3", "gpu": "H100", "items": [_row("gemm1", 1, 0.04, {"careful": 0.04})],
           "layer": []}
    p = tmp_path / "r.json"
    p.write_text(json.dumps(res))
    monkeypatch.setattr("sys.argv", ["tactic_exhaustive.py", "--report", str(p)])
    mod.main()
    printed = capsys.readouterr().out
    assert "| careful | 100.0% (1) |" in printed and "every (op, bucket) timed at its bucket's own token count" in printed
    res["items"][0]["span"] = [769, 833, 896, 960, 1024]  # a run with --span says so
    p.write_text(json.dumps(res))
    mod.main()
    assert "1 eager (op, bucket) timed over 5 token counts of the range each entry serves" in capsys.readouterr().out
    # two reference runs of one workload: each run's table, then what holds in both
    q = tmp_path / "r2.json"
    q.write_text(json.dumps(res))
    monkeypatch.setattr("sys.argv", ["tactic_exhaustive.py", "--report", str(p), str(q)])
    mod.main()
    assert "2 reference runs of the same picks" in capsys.readouterr().out


def test_resume_reuses_the_picks_and_keeps_what_was_measured(tmp_path):
    """``--resume DIR``: the picks' caches are the ones the first run tuned (a new tune would be another
    pick) and the (op, bucket) it measured are skipped; ``--remeasure`` keeps the picks, measures all."""
    import argparse

    mod = _bench()
    prev, out = tmp_path / "prev", tmp_path / "out"
    prev.mkdir()
    out.mkdir()
    res = {"workload": "w", "date": "2026-01-01", "settings": {"pick_rounds": 300, "race_context": True}, "measure_s": 50.0,
           "picks": {"careful": {"wall_s": 1.0}, "engine": {"wall_s": 2.0}, "quick": {"wall_s": 3.0}},
           "items": [{"op": "o", "bucket": 1, "slot": "s"}], "layer": [{"op": "o", "tokens": 1}], "skipped": ["o@2"]}
    (prev / "tactic_exhaustive_w.json").write_text(json.dumps(res))
    for kind in ("careful", "engine"):  # quick's cache is missing: it is not a pick of the resumed run
        (prev / f"cache_w_{kind}.json").write_text("{}")
    settings = dict(repeats=3, screen_rounds=20, batch_rounds=60, max_rounds=300, pick_rounds=100, keep=0.03,
                    keep_min=4, confidence=0.95, buckets="", input_draws=4, instances=3, span=5)
    picks, result, done = mod.resumed(argparse.Namespace(resume=prev, workload="w", out=out, remeasure=False, **settings))
    assert sorted(picks) == ["careful", "engine"] and picks["careful"]["path"] == str(prev / "cache_w_careful.json")
    assert sorted(result["picks"]) == ["careful", "engine"]  # quick is not measured from here on
    assert picks["engine"]["wall_s"] == 2.0 and done == {("o", 1)} and "skipped" not in result
    assert result["resumed"] == 1 and result["measure_s_earlier"] == 50.0 and (out / "cache_w_careful.json").exists()
    picks, result, done = mod.resumed(argparse.Namespace(resume=prev, workload="w", out=out, remeasure=True, **settings))
    assert sorted(picks) == ["careful", "engine"] and done == set() and result["items"] == result["layer"] == []
    assert result["remeasure_of"]["path"].endswith("tactic_exhaustive_w.json")
    assert result["remeasure_of"]["settings"] == {"pick_rounds": 300, "race_context": True}
    assert result["settings"]["pick_rounds"] == 100
    assert result["settings"]["race_context"] is True  # the picks were raced in context: still said of them
    assert result["date"] != "2026-01-01" and "measure_s" not in result


@pytest.mark.parametrize("argv, words", [
    (["--workload", "moe-bf16", "--resume", "{prev}", "--kinds", "careful"], "--kinds with --resume"),
    (["--workload", "moe-bf16", "--resume", "{prev}", "--race-context"], "--race-context with --resume"),
    (["--workload", "moe-bf16", "--resume", "{prev}", "--remeasure", "--out", "{prev}"], "would overwrite"),
    (["--workload", "moe-bf16", "--remeasure"], "goes with --resume"),
    (["--workload", "moe-bf16", "--span", "0"], "take 1 or more"),
    (["--workload", "moe-bf16", "--resume", "{prev}/nothing-here"], "no tactic_exhaustive_moe-bf16.json"),
    # a run from before --instances went on with one graph per candidate: going on with three would mix methods
    (["--workload", "moe-bf16", "--resume", "{prev}"], "that run used --instances 1"),
    (["--workload", "moe-bf16", "--resume", "{prev}", "--instances", "1"], "that run used --input-draws 1"),
    # ... and one from before --span timed each eager bucket at its own token count alone
    (["--workload", "moe-bf16", "--resume", "{prev}", "--instances", "1", "--input-draws", "1"], "that run used --span 1"),
])
def test_resume_usage_errors(tmp_path, monkeypatch, capsys, argv, words):
    mod = _bench()
    (tmp_path / "tactic_exhaustive_moe-bf16.json").write_text("{}")  # a run to resume
    monkeypatch.setattr("sys.argv", ["tactic_exhaustive.py", *(a.format(prev=tmp_path) for a in argv)])
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert e.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["--report", "--aa", "--sweep-vs-h2h"])
@pytest.mark.parametrize("what, words", [("missing", "no such result file"), ("fifo", "no such result file"),
                                         ("garbage", "not a result file"), ("list", "not an object")])
def test_a_file_that_is_no_result_is_a_usage_error(tmp_path, monkeypatch, capsys, mode, what, words):
    """One line and exit 2 before any table; a FIFO is refused unopened (reading it would block)."""
    mod = _bench()
    p = tmp_path / f"{what}.json"
    if what == "fifo":
        os.mkfifo(p)
    elif what == "garbage":
        p.write_bytes(b"\x00not json")
    elif what == "list":
        p.write_text("[]")
    monkeypatch.setattr("sys.argv", ["tactic_exhaustive.py", mode, str(p)])
    with pytest.raises(SystemExit) as e:
        mod.main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and words in err and "Traceback" not in err


def test_report_of_two_runs_of_other_picks_says_so(tmp_path, capsys, monkeypatch):
    mod = _bench()
    for name, label in (("a", "c"), ("b", "other")):
        (tmp_path / f"{name}.json").write_text(json.dumps(_run([_h2h_row("g", 1, 0.0, labels=(label, "e"))])))
    monkeypatch.setattr("sys.argv", ["tactic_exhaustive.py", "--report", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    mod.main()
    assert "not read as repeated runs of the same picks: the runs hold different picks" in capsys.readouterr().out


@pytest.mark.gpu
def test_exhaustive_smoke_on_gpu(tmp_path):
    """Two buckets of the Qwen3 MoE, the reference alone (no picks): every slot has candidates and a best."""
    import subprocess
    import sys

    pytest.importorskip("flashinfer")
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "tactic_exhaustive.py"), "--workload", "moe-bf16",
                        "--kinds", "", "--buckets", "1,1024", "--screen-rounds", "5", "--max-rounds", "5",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads((tmp_path / "tactic_exhaustive_moe-bf16.json").read_text())
    assert len(r["items"]) == 4 and all(x["candidates"] > 1 and x["best_ms"] for x in r["items"])


@pytest.mark.gpu
def test_rotating_draws_are_timed_apart_on_gpu(tmp_path):
    """Mixtral TP2 at 2 tokens, the inputs rotating over 4 draws (3 or 4 experts touched: calls 20%
    apart): every race's spread is its noise within a draw, a few per cent, not the routings' 20%
    that the pooled runs show (the reference's 21% at this bucket before draws were kept apart)."""
    import subprocess
    import sys

    pytest.importorskip("flashinfer")
    out = tmp_path / "race.json"
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "race_inputs.py"), "--workload", "mixtral-bf16",
                        "--bucket", "2", "--pairs", "41,83", "19,51", "--seeds", "0", "--weight-seeds", "0",
                        "--rounds", "40", "--input-draws", "4", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [r for r in json.loads(out.read_text())["rows"] if "draws rotating" in r.get("inputs", "")]
    assert len(rows) == 3
    for r in rows:
        assert all(v is not None and v < 0.08 for v in r["relative_iqr"].values()), r


def _race_instances():
    spec = importlib.util.spec_from_file_location("race_instances", REPO / "benchmarks" / "race_instances.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_race_instances_reads_cases_and_refuses_a_malformed_one():
    ri = _race_instances()
    assert ri.parse_case("o_proj@8:default,0") == ("o_proj", 8, ["default", "0"])
    assert ri.parse_case("experts@2:19+83,21+83") == ("experts", 2, ["19+83", "21+83"])
    for bad in ("o_proj:default,0", "o_proj@x:1,2", "@8:1,2", "o_proj@8"):
        with pytest.raises(ValueError, match="expected op@bucket"):
            ri.parse_case(bad)


@pytest.mark.parametrize("argv, words", [
    (["--case", "o_proj@8:default"], "expected op@bucket:tactic,tactic"),
    (["--case", "o_proj@8:default,0", "--instances", "0"], "take 1 or more"),
    (["--case", "o_proj@8:default,0", "--workload", "nope"], "--workload 'nope': one of"),
    (["--case", "o_proj@1000:default,0", "--span", "3"], "1000 is not a hybrid bucket"),
    (["--case", "o_proj@8:default,0", "--span", "0"], "take 1 or more"),
])
def test_race_instances_refuses_bad_arguments_before_any_gpu_work(monkeypatch, capsys, argv, words):
    ri = _race_instances()
    monkeypatch.setattr("sys.argv", ["race_instances.py", *argv])
    with pytest.raises(SystemExit) as e:
        ri.main()  # no GPU here: reaching torch would fail another way
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_race_instances_span_is_the_counts_flashinfer_maps_to_the_bucket():
    """``--span``'s counts are exactly those FlashInfer's GEMM lookup maps up to the bucket (its own
    function decides), the bucket last; a count that is not a bucket is refused before any GPU work."""
    from flashinfer.fused_moe.utils import map_to_hybrid_bucket_uncapped as up

    ri = _race_instances()
    for bucket, low in ((1024, 769), (3584, 3073), (8, 5), (8192, 4097)):
        counts = ri.span_counts(bucket, 5)
        assert counts[0] == low and counts[-1] == bucket and len(counts) == min(5, bucket - low + 1), counts
        assert all(up(m) == bucket for m in counts) and up(low - 1) != bucket
    assert ri.span_counts(1024, 1) == [1024] and ri.span_counts(1, 4) == [1]
    with pytest.raises(ValueError, match="not a hybrid bucket"):
        ri.span_counts(1000, 3)


def test_race_instances_context_calls_every_other_op_at_the_count():
    """``--context``: the workload's other ops (not the raced one) each called once per timed run at
    the round's count, their arguments built once per count (careful's rule picks them); an op with no
    neighbour is refused."""
    ri = _race_instances()
    calls, built = [], []

    class Op:
        def __init__(self, op, dev, seed):
            self.id = op["id"]

        def call_kwargs(self, m):
            built.append((self.id, m))
            return {"m": m}

        def api(self, m):
            calls.append((self.id, m))

    ops = [{"id": "linear.qkv_proj", "tokens": "dense"}, {"id": "linear.o_proj", "tokens": "dense"},
           {"id": "linear.down_proj", "tokens": "dense"}, {"id": "moe.experts", "tokens": "moe"}]
    ctx = ri.neighbours(ops[0], ops, None, Op)  # careful's rule: the MoE counts tokens otherwise
    assert ctx.ids == ["linear.o_proj", "linear.down_proj"]
    for m in (769, 1024, 769):
        ctx(m)
    assert calls == [("linear.o_proj", 769), ("linear.down_proj", 769), ("linear.o_proj", 1024),
                     ("linear.down_proj", 1024), ("linear.o_proj", 769), ("linear.down_proj", 769)]
    assert sorted(built) == sorted({(i, m) for i, m in calls})
    with pytest.raises(SystemExit, match="no neighbour"):
        ri.neighbours(ops[0], ops[:1], None, Op)
    with pytest.raises(SystemExit, match="no neighbour"):
        ri.neighbours(ops[3], ops, None, Op)


def test_race_instances_tells_a_graph_effect_from_sampling_noise():
    """Instance medians apart by more than their bootstrap errors: the spread, its SD and the errors
    are what the docs' table compares (a graph with a speed of its own vs noise alone)."""
    ri = _race_instances()
    rng = random.Random(3)
    tight = [[1.0 * (1 + rng.gauss(0, 0.01)) for _ in range(200)] for _ in range(4)]
    shifted = [[(1.0 + 0.01 * k) * (1 + rng.gauss(0, 0.01)) for _ in range(200)] for k in range(4)]
    ses = [ri.median_se(x, seed=k) for k, x in enumerate(tight)]
    assert all(0.0003 < s < 0.003 for s in ses)  # ~1.25 * 1% / sqrt(200)
    noise = ri.spread_summary([center(x) for x in tight], ses)
    effect = ri.spread_summary([center(x) for x in shifted], [ri.median_se(x) for x in shifted])
    assert noise["sd_of_medians_rel"] < 2 * noise["median_se_rel"]
    assert effect["sd_of_medians_rel"] > 4 * effect["median_se_rel"] and effect["spread"] > 0.02
    # with draws, the error is of settle.center's mean of per-draw medians
    two = [1.0] * 50 + [2.0] * 50
    assert ri.median_se(two, [0] * 50 + [1] * 50) == 0.0


class _Race:
    """``race._Candidates`` without a GPU: ``draws`` token-input draws, every file accepted."""

    def __init__(self, draws=1, calls=None):
        self.draws = [{}] * draws if draws > 1 else []
        self.strata = []  # no span here: tests/tune/careful/test_span.py races the real _Candidates
        self.calls = calls or {}
        self.graph_fallback = None
        self.current = None

    def inputs_for_round(self, r):
        return r % len(self.draws) if self.draws else 0

    def use(self, i):
        self.current = i
        return True

    def call(self):
        _GpuClock.now += self.calls.get(self.current, 1.0)

    call_each_count = call


def test_every_graph_of_every_candidate_is_timed_every_round_each_its_own_stratum():
    """Candidate 2's middle graph is 3% fast: one graph per candidate could crown it; as three strata its
    time is the mean of its graphs' (1.01 / 0.98 / 1.01: 1.0) - level with candidate 0. Candidate 1 is not live."""
    from autotune_cache.tune.careful import race as race_mod

    graphs = [[_Graph(1.0) for _ in range(3)], None, [_Graph(1.01), _Graph(0.98), _Graph(1.01)]]
    samples, tags = race_mod._timed_rounds(_Torch, _Race(draws=2), [0, 2], graphs, None, None, 6, 1, seed=3)
    assert [len(x) for x in samples] == [18, 0, 18]  # 6 rounds x 3 graphs; warm-up rounds not kept
    assert sorted(set(tags[0])) == sorted(set(tags[2])) == list(range(6))  # (draw, graph) = draw * 3 + graph
    assert all(x == pytest.approx(0.98) for x, t in zip(samples[2], tags[2]) if t % 3 == 1)
    assert center(samples[2], tags[2]) == pytest.approx(1.0) == center(samples[0], tags[0])
    one, no_tags = race_mod._timed_rounds(_Torch, _Race(), [0], [[_Graph(1.0)]], None, None, 4, 0, seed=0)
    assert len(one[0]) == 4 and no_tags is None  # one draw, one graph: untagged, as before
    _, graph_tags = race_mod._timed_rounds(_Torch, _Race(), [0], [[_Graph(1.0), _Graph(0.9)]], None, None, 4, 0, seed=0)
    assert graph_tags is not None and sorted(set(graph_tags[0])) == [0, 1]  # one draw, two graphs: two strata


def test_a_capture_that_fails_runs_every_candidate_eagerly_and_says_why(monkeypatch):
    from autotune_cache.tune.careful import race as race_mod

    made = []

    def capture(torch, call):
        made.append(1)
        return _Graph(1.0)

    monkeypatch.setattr(race_mod, "_capture", capture)
    errors, graphs, graph = race_mod._first_runs(_Torch, _Race(), 2, True, instances=3)
    assert graph and [len(g) for g in graphs] == [3, 3] and len(made) == 6 and errors == [None, None]

    def fails_on_the_fourth(torch, call):
        made.append(1)
        if len(made) == 4:
            raise RuntimeError("out of memory")
        return _Graph(1.0)

    made.clear()
    monkeypatch.setattr(race_mod, "_capture", fails_on_the_fourth)
    c = _Race()
    errors, graphs, graph = race_mod._first_runs(_Torch, c, 2, True, instances=3)
    assert not graph and graphs == [None, None] and c.graph_fallback == "RuntimeError: out of memory"
