"""vLLM 0.33 on Blackwell (engines/vllm/sm100.py): the one recorded call, compared in CI with the
golden recorded from vLLM's own ``TrtLlmBf16ExpertsMonolithic.apply`` (argument by argument) and
with FlashInfer's own keys for it (key by key, at every bucket vLLM's pass tunes); recorded
again, live, when $FI_AUTOTUNE_VLLM_PYTHON names an interpreter with vLLM 0.33. What was not
recorded is refused, one line naming it. Not yet run on a Blackwell GPU."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from autotune_cache.errors import UsageError
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.request import TuneRequest
from autotune_cache.engines.vllm.target import VllmTarget

from ..conftest import REPO, run_cli
from ..support.sglang_golden import compare_call, compare_keys

GOLDEN_PATH = REPO / "tests" / "data" / "vllm-0.33.0" / "sm100-trtllm_bf16_moe.json"
GOLDEN = json.loads(GOLDEN_PATH.read_text())
VLLM_PYTHON = os.environ.get("FI_AUTOTUNE_VLLM_PYTHON")
QWEN = "Qwen/Qwen3-30B-A3B"
H = "5eed" * 16


def plan_for(tmp_path: Path, model: str = QWEN, arch: str = "sm100", **flags):
    f = {"tp": 2, **flags}
    hashed = H if f["tp"] * f.get("dp", 1) > 1 else ""
    r = TuneRequest(model, ServerFlags(**f), arch=arch, flashinfer_version="0.7.2.post1",
                    engine=VllmTarget.of(hashed, 8192, "vllm"))
    return r.plan(tmp_path / "root")


def the_op(plan) -> dict:
    (op,) = [op for w in plan.workloads for op in w.ops]
    return op.recipe.to_dict() | {"buckets": list(op.buckets)}


@pytest.mark.parametrize("case_id", sorted(GOLDEN["cases"]))
def test_our_call_and_keys_are_vllms_and_flashinfers(tmp_path, case_id):
    g = GOLDEN["cases"][case_id]
    plan = plan_for(tmp_path, tp=g["case"]["tp"])
    op = the_op(plan)
    assert compare_call(g["call"], op) == []
    assert op["buckets"] == g["keys"]["buckets"]
    assert len(g["keys"]["keys"]) == 21 and compare_keys(op, g["keys"]) == []


def test_the_comparison_can_fail(tmp_path):
    """SGLang's recipe for the same GPU and flags: its tune_max_num_tokens differs (next_power_of_2(M))."""
    g = GOLDEN["cases"]["qwen3-30b-a3b-tp1"]
    sg = TuneRequest(QWEN, ServerFlags(moe_runner_backend="flashinfer_trtllm"), arch="sm100",
                     flashinfer_version="0.7.2.post1").plan(tmp_path / "sg")
    (op,) = [o for w in sg.workloads for o in w.ops if o.recipe.api.endswith("trtllm_bf16_moe")]
    assert any(d.startswith("tune_max_num_tokens") for d in compare_call(g["call"], op.recipe.to_dict()))


@pytest.mark.parametrize("flags,what", [
    ({"dp": 2}, "--data-parallel-size 2"),
    ({"arch": "sm103"}, "sm103: vLLM's calls on this GPU"),
])
def test_what_was_not_recorded_is_refused(tmp_path, flags, what):
    with pytest.raises(UsageError, match="is not recorded from vLLM 0.33's code on Blackwell") as e:
        plan_for(tmp_path, **flags)
    assert what in str(e.value)


def test_another_flashinfer_kernel_vllm_runs_there_is_refused_as_not_modelled(tmp_path):
    """--moe-backend flashinfer_cutlass on sm100: vLLM's own dispatch gives FlashInferExperts
    (engines/vllm/data/vllm-0.33.0-moe-dispatch.json), whose sm100 call is not recorded."""
    with pytest.raises(UsageError, match="runs them on FlashInferExperts .* does not model yet"):
        plan_for(tmp_path, moe_runner_backend="flashinfer_cutlass")


@pytest.mark.parametrize("model,what", [("nvidia/Llama-3.1-70B-Instruct-FP8", "a dense model on sm100"),
                                        ("deepseek-ai/DeepSeek-V3", "runs them on TrtLlmFp8ExpertsMonolithic")])
def test_other_models_on_blackwell_are_refused(tmp_path, model, what):
    proc = run_cli("plan", "--model", model, "--tp", "8", "--arch", "sm100", "--layout", "vllm", "--vllm-config-hash", H,
                   env={"VLLM_CACHE_ROOT": str(tmp_path)})
    assert proc.returncode == 2 and what in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_plan_says_not_yet_run_on_blackwell(tmp_path):
    proc = run_cli("plan", "--model", QWEN, "--tp", "1", "--arch", "sm100", "--layout", "vllm",
                   env={"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "trtllm_bf16_moe" in proc.stdout and "not yet run on Blackwell" in proc.stdout


@pytest.mark.skipif(not VLLM_PYTHON, reason="optional live check against vLLM itself: set FI_AUTOTUNE_VLLM_PYTHON to a Python with vLLM 0.33 (CI compares with its recorded goldens)")
def test_golden_is_what_vllm_and_flashinfer_make_now(tmp_path):
    script = (f"import json, sys; sys.path.insert(0, {str(REPO / 'tests' / 'oracle')!r}); "
              "import vllm_sm100_moe_calls as m; print(json.dumps(m.golden()))")
    out = subprocess.run([VLLM_PYTHON, "-c", script], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["cases"] == GOLDEN["cases"]


def test_warm_on_a_b200_writes_the_recorded_calls_keys(tmp_path):
    """The real CLI on a stand-in B200: a single-rank vLLM's store holds exactly FlashInfer's keys
    for vLLM's recorded call (one entry per bucket)."""
    from ..support.fake_gpus import gpu_env, run_gpu_cli

    env = gpu_env(tmp_path, VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR=str(tmp_path / "vroot"), FAKE_GPUS="1xNVIDIA B200@sm100",
                  FAKE_GPU="NVIDIA B200")
    proc = run_gpu_cli("warm", "--model", QWEN, "--tp", "1", "--layout", "vllm", "--flashinfer-version", "0.7.2.post1",
                       "--max-num-batched-tokens", str(GOLDEN["cases"]["qwen3-30b-a3b-tp1"]["case"]["max_num_batched_tokens"]),
                       "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    stored = sorted(json.loads(p.read_text())["key"] for p in Path(out["key_dir"]).glob("entries/*.json"))
    theirs = sorted(c[1] for k in GOLDEN["cases"]["qwen3-30b-a3b-tp1"]["keys"]["keys"] for c in k["candidates"])
    assert stored == theirs and len(stored) == 21
