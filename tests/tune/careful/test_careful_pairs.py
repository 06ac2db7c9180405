"""Careful's pair round (``careful.pair_candidates``, ``plan_pair_races``): each slot's fastest
values in the first race crossed into whole assignments, so the best pair of a MoE call's GEMMs is
raced even when no tune offered it (no GPU: the selection logic, then warm with the fake worker)."""

from __future__ import annotations

import json
import math

import pytest

from autotune_cache.autotuner.rankfile import parse_file_key
from autotune_cache.errors import FiAutotuneError
from autotune_cache.tune.careful.careful import MAX_PAIRS, RacePlan, pair_candidates, plan_pair_races, slot_finalists
from autotune_cache.tune.careful.quality import Candidate, QualitySettings, default_candidate
from autotune_cache.tree.scanner.scan import scan_cache

from tests.tune.careful.test_quality import K1, K2, POLICY, careful, entries_of, plan  # noqa: F401 - plan is a fixture

K3 = "('gemm3', 'CutlassRunner', ((64, 512),), ())"


def cand(t1, t2, sources=()):
    return Candidate({K1: (K1, ["CutlassRunner", t1, POLICY]), K2: (K2, ["CutlassRunner", t2, POLICY])}, sources)


DEFAULT = default_candidate({K1: "CutlassRunner", K2: "CutlassRunner"}, POLICY)


def tactics(c: Candidate) -> tuple:
    return tuple(c.values[s][1][1] for s in sorted(c.values))


def test_the_pair_no_tune_offered_is_formed_winner_first_default_last():
    # Mixtral TP2 at 256 tokens: gemm1 43 was raced only beside gemm2 53, gemm2 55 only beside gemm1 8
    cands = [cand(8, 53, (0, 1)), cand(43, 53, (2,)), cand(8, 55), DEFAULT]
    pairs = pair_candidates(cands, [1.00, 1.02, 1.01, 1.10], k=2)
    assert [tactics(c) for c in pairs] == [(8, 53), (8, 55), (43, 53), (43, 55), (-1, -1)]
    assert pairs[0].sources == (0, 1) and pairs[2].sources == (2,)  # the tunes that chose it are kept
    assert pairs[-1].default and not any(c.default for c in pairs[:-1])
    assert pairs[1].entries() == {K1: ["CutlassRunner", 8, POLICY], K2: ["CutlassRunner", 55, POLICY]}


def test_finalists_are_ranked_by_their_best_race_and_skip_failures_and_the_default():
    cands = [cand(8, 53), cand(43, 53), cand(9, 54), DEFAULT]
    medians = [1.00, math.inf, 1.05, 0.90]  # 43 failed to run; the default was fastest
    fin = slot_finalists(cands, medians, k=3)
    assert [v[1] for _, v in fin[K1]] == [8, 9]
    assert [v[1] for _, v in fin[K2]] == [53, 54]


def test_no_pair_round_when_the_product_forms_nothing_new():
    cands = [cand(8, 53), cand(8, 55), DEFAULT]  # gemm1 has one finalist: the product is what raced
    assert pair_candidates(cands, [1.0, 1.01, 1.1], k=3) == []
    assert pair_candidates(cands, [1.0, 1.01, 1.1], k=1) == []  # k 1: the winner alone


def test_no_pair_round_for_a_single_slot():
    one = [Candidate({K1: (K1, ["R", t])}) for t in (1, 2, 3)]
    assert pair_candidates(one, [1.0, 1.1, 1.2], k=3) == []


def test_the_product_is_capped_with_many_slots():
    def c3(a, b, c):
        return Candidate({K1: (K1, ["R", a]), K2: (K2, ["R", b]), K3: (K3, ["R", c])})

    cands = [c3(t, t, t) for t in range(1, 6)]
    pairs = pair_candidates(cands, [1.0, 1.1, 1.2, 1.3, 1.4], k=4)  # 64 > MAX_PAIRS: three per slot
    assert len(pairs) == 27 <= MAX_PAIRS
    assert {tactics(c) for c in pairs} == {(a, b, c) for a in (1, 2, 3) for b in (1, 2, 3) for c in (1, 2, 3)}


def test_the_default_pair_round_reaches_a_slots_fifth_value():
    # Qwen3-30B-A3B TP2 EP2 at 2048 tokens, careful's first race over the span (H200, us): beside
    # gemm1 32, gemm2 70 ranked 5th; the reference's best pair (25, 70) was never raced with four
    # finalists a slot, and careful's pick (25, 55) read 1.3% slower than it in both reference runs.
    first = [(25, 77, 274.5), (8, 77, 275.1), (32, 55, 275.6), (32, 77, 276.4), (32, 78, 276.4), (33, 77, 276.7),
             (10, 77, 276.9), (32, 53, 277.0), (32, 70, 277.2), (32, 57, 277.5), (12, 77, 278.1), (32, 69, 278.1)]
    cands = [cand(a, b) for a, b, _ in first] + [DEFAULT]
    medians = [us / 1000 for *_, us in first] + [0.9447]
    pairs = {tactics(c) for c in pair_candidates(cands, medians, k=QualitySettings("careful").pair_k)}
    assert (25, 70) in pairs
    assert (25, 70) not in {tactics(c) for c in pair_candidates(cands, medians, k=4)}


def test_an_assignment_missing_a_slot_stops_the_pair_round():
    partial = Candidate({K1: (K1, ["R", 7])})
    assert pair_candidates([cand(8, 53), cand(43, 55), partial], [1.0, 1.01, 1.02], k=2) == []


