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
    (worker,) = json.loads(proc.stdout)["workers"]
    return worker


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


# --- every probe of SGLang's own dispatch (autotune_cache/engines/sglang/data/...-moe-dispatch.json) --------

from autotune_cache.engines.sglang.dispatch import TABLE, is_tunable_moe_api  # noqa: E402

from ..support.sglang_golden import our_plan  # noqa: E402

ALL = json.loads(TABLE.read_text())["probes"]
#: Probes that ran to SGLang's answer (not those the oracle's environment failed: record.py ENVIRONMENT_ERRORS)
PROBES = [p for p in ALL if "oracle_error" not in p]


def test_the_table_covers_both_archs_every_kind_and_backend():
    assert {(p["arch"], p["kind"], p["backend"]) for p in ALL} == {
        (a, k, b) for a in ("sm90", "sm100") for k in ("bf16", "fp8_block", "mxfp4", "modelopt_fp4")
        for b in ("auto", "triton", "triton_kernel", "flashinfer_cutlass", "flashinfer_trtllm",
                  "flashinfer_trtllm_routed", "flashinfer_mxfp4", "flashinfer_cutedsl")}
    assert all("error" in p or "apis" in p for p in PROBES)  # each probe ran to SGLang's answer
    assert len(PROBES) >= 0.75 * len(ALL)
    for arch in ("sm90", "sm100"):
        (bf16_mxfp4,) = [p for p in PROBES if (p["arch"], p["kind"], p["backend"]) == (arch, "bf16", "flashinfer_mxfp4")]
        assert (bf16_mxfp4["quant_method"], bf16_mxfp4["runner"], bf16_mxfp4["apis"]) == \
            ("UnquantizedFusedMoEMethod", "TRITON", [])


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: f"{p['arch']}-{p['kind']}-{p['backend']}")
def test_the_plan_does_what_sglangs_own_dispatch_does(probe, tmp_path):
    code, plan = our_plan({"argv": probe["command"].split(), "arch": probe["arch"]}, tmp_path)
    if "error" in probe:  # SGLang refuses: at resolution, building the layer, or in its first forward
        assert code == 2 and isinstance(plan, str), plan
        return
    theirs = {a for a in probe["apis"] if is_tunable_moe_api(a)}
    if code == 2:  # declined as not modelled: only where SGLang does tune FlashInfer MoE calls
        assert "not model" in plan and theirs, plan
        return
    assert code == 0, plan
    ours = {op["api"] for w in plan["workloads"] for op in w["ops"] if op["id"] == "moe.experts"}
    assert ours == theirs, (probe["quant_method"], probe["runner"])
