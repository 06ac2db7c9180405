"""An explicit MoE runner backend the weights cannot use: SGLang 0.5.23's own quant-method dispatch
(recorded by tests/oracle/record.py dispatch) decides which runner the layer gets, and the plan
says what SGLang does - e.g. bf16 experts with --moe-runner-backend flashinfer_mxfp4 get
UnquantizedFusedMoEMethod and run Triton: nothing FlashInfer is tuned."""

from __future__ import annotations

import json

import pytest

from ..conftest import run_cli


def _plan(tmp_path, *args):
    proc = run_cli("plan", "--cache-dir", str(tmp_path), "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_bf16_experts_on_flashinfer_mxfp4_run_triton_and_tune_nothing(tmp_path, arch):
    d = _plan(tmp_path, "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_mxfp4",
              "--arch", arch)
    assert d["autotunes"] is False and d["resolution"]["autotunes"] is True  # the gate is open, nothing to tune
    assert d["profiles"] == 0 and all(not w["ops"] for w in d["workloads"])
    text = " ".join(d["reasons"] + d["notes"])
    assert "UnquantizedFusedMoEMethod" in text and "Triton" in text
    human = run_cli("plan", "--cache-dir", str(tmp_path), "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2",
                    "--moe-runner-backend", "flashinfer_mxfp4", "--arch", arch)
    assert "NOTHING TO TUNE" in human.stdout and "Triton" in human.stdout
