"""Careful tuning: the selection rules (no GPU), and warm's careful mode with real worker
processes (tests/standins/fake_worker.py stands in for the GPU part; the real race runs in test_gpu.py)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from autotune_cache.errors import FiAutotuneError
from autotune_cache.tune.careful.quality import (DEFAULT_THRESHOLD, Candidate, QualitySettings, SlotRecord, apply_selection,
                                    candidates, choose)
from autotune_cache.autotuner.rankfile import RESERVED_KEYS, parse_file_key
from autotune_cache.plan.request import TuneRequest
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.tune.workers.gpus import GpuInfo
from autotune_cache.tune.workers.pool import WorkerPool
from autotune_cache.tune.session.warm import warm

from tests.conftest import REPO

POLICY = ["l2_cache_policy", "hot"]
K1 = "('gemm1', 'CutlassRunner', ((64, 2048),), ())"
K2 = "('gemm2', 'CutlassRunner', ((64, 768),), ())"
K1_OTHER = "('gemm1', 'CudnnRunner', ((64, 2048),), ('x',))"


def recs(*pairs):
    return [SlotRecord(slot, key, "CutlassRunner") for slot, key in pairs]


# -- selection rules ---------------------------------------------------------------------------

def test_candidates_are_distinct_assignments_most_chosen_first_then_the_default():
    records = [recs((K1, K1), (K2, K2))] * 3
    tunes = [{K1: ["CutlassRunner", 5, POLICY], K2: ["CutlassRunner", 2, POLICY]},
             {K1: ["CutlassRunner", 7, POLICY], K2: ["CutlassRunner", 2, POLICY]},
             {K1: ["CutlassRunner", 7, POLICY], K2: ["CutlassRunner", 2, POLICY]}]
    cands = candidates(records, tunes)
    assert [c.sources for c in cands] == [(1, 2), (0,), ()]
    assert cands[0].entries() == {K1: ["CutlassRunner", 7, POLICY], K2: ["CutlassRunner", 2, POLICY]}
    default = cands[-1]
    assert default.default and default.entries() == {K1: ["CutlassRunner", -1, POLICY], K2: ["CutlassRunner", -1, POLICY]}
    assert default.describe() == "default (tactic -1)"


def test_a_tune_that_chose_the_default_is_the_default_candidate():
    records = [recs((K1, K1))] * 2
    tunes = [{K1: ["CutlassRunner", -1, POLICY]}, {K1: ["CutlassRunner", 3, POLICY]}]
    cands = candidates(records, tunes)
    assert len(cands) == 2 and sum(c.default for c in cands) == 1
    assert next(c for c in cands if c.default).sources == (0,)


def test_a_tune_missing_a_slot_offers_nothing_and_other_runners_share_the_slot():
    records = [recs((K1, K1), (K2, K2)), recs((K1, K1_OTHER), (K2, K2)), recs((K2, K2)), None]
    tunes = [{K1: ["CutlassRunner", 1], K2: ["CutlassRunner", 1]},
             {K1_OTHER: ["CudnnRunner", 4], K2: ["CutlassRunner", 1]},
             {K2: ["CutlassRunner", 9]}, {}]
    cands = candidates(records, tunes)
    assert [c.sources for c in cands[:-1]] == [(0,), (1,)]  # tunes 2 (slot missing) and 3 (nothing) offer nothing
    assert cands[1].entries()[K1_OTHER] == ["CudnnRunner", 4]
    assert cands[-1].default and set(cands[-1].entries()) == {K1, K2}  # the default sits in runners[0]'s key


def test_runners_up_race_as_the_most_chosen_assignment_with_one_slot_changed():
    alt1 = ((K1, "CutlassRunner", 9), (K1, "CutlassRunner", 5), (K1_OTHER, "CudnnRunner", 3))
    records = [[SlotRecord(K1, K1, "CutlassRunner", alt1), SlotRecord(K2, K2, "CutlassRunner", ((K2, "CutlassRunner", 4),))],
               [SlotRecord(K1, K1, "CutlassRunner", ((K1, "CutlassRunner", 9),)), SlotRecord(K2, K2, "CutlassRunner")]]
    tunes = [{K1: ["CutlassRunner", 5, POLICY], K2: ["CutlassRunner", 2, POLICY]},
             {K1: ["CutlassRunner", 7, POLICY], K2: ["CutlassRunner", 2, POLICY]}]
    assert [c.describe() for c in candidates(records, tunes)] == [
        "gemm1=CutlassRunner:5 gemm2=CutlassRunner:2", "gemm1=CutlassRunner:7 gemm2=CutlassRunner:2", "default (tactic -1)"]
    cands = candidates(records, tunes, top_k=2)
    described = [c.describe() for c in cands]
    # tune 0's first two runners-up of gemm1 (9; 5 is already tune 0's own pick, so it repeats an
    # assignment), its gemm2 runner-up, tune 1's (9 again: not repeated); the default last
    assert described == ["gemm1=CutlassRunner:5 gemm2=CutlassRunner:2", "gemm1=CutlassRunner:7 gemm2=CutlassRunner:2",
                         "gemm1=CutlassRunner:9 gemm2=CutlassRunner:2", "gemm1=CutlassRunner:5 gemm2=CutlassRunner:4",
                         "default (tactic -1)"]
    assert cands[2].sources == () and cands[2].entries()[K1] == ["CutlassRunner", 9, POLICY]
    # another runner's runner-up sits under its own key, and no key of the slot is left twice
    third = candidates(records, tunes, top_k=3)[3]
    assert third.entries() == {K1_OTHER: ["CudnnRunner", 3, POLICY], K2: ["CutlassRunner", 2, POLICY]}


def test_slot_records_keep_their_runners_up_through_the_done_file():
    r = SlotRecord(K1, K1, "CutlassRunner", ((K1, "CutlassRunner", 9), (K1_OTHER, "CudnnRunner", [1, 2])))
    back = SlotRecord.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r
    assert "alt" not in SlotRecord(K1, K1, "R").to_dict() and SlotRecord.from_dict({"slot": K1, "key": K1, "default_runner": "R"}).alternatives == ()


def test_choose_floor_against_the_default():
    tuned, default = Candidate({K1: (K1, ["R", 4])}, (0, 1, 2)), Candidate({K1: (K1, ["R", -1])}, default=True)
    cands = [tuned, default]
    win = choose(cands, [1.0, 1.10])
    assert win.winner == 0 and not win.kept_default and win.margin_default == pytest.approx(0.10)
    assert win.tunes_agreeing == 3
    kept = choose(cands, [1.0, 1.004])  # 0.4% < the 0.5% tie: the default stays
    assert kept.winner == 1 and kept.kept_default and "0.40% faster" in kept.reason and "< 0.50%" in kept.reason
    assert choose(cands, [1.0, 1.008]).winner == 0  # 0.8%: kept by the old 1% floor, written now (issue 47)
    assert choose(cands, [1.0, 1.02], threshold=0.03).kept_default  # 2% < a 3% floor
    edge = choose(cands, [1.0, 1.0 + DEFAULT_THRESHOLD + 1e-9])
    assert edge.winner == 0
    assert choose(cands, [1.0, 1.02], threshold=0.0).winner == 0
    assert choose(cands, [1.2, 1.0]).winner == 1 and choose(cands, [1.2, 1.0]).reason == "the default was fastest"


def test_choose_never_picks_a_candidate_that_failed():
    a, b = Candidate({K1: (K1, ["R", 4])}, (0,)), Candidate({K1: (K1, ["R", 6])}, (1, 2))
    d = Candidate({K1: (K1, ["R", -1])}, default=True)
    assert choose([a, b, d], [math.inf, 1.0, 2.0]).winner == 1
    s = choose([a, b, d], [0.5, 1.0, math.inf])  # the default failed: the fastest tuned wins, no floor
    assert s.winner == 0 and s.reason == "the default failed to run"
    nothing = choose([a, b, d], [math.inf] * 3)
    assert nothing.winner == 0 and "could be measured" in nothing.reason
    with pytest.raises(ValueError):
        choose([a, b], [1.0])


def test_apply_selection_leaves_exactly_the_winners_key_per_slot():
    records = [recs((K1, K1)), recs((K1, K1_OTHER))]
    entries = {K1: ["CutlassRunner", 1], K1_OTHER: ["CudnnRunner", 4], K2: ["CutlassRunner", 2]}
    winner = Candidate({K1: (K1_OTHER, ["CudnnRunner", 4])}, (1,))
    out = apply_selection(entries, records, winner)
    assert out == {K1_OTHER: ["CudnnRunner", 4], K2: ["CutlassRunner", 2]}  # K1 would shadow it (runners[0] first)


def test_settings_race_graph_only_at_decode_sizes():
    q = QualitySettings("careful", graph_max_tokens=256)
    assert q.race_settings(256)["graph"] and not q.race_settings(512)["graph"]
    assert QualitySettings().to_dict() == {"mode": "quick", "tunes": 1}


def test_settings_span_eager_races_over_the_counts_the_entry_serves():
    q = QualitySettings("careful", graph_max_tokens=256, span=5)
    assert q.race_settings(1024, "gemm")["span"] == [769, 833, 896, 960, 1024]
    assert q.race_settings(1024, "moe_clamped")["span"] == [769, 833, 896, 960, 1024]
    assert "span" not in q.race_settings(256, "gemm")  # a graph replays the engine's one padded size
    assert "span" not in q.race_settings(1024, "mla")  # its lookup maps a count down
    assert "span" not in q.race_settings(1024)  # no rule known
    assert "span" not in QualitySettings("careful", span=1).race_settings(1024, "gemm")
    assert q.to_dict()["span"] == 5


# -- warm --quality careful with real worker processes ------------------------------------------

FAKE = [sys.executable, str(REPO / "tests" / "standins" / "fake_worker.py")]
H200 = GpuInfo(2, "sm90", ("NVIDIA H200", "NVIDIA H200"))


@pytest.fixture
def plan(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    request = TuneRequest("Qwen/Qwen3-30B-A3B", ServerFlags(tp=2, moe_runner_backend="flashinfer_cutlass"), arch="sm90",
                          flashinfer_version="0.7.2.post1")
    return request.plan(tmp_path / "root")


def careful(plan, monkeypatch, tunes="disagree", gain="0.10", gpus=2, **kw):
    monkeypatch.setenv("FAKE_WORKER_MODE", "ok")
    monkeypatch.setenv("FAKE_TUNES", tunes)
    monkeypatch.setenv("FAKE_RACE_GAIN", gain)
    q = QualitySettings("careful", repeats=3, **kw.pop("q", {}))
    return warm(plan, gpus=gpus, gpu_info=H200, pool=WorkerPool(gpus, argv=FAKE), quality=q, **kw)


def entries_of(result) -> dict:
    return {k: v for k, v in json.loads(Path(result.rank_files[0]).read_bytes()).items() if k not in RESERVED_KEYS}


def test_careful_races_every_bucket_and_writes_the_winners(plan, monkeypatch, tmp_path):
    log = tmp_path / "races.log"
    monkeypatch.setenv("FAKE_RACE_LOG", str(log))
    r = careful(plan, monkeypatch)
    op = plan.workloads[0].ops[0]
    assert r.status == "written" and r.profiles_total == 3 * 42  # three tunes of 21 buckets x 2 GEMMs
    races = [json.loads(x) for x in log.read_text().splitlines()]
    assert sorted(x["bucket"] for x in races) == sorted(op.buckets * 2)  # per bucket: a race, then its pair round
    graph_max = plan.resolution.decode_batch * plan.resolution.attn_dp_size
    assert all(x["graph"] == (x["bucket"] <= graph_max) for x in races)
    # an eager race times the counts its entry serves (the MoE's lookup rounds up: (previous bucket, bucket]),
    # a graph race the bucket's own
    below = dict(zip(op.buckets[1:], op.buckets))
    assert all(x["span"] is None for x in races if x["graph"])
    eager = [x for x in races if not x["graph"]]
    assert eager and all(x["span"][-1] == x["bucket"] and x["span"][0] == below[x["bucket"]] + 1
                         and len(x["span"]) == 5 for x in eager)
    entries = entries_of(r)
    assert len(entries) == 42  # one key per slot
    for key, value in entries.items():
        b = parse_file_key(key).profile[0][0]
        # tunes 0,1,2 picked (b+r)%3: three candidates + the default; the fake times candidate 0 fastest
        assert value[:2] == ["MoERunner", b % 3] and value[2] == ["l2_cache_policy", "hot"]
    (entry,) = scan_cache(plan.cache_root).entries
    m = entry.manifest
    assert m.stats["quality"] == "careful" and m.stats["selection"]["buckets"] == 21
    assert m.stats["selection"]["tuned_written"] == 21 and m.stats["selection"]["tunes_unanimous"] == 0
    per_bucket = m.extra["selection"]["ops"][op.to_dict()["id"]]
    rec = per_bucket[str(op.buckets[0])]
    assert rec["raced"] and len(rec["first_race"]["candidates"]) == 4 and len(rec["candidates"]) == 10
    assert rec["margin_default"] == pytest.approx(0.10, abs=1e-3)
    assert m.extra["selection"]["settings"]["mode"] == "careful" and m.extra["selection"]["settings"]["tunes"] == 3
    assert r.selection["raced"] == 21 and "racing_s" in r.timings


def test_careful_keeps_the_default_under_the_threshold(plan, monkeypatch):
    r = careful(plan, monkeypatch, gain="0.004")  # under the 0.5% floor
    entries = entries_of(r)
    assert len(entries) == 42 and all(v[:2] == ["MoERunner", -1] for v in entries.values())
    assert all(v[2] == ["l2_cache_policy", "hot"] for v in entries.values())  # the engine's lookup checks it
    assert r.selection["default_kept_by_floor"] == 21 and r.selection["tuned_written"] == 0


def test_careful_threshold_zero_takes_any_gain(plan, monkeypatch):
    r = careful(plan, monkeypatch, gain="0.004", q={"threshold": 0.0})
    assert all(v[1] != -1 for v in entries_of(r).values())


def test_careful_with_two_runners_writes_one_key_per_slot(plan, monkeypatch):
    r = careful(plan, monkeypatch, tunes="two-runners")
    entries = entries_of(r)
    assert len(entries) == 42
    slots = {(p.custom_op, p.profile) for p in map(parse_file_key, entries)}
    assert len(slots) == 42  # never a MoERunner and an OtherRunner key for one lookup


def test_careful_resume_keeps_finished_races(plan, monkeypatch, tmp_path):
    log = tmp_path / "races.log"
    monkeypatch.setenv("FAKE_RACE_LOG", str(log))
    monkeypatch.setenv("FAKE_RACE_CRASH_AFTER", "4")
    with pytest.raises(FiAutotuneError, match="nothing was written"):
        careful(plan, monkeypatch, gpus=1)
    assert not scan_cache(plan.cache_root).entries
    first = len(log.read_text().splitlines())
    assert first == 4
    monkeypatch.delenv("FAKE_RACE_CRASH_AFTER")
    r = careful(plan, monkeypatch, gpus=2)
    assert r.profiles_tuned == 0  # every tune was saved before racing began
    assert len(log.read_text().splitlines()) == 42  # 21 races + 21 pair rounds: the 4 finished not run again
    assert len(entries_of(r)) == 42


def test_quick_and_careful_work_never_mix(plan, monkeypatch):
    from autotune_cache.tune.careful.workdir import work_dir

    assert work_dir(plan) != work_dir(plan, QualitySettings("careful"))
    assert work_dir(plan) == work_dir(plan, QualitySettings())


def test_show_reports_how_each_tactic_was_chosen(plan, monkeypatch):
    import subprocess

    careful(plan, monkeypatch)
    (entry,) = scan_cache(plan.cache_root).entries
    run = lambda *a: subprocess.run([sys.executable, "-m", "fi_autotune_cli", *a], capture_output=True, text=True)  # noqa: E731
    out = run("show", str(entry.id), "--cache-dir", str(plan.cache_root), "--buckets")
    assert out.returncode == 0, out.stderr
    assert "Selection careful: 3 tunes per (op, bucket)" in out.stdout
    assert "a 20-run screen, then 50-300 runs for those within 3.0% of the fastest" in out.stdout  # from the manifest
    assert "the mean of its medians over 4 input draws" in out.stdout  # the manifest's input_draws
    assert (", 3 graphs of each candidate timed every round, eager ones over 5 token counts of the bucket's range;"
            in out.stdout)  # its graph_instances and span
    op_row = next(line for line in out.stdout.splitlines() if line.startswith("moe.") and "+10.0%" in line)
    assert op_row.split()[1:6] == ["21", "21", "0", "0", "0"]  # 21 buckets, all tuned, none unanimous
    bucket_rows = [line for line in out.stdout.splitlines() if line.startswith("moe.") and "1/3" in line]
    assert len(bucket_rows) == 21
    data = json.loads(run("show", str(entry.id), "--cache-dir", str(plan.cache_root), "--json").stdout)
    assert data["entries"][0]["manifest"]["extra"]["selection"]["settings"]["mode"] == "careful"


def test_threshold_must_be_a_number():
    from tests.conftest import run_cli

    cands = [Candidate({K1: (K1, ["R", 4])}, (0,)), Candidate({K1: (K1, ["R", -1])}, default=True)]
    with pytest.raises(ValueError, match="finite"):
        choose(cands, [1.0, 1.01], threshold=float("nan"))
    proc = run_cli("warm", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--quality", "careful", "--threshold", "nan")
    assert proc.returncode == 2 and "--threshold nan" in proc.stderr
    proc = run_cli("warm", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--repeats", "3")
    assert proc.returncode == 2 and "--repeats applies to --quality careful only" in proc.stderr
