"""Adding an engine to ``doctor`` touches only that engine's package: the test-only toy engine
(tests/support/toy_engine.py) brings its own log dialect, registered by one line, and doctor
reads its boot - ranks, passes, FlashInfer's bars and lines under its prefix, its version, the
cause and the fix - with nothing in autotune_cache/logs/ changed. Unregistered, its lines are
not read at all. And the built-in engines' dialects are the very objects their engines hand out."""

from __future__ import annotations

import pytest

from autotune_cache import registry
from autotune_cache.logs.diagnose import diagnose
from autotune_cache.logs.formats import dialects

ENTRY = "0.7.2.post1/sm90/0123456789abcdef"
BAR = "[AutoTuner]: Tuning trtllm::fused_moe::gemm1: 100%|##########| 21/21 [00:27<00:00,  1.30s/profile]"


def _toy_log(version: str = "1.0") -> str:
    lines = [f"<toy rank=0 12:00:00> toy: version {version}"]
    for rank in (0, 1):
        path = f"/srv/toy/toy-autotune/{ENTRY}/rank_tp{rank}_pp0_dp0.json"
        lines.append(f"<toy rank={rank} 12:00:01> toy: autotune reading {path}")
    lines += [BAR, BAR]  # rank-less: each rank prints one, in step
    lines += [f"<toy rank={rank} 12:00:29> toy: autotune done" for rank in (0, 1)]
    return "\n".join(lines) + "\n"


@pytest.fixture
def toy(tmp_path, monkeypatch):
    registry.register_engine("toy", "tests.support.toy_engine:ENGINE")  # the one line
    tree = tmp_path / "toy-root"
    (tree / "toy-autotune").mkdir(parents=True)
    monkeypatch.setenv("TOY_CACHE_DIR", str(tree))
    yield tree
    registry.unregister_engine("toy")


def test_doctor_reads_a_registered_engines_log_in_its_own_dialect(toy):
    report = diagnose([("toy.log", _toy_log())], [toy]).to_dict()
    assert report["understood"]["toy"] == "1.0" and report["warnings"] == []
    (server,) = report["servers"]
    assert server["engine"] == "toy" and [r["rank"] for r in server["ranks"]] == ["toy0", "toy1"]
    assert server["tuned"] and [o["op"] for o in server["shared_tuning"]] == ["trtllm::fused_moe::gemm1"]
    assert server["tuning_seconds"] == 27  # two ranks, one bar each, in step: 27 s, not 54
    for rank in server["ranks"]:
        (s,) = rank["sessions"]
        assert s["layout"] == "toy" and s["entry"] == f"toy:{ENTRY}" and s["complete"] and s["server_root"] == "/srv/toy"
        assert s["cause_kind"] == "no-entry" and s["cache"] == "absent"
        assert s["fix"]["command"] == "fi-autotune warm --cache-dir /srv/toy -- toy-serve <the server's flags>"


def test_a_release_other_than_the_dialects_is_read_with_a_warning_naming_every_dialect(toy):
    report = diagnose([("toy.log", _toy_log(version="2.0"))], [toy])
    (warning,) = report.warnings
    assert warning.startswith("Toy 2.0 (server toy.log): the log formats read are those of ")
    assert "SGLang 0.5.23, vLLM 0.33.0, Toy 1.0 and FlashInfer 0.7.2.post1" in warning


def test_unregistered_its_lines_are_not_read():
    report = diagnose([("toy.log", _toy_log())], [])
    assert "toy" not in report.to_dict()["understood"]
    assert all(s["engine"] != "toy" for s in report.servers)
    assert all(not r["rank"].startswith("toy") for s in report.servers for r in s["ranks"])


def test_the_dialect_table_names_the_very_objects_the_engines_hand_out():
    """``registry.KNOWN_LOG_DIALECTS`` (what doctor imports, without the planners) and each
    built-in engine's ``log_dialect``: the same objects; FlashInfer's own lines come last."""
    engines = {e.name: e.log_dialect for e in registry.engines() if e.log_dialect is not None}
    assert list(engines) == list(registry.KNOWN_LOG_DIALECTS) == ["sglang", "vllm"]
    assert all(a is b for a, b in zip(engines.values(), registry.log_dialects()))
    assert [d.name for d in dialects()] == ["sglang", "vllm", "flashinfer"]
