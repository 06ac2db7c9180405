"""The analysis half of benchmarks/tactic_quality.py (no GPU): the floor sweep that docs/quality.md
uses to justify the default threshold. It replays each careful cache's recorded race at other
thresholds and looks the choice up in the re-measurement; a choice no cache holds must come out
as unknown, never as a guess."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from autotune_cache.autotuner.recipe import OpRecipe

from tests.conftest import REPO, run_cli

POLICY = ["l2_cache_policy", "hot"]


def _tactic_quality():
    spec = importlib.util.spec_from_file_location("tactic_quality", REPO / "benchmarks" / "tactic_quality.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _careful_cache(work: Path, name: str, key: str, tactic: int, race: dict) -> None:
    d = work / name / "flashinfer" / "autotune" / "0.7.2.post1" / "sm90" / "0123456789abcdef"
    d.mkdir(parents=True)
    (d / "rank_tp0_pp0_dp0.json").write_text(json.dumps({key: ["CublasFp8GemmRunner", tactic, POLICY]}))
    manifest = {"stats": {"tuning_gpu_s": 1.0, "racing_gpu_s": 0.1},
                "extra": {"selection": {"ops": {"linear.qkv_proj": {"1": race}}}}}
    (d / "fi-autotune.manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def dense_work(tmp_path_factory) -> tuple[Path, dict]:
    work = tmp_path_factory.mktemp("quality") / "work-dense-fp8"
    work.mkdir()
    proc = run_cli("plan", "--model", "nvidia/Llama-3.1-70B-Instruct-FP8", "--tp", "4", "--arch", "sm90", "--json")
    assert proc.returncode == 0, proc.stderr
    (plan,) = json.loads(proc.stdout)["workers"]  # as benchmarks/tactic_quality.py writes it
    (work / "plan.json").write_text(json.dumps(plan))
    op = plan["workloads"][0]["ops"][0]
    (key,) = OpRecipe.from_dict(op).file_keys(1)
    # careful0's race: tactic 5 beat the default by 1.5%, so it was written at a 1% floor;
    # careful1's: tactic 7 beat it by 0.5%, so the default stayed.
    _careful_cache(work, "careful0", key, 5, {"candidates": ["fp8_gemm=CublasFp8GemmRunner:5", "default (tactic -1)"],
                                              "medians_ms": [0.100, 0.1015]})
    _careful_cache(work, "careful1", key, -1, {"candidates": ["fp8_gemm=CublasFp8GemmRunner:7", "default (tactic -1)"],
                                               "medians_ms": [0.100, 0.1005]})
    # The re-measurement of what the two caches hold: tactic 5 at 0.100 ms, the default at 0.103 ms.
    result = {"k": 2, "caches": ["careful0", "careful1"],
              "items": [{"op": op["id"], "op_index": 0, "bucket": 1, "per_cache_ms": [0.100, 0.103]}]}
    return work, result


def test_floor_sweep_replays_each_race_and_never_guesses(dense_work):
    work, result = dense_work
    rows = {r["threshold"]: r for r in _tactic_quality().floor_sweep(result, work, thresholds=(0.0, 0.01, 0.02))["rows"]}
    # No floor: careful1 would have written tactic 7, which no cache holds: unknown, not scored.
    assert rows[0.0]["unknown"] == 1 and rows[0.0]["default_kept"] == 0
    assert rows[0.0]["within_2pct_of_best"] == 1.0 and rows[0.0]["choices"] == 2
    # 1% (what the caches were made with): careful0 tactic 5 (best), careful1 the default (+3%).
    assert rows[0.01]["unknown"] == 0 and rows[0.01]["default_kept"] == 1
    assert rows[0.01]["within_2pct_of_best"] == 0.5 and rows[0.01]["worst_ratio"] == pytest.approx(1.03)
    assert rows[0.01]["agreement_within_1pct"] == 0.0
    # 2%: both keep the default - they agree, and both are 3% slower than the best.
    assert rows[0.02]["default_kept"] == 2 and rows[0.02]["within_2pct_of_best"] == 0.0
    assert rows[0.02]["agreement_within_1pct"] == 1.0 and rows[0.02]["geomean_slowdown"] == pytest.approx(0.03)


def test_floor_sweep_refuses_a_work_dir_of_other_caches(dense_work):
    work, result = dense_work
    with pytest.raises(SystemExit, match="other caches"):
        _tactic_quality().floor_sweep({**result, "caches": ["careful0"]}, work)
