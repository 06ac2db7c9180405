"""``doctor`` on the recorded startup logs (tests/data/engine_logs/, README there): real files,
the real command in a real process, one cause per fixture, exit 0 / 1 / 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune_cache.plan.entry_key import KeyFields
from autotune_cache.plan.topology import Topology
from devtools.synthetic import write_fake_entry

from ..conftest import run_cli

LOGS = Path(__file__).resolve().parents[1] / "data" / "engine_logs"
QWEN = KeyFields("Qwen/Qwen3-30B-A3B", "bfloat16", None, "flashinfer_cutlass", 2, 1, 1, 1, "Qwen3MoeConfig")
QWEN_ID = "0.7.2.post1/sm90/c2dc70e43f92ac81"


def doctor(*args: str, code: int) -> dict:
    proc = run_cli("doctor", *args, "--json")
    assert proc.returncode == code, proc.stderr
    return json.loads(proc.stdout)


def sessions(report: dict) -> list[dict]:
    return [s for server in report["servers"] for r in server["ranks"] for s in r["sessions"]]


@pytest.fixture
def qwen_tree(root) -> Path:
    eid = write_fake_entry(root, QWEN, Topology(tp=2, pp=1, dp=1, dp_attention=False), arch="sm90")
    assert str(eid) == QWEN_ID
    return root


def test_sglang_hit_tunes_nothing_exit_0(qwen_tree):
    report = doctor(str(LOGS / "sglang-hit.log"), "--cache-dir", str(qwen_tree), code=0)
    assert report["format"] == "fi-autotune.doctor/1" and report["tuned"] is False
    (server,) = report["servers"]
    assert server["engine"] == "sglang" and [r["rank"] for r in server["ranks"]] == ["TP0", "TP1"]
    for s in sessions(report):
        assert s["entry"] == QWEN_ID and s["in_tree"]["present"] and s["in_tree"]["status"] == "complete"
        assert s["cache"] == "used" and s["cause"] is None and s["duration_seconds"] == 3


def test_sglang_miss_names_the_differing_field(qwen_tree):
    report = doctor(str(LOGS / "sglang-miss-other-tp.log"), "--cache-dir", str(qwen_tree), code=1)
    (server,) = report["servers"]
    assert len(server["ranks"]) == 4 and {o["op"] for o in server["shared_tuning"]} == {
        "trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2"}
    for s in sessions(report):
        assert s["cause_kind"] == "no-entry" and s["cache"] == "absent"
        assert f"the nearest entry, {QWEN_ID}, differs in tp: 2 there, 4 here" in s["cause"]
    assert server["tuning_seconds"] == 27 + 18


def test_sglang_miss_human_view_says_the_cause_once(qwen_tree):
    proc = run_cli("doctor", str(LOGS / "sglang-miss-other-tp.log"), "--cache-dir", str(qwen_tree))
    assert proc.returncode == 1
    assert proc.stdout.count("cause (4 passes): no entry") == 1 and "tp: 2 there, 4 here" in proc.stdout


def test_sglang_diverged_drop_ours_are_identical(qwen_tree):
    report = doctor(str(LOGS / "sglang-diverged.log"), "--cache-dir", str(qwen_tree), code=1)
    for s in sessions(report):
        assert s["cache"] == "dropped" and s["cause_kind"] == "diverged"
        assert "SGLang deleted them" in s["cause"] and "byte-identical" in s["cause"]


def test_sglang_expert_parallel_drop_names_the_ep_issue(root):
    report = doctor(str(LOGS / "sglang-ep2-diverged.log"), "--cache-dir", str(root), code=1)
    ranks = [r["rank"] for r in report["servers"][0]["ranks"]]
    assert ranks == ["TP0 EP0", "TP1 EP1"]
    for s in sessions(report):
        assert s["cause_kind"] == "diverged" and "EP 2" in s["cause"] and "sglang#40320" in s["cause"]


def test_speculative_draft_worker_missing_its_entry(qwen_tree):
    report = doctor(str(LOGS / "sglang-spec-draft-missing.log"), "--cache-dir", str(qwen_tree), code=1)
    for r in report["servers"][0]["ranks"]:
        target, draft = r["sessions"]
        assert target["entry"] == QWEN_ID and target["cause"] is None and target["in_tree"]["worker"] == "target"
        assert draft["cause_kind"] == "no-entry" and "speculative draft worker" in draft["cause"]
    # the log names no --speculative-* flag: a warm built from the key's fields would tune the
    # target's entry again, so the fix asks for the server's own flags
    (cause,) = report["servers"][0]["causes"]
    assert cause["fix"]["command"] == "fi-autotune warm -- python -m sglang.launch_server <the server's flags>"


def test_eight_ranks_interleaved_behind_kubectl_prefixes(root):
    report = doctor(str(LOGS / "sglang-8ranks-interleaved.log"), "--cache-dir", str(root), code=1)
    (server,) = report["servers"]
    assert server["server"] == "[pod/qwen-tp8-0/sglang]"
    assert [r["rank"] for r in server["ranks"]] == [f"TP{i}" for i in range(8)]
    assert {o["op"]: o["bars"] for o in server["shared_tuning"]} == {
        "trtllm::fused_moe::gemm1": 8, "trtllm::fused_moe::gemm2": 8}
    assert all(s["complete"] and s["tuned_elsewhere"] for s in sessions(report))


def test_truncated_log_says_where_it_stops(root):
    report = doctor(str(LOGS / "sglang-truncated.log"), "--cache-dir", str(root), code=1)
    (s,) = sessions(report)
    assert s["cause_kind"] == "truncated" and not s["complete"]
    assert "trtllm::fused_moe::gemm1, 7/21 profiles" in s["cause"]


def test_vllm_per_rank_hit(tmp_path):
    report = doctor(str(LOGS / "vllm-tp2-hit.log"), "--cache-dir", str(tmp_path), code=0)
    (server,) = report["servers"]
    assert server["engine"] == "vllm" and server["version"] == "0.33.0"
    ss = sessions(report)
    assert len(ss) == 2 and all(s["cache"] == "loaded" and s["loaded_configs"] == 42 for s in ss)
    assert all(s["entry"].startswith("vllm:0.7.2.post1/90a/3f1c0e8a") for s in ss)


def test_vllm_per_rank_miss(tmp_path):
    (tmp_path / "flashinfer_autotune_cache").mkdir()
    report = doctor(str(LOGS / "vllm-tp2-miss.log"), "--cache-dir", str(tmp_path), code=1)
    ss = sessions(report)
    assert len(ss) == 2 and all(s["dummy_pass"] and s["cause_kind"] == "no-entry" for s in ss)
    assert "vLLM's config hash differs" in ss[0]["cause"]


def test_vllm_single_gpu_managed_store_hit(tmp_path):
    report = doctor(str(LOGS / "vllm-single-managed-hit.log"), "--cache-dir", str(tmp_path), code=0)
    (s,) = sessions(report)
    assert s["layout"] == "flashinfer-v2" and s["entry"] == "flashinfer-v2:0123456789abcdef"
    assert s["cache"] == "loaded" and s["preloaded"] == [42, 42] and s["hits"] == ["trtllm::fused_moe::gemm1"]


def test_vllm_single_gpu_managed_store_miss_other_environment(tmp_path):
    other = tmp_path / "v2" / "fedcba9876543210"
    (other / "entries").mkdir(parents=True)
    (other / "manifest.json").write_text("{}")
    report = doctor(str(LOGS / "vllm-single-managed-miss.log"), "--cache-dir", str(tmp_path), code=1)
    (s,) = sessions(report)
    assert s["cause_kind"] == "other-environment" and "fedcba9876543210" in s["cause"]
    assert s["tuned"] == [{"op": "trtllm::fused_moe::gemm1", "profiles": 21, "done": 21, "seconds": 25}]


def test_stdin_and_several_logs(qwen_tree):
    text = (LOGS / "sglang-hit.log").read_text()
    proc = run_cli("doctor", "-", str(LOGS / "vllm-tp2-hit.log"), "--cache-dir", str(qwen_tree), "--json", input=text)
    assert proc.returncode == 0, proc.stderr
    assert [s["server"] for s in json.loads(proc.stdout)["servers"]] == ["-", str(LOGS / "vllm-tp2-hit.log")]


@pytest.mark.parametrize("make,needle", [
    (lambda p: p / "nope.log", "no such log file"),
    (lambda p: p, "is a directory"),
    (lambda p: (p / "x.log").write_text("hello\nworld\n") and p / "x.log", "no log given holds a line"),
])
def test_usage_errors_are_one_line_exit_2(tmp_path, make, needle):
    proc = run_cli("doctor", str(make(tmp_path)))
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_other_flashinfer_version_is_warned(tmp_path, qwen_tree):
    log = tmp_path / "new.log"
    log.write_text((LOGS / "sglang-hit.log").read_text().replace("0.7.2.post1", "0.8.0"))
    proc = run_cli("doctor", str(log), "--cache-dir", str(qwen_tree))
    assert proc.returncode == 0 and re.search(r"warning: FlashInfer 0\.8\.0 .* formats read are those of", proc.stderr)


def test_no_autotune_line_is_exit_0_with_a_note(tmp_path):
    log = tmp_path / "quiet.log"
    log.write_text("[2026-06-29 01:38:00 TP0] Load weight end. type=Qwen3MoeForCausalLM\n")
    proc = run_cli("doctor", str(log), "--cache-dir", str(tmp_path))
    assert proc.returncode == 0 and "did not autotune at startup" in proc.stderr


def test_flashinfer_alone_logs_captured_on_a_real_gpu():
    """FlashInfer's own lines, captured on an H100 from ``verify`` with FLASHINFER_LOGGING_LEVEL=info
    (tests/logs/test_doctor_gpu.py keeps them under $FI_AUTOTUNE_RESULTS_DIR): over a warmed
    entry, 42 configs loaded, two cache hits, nothing tuned (exit 0); over the same entry emptied
    of its tactics, each MoE GEMM tuned once - tqdm's closing redraw of a finished bar is the
    same bar, not a second tuning (exit 1)."""
    warmed = doctor(str(LOGS / "flashinfer-verify-warmed.log"), code=0)
    (s,) = sessions(warmed)
    assert warmed["servers"][0]["engine"] == "flashinfer"
    assert s["loaded_configs"] == 42 and s["hits"] == ["trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2"]
    assert s["tuned"] == [] and s["cause"] is None
    emptied = doctor(str(LOGS / "flashinfer-verify-emptied.log"), code=1)
    (s,) = sessions(emptied)
    assert s["loaded_configs"] == 0
    assert [(o["op"], o["done"], o["profiles"]) for o in s["tuned"]] == [
        ("trtllm::fused_moe::gemm1", 21, 21), ("trtllm::fused_moe::gemm2", 21, 21)]
    assert s["tuning_seconds"] == 16
