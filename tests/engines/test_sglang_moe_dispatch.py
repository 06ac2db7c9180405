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
KINDS = ("bf16", "fp8_block", "mxfp4", "modelopt_fp4", "fp8_tensor", "fp8_tensor_dynamic", "modelopt_fp8", "w4afp8",
         "compressed_tensors_fp8", "compressed_tensors_w4a16", "awq", "gptq")
BACKENDS = ("auto", "triton", "triton_kernel", "flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_trtllm_routed",
            "flashinfer_mxfp4", "flashinfer_cutedsl")
#: --moe-a2a-backend choices of SGLang 0.5.23 other than none (flashinfer is tried with every runner backend)
A2A = ("flashinfer", "deepep", "deepep_v2", "mooncake", "nixl", "mori", "megamoe", "pplx", "flashinfer_megamoe",
       "ascend_fuseep", "ascend_tp")


def _plain(p: dict) -> bool:
    """A ``--tp 2 --moe-runner-backend B`` probe (not an a2a or other variant row)."""
    return "a2a" not in p and "variant" not in p


def _id(p: dict) -> str:
    return "-".join([p["arch"], p["kind"], p["backend"], *([f"a2a_{p['a2a']}"] if "a2a" in p else []),
                     *([p["variant"]] if "variant" in p else [])])


def test_the_table_covers_both_archs_every_kind_and_backend():
    archs = ("sm90", "sm100")
    assert sorted((p["arch"], p["kind"], p["backend"]) for p in ALL if _plain(p)) == sorted(
        (a, k, b) for a in archs for k in KINDS for b in BACKENDS)
    assert sorted((p["arch"], p["kind"], p["backend"], p["a2a"]) for p in ALL if "a2a" in p) == sorted(
        [(a, k, b, "flashinfer") for a in archs for k in KINDS for b in BACKENDS]
        + [(a, k, "auto", x) for a in archs for k in KINDS for x in A2A if x != "flashinfer"])
    assert sorted((p["arch"], p["kind"], p["variant"]) for p in ALL if "variant" in p) == sorted(
        (a, k, "ep4") for a in archs for k in KINDS)
    assert len({p["command"] + p["arch"] for p in ALL}) == len(ALL)  # each row is one command on one arch
    assert all("error" in p or "apis" in p for p in PROBES)  # each probe ran to SGLang's answer
    plain = [p for p in ALL if _plain(p)]
    assert len([p for p in plain if "oracle_error" not in p]) >= 0.75 * len(plain)
    for arch in archs:
        (bf16_mxfp4,) = [p for p in PROBES if _plain(p) and (p["arch"], p["kind"], p["backend"]) ==
                         (arch, "bf16", "flashinfer_mxfp4")]
        assert (bf16_mxfp4["quant_method"], bf16_mxfp4["runner"], bf16_mxfp4["apis"]) == \
            ("UnquantizedFusedMoEMethod", "TRITON", [])
        # SGLang asserts ep_size in [1, tp_size] for flashinfer_cutlass at startup
        (ep4,) = [p for p in PROBES if p.get("variant") == "ep4" and (p["arch"], p["kind"]) == (arch, "bf16")]
        assert "expert parallel size must be 1 or the same as the tensor parallel size" in ep4["error"]


def test_flashinfer_a2a_runs_cutlass_fused_moe_with_alltoall_over_the_ep_group():
    """--tp 2 --dp 2 --enable-dp-attention --moe-a2a-backend flashinfer: EP spans the TP group
    (ep 2, tp 1 per expert) and the CUTLASS call is made with enable_alltoall; without a2a, TP 2."""
    for arch in ("sm90", "sm100"):
        a2a, plain = (next(p for p in PROBES if (p["arch"], p["kind"], p["backend"]) ==
                           (arch, "bf16", "flashinfer_cutlass") and sel(p)) for sel in (lambda p: "a2a" in p, _plain))
        (call,) = a2a["tunable_calls"]
        assert call["api"] == "flashinfer.fused_moe.cutlass_fused_moe"
        assert (call["args"]["enable_alltoall"], call["args"]["ep_size"], call["args"]["tp_size"]) == (True, 2, 1)
        (call,) = plain["tunable_calls"]
        assert (call["args"]["enable_alltoall"], call["args"]["ep_size"], call["args"]["tp_size"]) == (False, 1, 2)


@pytest.mark.parametrize("probe", PROBES, ids=_id)
def test_the_plan_does_what_sglangs_own_dispatch_does(probe, tmp_path):
    code, plan = our_plan({"argv": probe["command"].split(), "arch": probe["arch"]}, tmp_path)
    if "error" in probe:  # SGLang refuses: at resolution, building the layer, or in its first forward
        assert code == 2 and isinstance(plan, str), plan
        return
    theirs = {a for a in probe["apis"] if is_tunable_moe_api(a)}
    if code == 2:  # declined as not modelled: only where SGLang does tune FlashInfer MoE calls - or for an
        # all-to-all backend whose expert-parallel width (a key field) fi-autotune does not model at all
        assert "not model" in plan and (theirs or f"--moe-a2a-backend {probe.get('a2a')}: not modelled" in plan), plan
        return
    assert code == 0, plan
    mine = [op for w in plan["workloads"] for op in w["ops"] if op["id"] == "moe.experts"]
    assert {op["api"] for op in mine} == theirs, (probe["quant_method"], probe["runner"])
    # and the call's key fields are the ones SGLang's forward passed (the probe's 8 tokens per rank)
    for call in probe.get("tunable_calls") or []:
        (op,) = [op for op in mine if op["api"] == call["api"]]
        for name in KEY_ARGS:  # (a value of the token count, "next_power_of_2(M)", is the matrix's to check)
            if name in call["args"] and name in op["kwargs"] and not isinstance(op["kwargs"][name], str):
                assert _value(op["kwargs"][name]) == _value(call["args"][name]), name


#: Arguments of the fused-MoE calls that reach FlashInfer's keys (or fix a tensor's shape there).
KEY_ARGS = ("enable_alltoall", "ep_size", "tp_size", "use_fused_finalize", "tune_max_num_tokens", "top_k",
            "num_experts", "local_num_experts", "fc1_expert_weights", "gemm1_weights")


def _value(v):
    """A recorded value as comparable: a tensor's shape without its token dimension and its dtype."""
    if isinstance(v, dict) and "tensor" in v:
        return (tuple(v["tensor"]["shape"][1:]) if v["tensor"]["shape"] and v["tensor"]["shape"][0] in ("M", 16, 8)
                else tuple(v["tensor"]["shape"]), v["tensor"]["dtype"])
    if isinstance(v, dict) and "enum" in v:
        return v["value"]
    return v