def _first_race(tmp_path, medians, pair_k=3):
    cands = (cand(8, 53, (0,)), cand(43, 53, (1,)), cand(8, 55, (2,)), DEFAULT)
    spec, result = tmp_path / "race.op0.b256.json", tmp_path / "race.op0.b256.result.json"
    spec.write_text(json.dumps({"layer": 0, "op": {"id": "moe"}, "bucket": 256, "metadata": {"gpu": "H100"},
                                "assignments": [c.entries() for c in cands], "settings": {"rounds": 50},
                                "result": str(result), "seed": 256}))
    if medians is not None:
        result.write_text(json.dumps({"medians_ms": medians}))
    return [RacePlan(0, 256, (None,), cands, spec, result)], QualitySettings("careful", pair_k=pair_k)


def test_plan_pair_races_writes_a_spec_like_the_first_races(tmp_path):
    races, q = _first_race(tmp_path, [1.0, 1.02, 1.01, None])  # the default failed to run
    (pp,) = plan_pair_races(tmp_path, races, q)
    assert pp.spec.name == "race.op0.b256.pair.json" and not pp.result.exists()
    spec = json.loads(pp.spec.read_text())
    assert spec["metadata"] == {"gpu": "H100"} and spec["settings"] == {"rounds": 50} and spec["bucket"] == 256
    assert spec["result"] == str(pp.result) and spec["seed"] == 256 + 500_000
    assert len(spec["assignments"]) == 5 == len(pp.candidates)  # 2 x 2 pairs and the default
    assert spec["assignments"][0] == races[0].candidates[0].entries()


def test_plan_pair_races_keeps_a_finished_pair_race(tmp_path):
    races, q = _first_race(tmp_path, [1.0, 1.02, 1.01, 1.1])
    (pp,) = plan_pair_races(tmp_path, races, q)
    pp.result.write_text("{}")
    before = pp.spec.read_text()
    pp.spec.write_text("kept")
    (again,) = plan_pair_races(tmp_path, races, q)
    assert again.spec.read_text() == "kept" and before != "kept"


@pytest.mark.parametrize("why", ["pair_k 0", "no result", "unreadable result"])
def test_plan_pair_races_skips(tmp_path, why):
    races, q = _first_race(tmp_path, None if why == "no result" else [1.0, 1.02, 1.01, 1.1],
                           pair_k=0 if why == "pair_k 0" else 3)
    if why == "unreadable result":
        races[0].result.write_text("{not json")
    assert plan_pair_races(tmp_path, races, q) == []


# -- warm --quality careful with the pair round (tests/standins/fake_worker.py) -------------------------

def _tactics_per_bucket(result) -> dict:
    out: dict = {}
    for key, value in sorted(entries_of(result).items()):
        out.setdefault(parse_file_key(key).profile[0][0], []).append(value[1])
    return out


def test_careful_writes_the_pair_rounds_winner(plan, monkeypatch, tmp_path):  # noqa: F811
    log = tmp_path / "races.log"
    monkeypatch.setenv("FAKE_RACE_LOG", str(log))
    monkeypatch.setenv("FAKE_PAIR_FASTEST", "1")  # the first race's winner with gemm2 changed
    r = careful(plan, monkeypatch)
    races = [json.loads(x) for x in log.read_text().splitlines()]
    # per bucket: the first race (3 tunes' winners + the default), then 3 x 3 pairs + the default
    assert sorted(x["n"] for x in races) == [4] * 21 + [10] * 21
    per_bucket = _tactics_per_bucket(r)
    assert len(per_bucket) == 21
    for b, t in per_bucket.items():  # a mixed pair no tune chose: each tune picked (b + r) % 3 for both
        assert len(t) == 2 and set(t) <= {0, 1, 2} and t[0] != t[1]
    assert r.selection["raced"] == 21 and r.selection["tuned_written"] == 21
    (entry,) = scan_cache(plan.cache_root).entries
    rec = next(iter(entry.manifest.extra["selection"]["ops"].values()))[str(min(per_bucket))]
    assert rec["pair_round"] and len(rec["candidates"]) == 10 and len(rec["first_race"]["candidates"]) == 4
    assert rec["winner"] != rec["first_race"]["winner"]


def test_careful_pair_round_off_races_once(plan, monkeypatch, tmp_path):  # noqa: F811
    log = tmp_path / "races.log"
    monkeypatch.setenv("FAKE_RACE_LOG", str(log))
    monkeypatch.setenv("FAKE_PAIR_FASTEST", "1")
    r = careful(plan, monkeypatch, q={"pair_k": 0})
    assert len(log.read_text().splitlines()) == 21
    assert all(len(t) == 2 and t[0] == t[1] for t in _tactics_per_bucket(r).values())  # a tune's own pair


def test_an_unreadable_pair_round_result_fails_the_run_and_writes_nothing(plan, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FAKE_PAIR_UNREADABLE", "1")
    with pytest.raises(FiAutotuneError, match="race result of .* unreadable"):
        careful(plan, monkeypatch)
    assert not scan_cache(plan.cache_root).entries


def test_a_pair_race_runs_in_the_first_races_context(tmp_path):
    races, q = _first_race(tmp_path, [1.0, 1.02, 1.01, 1.1])
    spec = json.loads(races[0].spec.read_text())
    context = [{"layer": 1, "op": {"id": "linear.down_proj"}}]
    races[0].spec.write_text(json.dumps({**spec, "context": context}))
    (pp,) = plan_pair_races(tmp_path, races, q)
    assert json.loads(pp.spec.read_text())["context"] == context
