"""``warm --layout vllm`` (autotune_cache/vllm.py): vLLM 0.33's call, buckets and rank names; the
real CLI end to end with the stand-in worker; and, where an interpreter with vLLM is at hand
($FI_AUTOTUNE_VLLM_PYTHON), the call checked against the one vLLM's own FlashInferExperts makes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from autotune_cache.autotuner import buckets as B
from autotune_cache.errors import UsageError
from autotune_cache.plan.request import TuneRequest
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.engines.vllm.target import VllmTarget, parse_config_hash

from ..conftest import REPO, run_cli
from ..support.fake_gpus import gpu_env, run_gpu_cli

H = "c0ffee" * 10 + "abcd"
QWEN = "Qwen/Qwen3-30B-A3B"
VLLM_PYTHON = os.environ.get("FI_AUTOTUNE_VLLM_PYTHON")


def vllm_plan(tmp_path: Path, model: str = QWEN, config: str | None = None, layout: str = "vllm", n: int = 8192, **flags):
    flags = {"moe_runner_backend": "flashinfer_cutlass", **flags}
    r = TuneRequest(model, ServerFlags(**flags), arch="sm90", config=config, flashinfer_version="0.7.2.post1",
                    engine=VllmTarget.of(H, n, layout))
    return r.plan(tmp_path / "root")


def the_op(plan):
    (w,) = [w for w in plan.workloads if w.ops]
    (op,) = w.ops
    return op


def per_tensor_fp8_config(tmp_path: Path) -> str:
    """Qwen3-30B-A3B's config with a per-tensor static FP8 quantization_config (no block size)."""
    cfg = json.loads((REPO / "autotune_cache" / "plan" / "presets" / "Qwen--Qwen3-30B-A3B.json").read_text())
    cfg = cfg.get("config", cfg)
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    p = tmp_path / "fp8" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps(cfg))
    return str(p)


# --- the plan --------------------------------------------------------------------------------

def test_plan_tp2_dp2_is_vllms_split_buckets_and_names(tmp_path):
    plan = vllm_plan(tmp_path, tp=2, dp=2)
    assert plan.layout == "vllm" and plan.autotunes
    assert plan.key_dir == tmp_path / "root" / "flashinfer_autotune_cache" / "0.7.2.post1" / "90a" / H
    assert plan.rank_files == ["autotune_configs_dp0_rank0.json", "autotune_configs_dp0_rank1.json",
                               "autotune_configs_dp1_rank2.json", "autotune_configs_dp1_rank3.json"]
    op = the_op(plan)
    kw = op.recipe.kwargs
    # FusedMoEParallelConfig.make: the MoE tp size is tp x dp; every rank holds every expert.
    assert (kw["tp_size"], kw["ep_size"]) == (4, 1)
    assert kw["fc1_expert_weights"].shape == (128, 2 * 768 // 4, 2048)
    assert kw["fc2_expert_weights"].shape == (128, 2048, 768 // 4)
    # FlashInfer's defaults for what vLLM does not pass; SGLang passes use_fused_finalize=False.
    assert kw["use_fused_finalize"] is True and kw["quant_scales"] == []
    # autotune(tuning_buckets=get_hybrid_num_tokens_buckets(max_num_batched_tokens)): each stored under itself.
    assert op.buckets == op.engine_keys == B.hybrid_buckets(8192) and len(op.buckets) == 21
    keys = op.recipe.file_keys(4096)
    assert len(keys) == 2 and all(k.endswith(", 3, False, True))") for k in keys)


def test_vllm_keys_are_not_sglangs(tmp_path):
    """Same model and flags: the keys differ (use_fused_finalize, and the tp x dp flattening), so
    one engine's file is of no use to the other - each is tuned."""
    from autotune_cache.plan.request import TuneRequest as R

    sg = R(QWEN, ServerFlags(tp=2, moe_runner_backend="flashinfer_cutlass"), arch="sm90",
           flashinfer_version="0.7.2.post1").plan(tmp_path / "sg")
    v = vllm_plan(tmp_path, tp=2)
    sk, vk = set(the_op(sg).recipe.file_keys(64)), set(the_op(v).recipe.file_keys(64))
    assert len(sk) == len(vk) == 2 and not sk & vk


def test_expert_parallel_spans_tp_times_dp(tmp_path):
    op = the_op(vllm_plan(tmp_path, tp=2, dp=2, ep=4))
    kw = op.recipe.kwargs
    assert (kw["tp_size"], kw["ep_size"]) == (1, 4)
    assert kw["fc1_expert_weights"].shape == (32, 2 * 768, 2048)
    with pytest.raises(UsageError, match="--ep 4, or --ep 1"):
        vllm_plan(tmp_path, tp=2, dp=2, ep=2)


def test_max_num_batched_tokens_sets_the_buckets(tmp_path):
    op = the_op(vllm_plan(tmp_path, tp=2, n=16384))
    assert op.buckets[-2:] == (8192, 16384) and len(op.buckets) == 22
    op = the_op(vllm_plan(tmp_path, tp=2, n=2048))
    assert op.buckets[-1] == 2048 and 4096 not in op.buckets


def test_pipeline_ranks_are_world_ranks(tmp_path):
    plan = vllm_plan(tmp_path, tp=2, pp=2, dp=2)
    assert plan.rank_files == [f"autotune_configs_dp{d}_rank{r}.json" for d in (0, 1) for r in range(4 * d, 4 * d + 4)]
    (w,) = plan.workloads  # both stages make the same call: one workload, byte-identical files
    assert sorted(w.ranks) == sorted(plan.rank_files)


def test_per_tensor_fp8(tmp_path):
    kw = the_op(vllm_plan(tmp_path, model="org/qwen-fp8", config=per_tensor_fp8_config(tmp_path), tp=2)).recipe.kwargs
    assert kw["input"].dtype == kw["fc1_expert_weights"].dtype == "float8_e4m3fn"
    assert kw["output_dtype"].name == "bfloat16" and len(kw["quant_scales"]) == 4


@pytest.mark.parametrize("model,flags,why", [
    (QWEN, {"moe_runner_backend": "auto"}, "TritonExperts (not a FlashInfer kernel)"),  # auto on Hopper
    ("Qwen/Qwen3-30B-A3B-FP8", {"moe_runner_backend": "auto"}, "TritonExperts"),
    ("meta-llama/Meta-Llama-3.1-8B", {}, "no MoE layers"),
    (QWEN, {"autotune_disabled_by": "--disable-flashinfer-autotune"}, "--disable-flashinfer-autotune"),
])
def test_what_vllm_does_not_tune_is_said(tmp_path, model, flags, why):
    plan = vllm_plan(tmp_path, model=model, tp=2, **flags)
    assert not plan.autotunes and any(why in r for r in plan.resolution.reasons + plan.reasons)


def test_block_fp8_on_vllms_cutlass_moe_is_not_modelled(tmp_path):
    """vLLM's own dispatch runs 128x128 block-FP8 experts on FlashInferExperts on Hopper (and with
    expert parallelism even under auto): a FlashInfer call with block scales whose tuning is not
    recorded - refused, where this plan said "nothing to tune" before the dispatch was recorded."""
    with pytest.raises(UsageError, match="fp8_block experts .* FlashInferExperts"):
        vllm_plan(tmp_path, model="Qwen/Qwen3-30B-A3B-FP8", tp=2)
    with pytest.raises(UsageError, match="fp8_block experts with --moe-backend auto .* FlashInferExperts"):
        vllm_plan(tmp_path, model="Qwen/Qwen3-30B-A3B-FP8", tp=2, ep=2, moe_runner_backend="auto")


def test_more_than_one_rank_needs_the_config_hash(tmp_path):
    r = TuneRequest(QWEN, ServerFlags(moe_runner_backend="flashinfer_cutlass", tp=2), arch="sm90",
                    flashinfer_version="0.7.2.post1", engine=VllmTarget.of("", 8192, "vllm"))
    with pytest.raises(UsageError, match="2 ranks needs --vllm-config-hash"):
        r.plan(tmp_path)


def test_config_hash_from_what_vllm_prints():
    line = (f"(Worker_TP0 pid=123) INFO 11-21 11:09:04 [kernel_warmup.py:496] Using FlashInfer autotune cache file: "
            f"/root/.cache/vllm/flashinfer_autotune_cache/0.7.2.post1/90a/{H}/autotune_configs_dp0_rank0.json. "
            "Pass --disable-flashinfer-autotune to skip autotuning.")
    assert parse_config_hash(line) == parse_config_hash(H.upper()) == H
    for bad in ("abc", H[:-1], f"{H} {'1' * 64}", H + "0", ""):
        with pytest.raises(UsageError, match="64-hex"):
            parse_config_hash(bad)


def test_request_round_trips_with_its_vllm_target(tmp_path):
    r = vllm_plan(tmp_path, tp=2).request
    again = TuneRequest.from_dict(json.loads(json.dumps(r.to_dict())))
    assert again == r and again.engine == VllmTarget.of(H, 8192, "vllm")
    with pytest.raises(ValueError):
        TuneRequest.from_dict({**r.to_dict(), "vllm": {"config_hash": "x", "max_num_batched_tokens": 1}})


# --- the real command, no GPU (stand-in worker) -----------------------------------------------

def warm(tmp_path, *args, **env):
    return run_gpu_cli("warm", "--model", QWEN, "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass",
                   "--flashinfer-version", "0.7.2.post1", *args,
                   env=gpu_env(tmp_path, VLLM_CACHE_ROOT=str(tmp_path / "vllm"), **env))


def test_warm_layout_vllm_writes_vllms_files(tmp_path):
    proc = warm(tmp_path, "--layout", "vllm", "--vllm-config-hash", H, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    kdir = tmp_path / "vllm" / "flashinfer_autotune_cache" / "0.7.2.post1" / "90a" / H
    assert out["status"] == "written" and Path(out["key_dir"]) == kdir
    files = sorted(p.name for p in kdir.iterdir())
    assert files == ["autotune_configs_dp0_rank0.json", "autotune_configs_dp0_rank1.json", "fi-autotune.manifest.json"]
    a, b = (json.loads((kdir / f).read_bytes()) for f in files[:2])
    # vLLM's hit test: every rank's _metadata and field count equal.
    assert a["_metadata"] == b["_metadata"] and len(a) == len(b) and len(a) - 2 == 42  # _metadata, _generation
    assert all(k.endswith(", 3, False, True))") for k in a if not k.startswith("_"))
    manifest = json.loads((kdir / "fi-autotune.manifest.json").read_text())
    assert manifest["arch"] == "90a" and manifest["schema"] == "vllm-0.33"
    assert manifest["request"]["vllm"] == {"config_hash": H, "max_num_batched_tokens": 8192, "layout": "vllm"}
    listed = json.loads(run_cli("ls", "--layout", "vllm", "--json", env={"VLLM_CACHE_ROOT": str(tmp_path / "vllm")}).stdout)
    (entry,) = listed["entries"]
    assert entry["status"] == "complete" and entry["ranks_expected"] == 2
    again = warm(tmp_path, "--layout", "vllm", "--vllm-config-hash", H, "--json")
    assert json.loads(again.stdout)["status"] == "complete"


def test_warm_vllm_dir_layout(tmp_path):
    d = tmp_path / "vdir"
    proc = warm(tmp_path, "--layout", "vllm-dir", "--vllm-config-hash", H, VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR=str(d))
    assert proc.returncode == 0, proc.stderr
    assert (d / H / "autotune_configs_dp0_rank1.json").is_file()
    listed = json.loads(run_cli("ls", "--layout", "vllm-dir", "--json",
                                env={"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(d)}).stdout)
    assert [e["status"] for e in listed["entries"]] == ["complete"]


def test_one_run_writes_sglang_vllm_and_the_v2_store(tmp_path):
    proc = warm(tmp_path, "--layout", "sglang,vllm,flashinfer-v2", "--vllm-config-hash", H,
                "--cache-dir", str(tmp_path / "sg"), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [(t["name"], t["status"]) for t in out["workers"]] == [("sglang", "written"), ("vllm", "written")]
    assert out["profiles_distinct"] == out["profiles_tuned"] == 84  # the two engines' calls share no key
    assert out["converted"]["sglang"]["written"] == 42  # flashinfer-v2, from the sglang tuning
    sg = json.loads(run_cli("ls", "--cache-dir", str(tmp_path / "sg"), "--json").stdout)["entries"]
    assert [e["status"] for e in sg] == ["complete"]
    again = json.loads(warm(tmp_path, "--layout", "sglang,vllm", "--vllm-config-hash", H,
                            "--cache-dir", str(tmp_path / "sg"), "--json").stdout)
    assert [t["status"] for t in again["workers"]] == ["complete", "complete"] and again["profiles_total"] == 0


@pytest.mark.parametrize("args,message", [
    (["--layout", "vllm"], "needs --vllm-config-hash"),
    (["--layout", "vllm", "--vllm-config-hash", "123"], "64-hex"),
    (["--vllm-config-hash", H], "goes with --layout vllm"),
    (["--layout", "vllm,flashinfer-v2", "--vllm-config-hash", H], "written from the sglang tuning"),
    (["--layout", "vllm,vllm-dir", "--vllm-config-hash", H], "not both"),
    (["--layout", "sglang,vllm", "--vllm-config-hash", H, "--quality", "careful"], "one engine's calls at a time"),
    (["--layout", "vllm", "--vllm-config-hash", H, "--ep", "3"], "--enable-expert-parallel"),
    (["--layout", "trtllm"], "warm writes"),
])
def test_usage_errors(tmp_path, args, message):
    proc = warm(tmp_path, *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "vllm").exists()


def test_plan_command_shows_vllms_plan(tmp_path):
    proc = run_cli("plan", "--model", QWEN, "--tp", "2", "--arch", "sm90", "--moe-runner-backend", "flashinfer_cutlass",
                   "--flashinfer-version", "0.7.2.post1", "--layout", "vllm", "--vllm-config-hash", H,
                   env={"VLLM_CACHE_ROOT": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "Autotune    YES: vLLM 0.33.0 would run" in proc.stdout and "use_fused_finalize       True" in proc.stdout
    assert f"90a/{H}" in proc.stdout


def test_a_manifest_naming_another_vllm_entry_is_not_trusted(tmp_path):
    """The guard that an entry's manifest names its own directory holds for vLLM's levels too."""
    assert warm(tmp_path, "--layout", "vllm", "--vllm-config-hash", H).returncode == 0
    base = tmp_path / "vllm" / "flashinfer_autotune_cache" / "0.7.2.post1"
    other = base / "90a" / ("e" * 64)
    import shutil

    shutil.copytree(base / "90a" / H, other)
    listed = json.loads(run_cli("ls", "--layout", "vllm", "--json", env={"VLLM_CACHE_ROOT": str(tmp_path / "vllm")}).stdout)
    by_key = {e["id"].rsplit("/", 1)[1]: e for e in listed["entries"]}
    assert by_key[H]["status"] == "complete"
    assert by_key["e" * 64]["status"] != "complete"


# --- checked against vLLM's own call ------------------------------------------------------------
# tests/data holds the calls vLLM 0.33.0's FlashInferExperts.apply made (recorded on CPU by
# tests/oracle/vllm_moe_call.py, FlashInfer's function replaced by a recorder), bound to FlashInfer's
# signature with its defaults: CI compares our recipes with them without vLLM; with an interpreter
# that has vLLM ($FI_AUTOTUNE_VLLM_PYTHON) they are recorded again and must not have changed.

GOLDEN = json.loads((REPO / "tests" / "data" / "vllm-0.33.0-cutlass_fused_moe-calls.json").read_text())
FLAGS = {"tp1": {"tp": 1}, "tp2": {"tp": 2}, "tp2-dp2": {"tp": 2, "dp": 2}, "tp2-dp2-ep4": {"tp": 2, "dp": 2, "ep": 4},
         "tp4-ep4": {"tp": 4, "ep": 4}, "tp2-fp8": {"tp": 2}}
#: Never in a key: the rank offsets, and the output buffer vLLM preallocates (ours is allocated inside).
NOT_IN_KEY = {"tp_rank", "ep_rank", "output"}


def our_call(tmp_path, name: str, sglang: bool = False) -> dict:
    from ..support.fi_call import bound, materialize

    case = GOLDEN["cases"][name]["case"]
    config = per_tensor_fp8_config(tmp_path) if case["fp8"] else None
    model = "org/qwen-fp8" if config else QWEN
    if sglang:
        plan = TuneRequest(model, ServerFlags(moe_runner_backend="flashinfer_cutlass", **FLAGS[name]), arch="sm90",
                           config=config, flashinfer_version="0.7.2.post1").plan(tmp_path / "sg")
    else:
        plan = vllm_plan(tmp_path, model=model, config=config, **FLAGS[name])
    kwargs = the_op(plan).recipe.to_dict()["kwargs"]
    return {k: v for k, v in bound({k: materialize(v, case["m"]) for k, v in kwargs.items()}).items() if k not in NOT_IN_KEY}


@pytest.mark.parametrize("name", sorted(GOLDEN["cases"]))
def test_our_call_is_the_call_vllm_made(tmp_path, name):
    """Every argument of cutlass_fused_moe, FlashInfer's defaults filled in: shapes, dtypes, the
    tp/ep split, use_fused_finalize, enable_pdl, activation - everything the key is made of."""
    theirs = {k: v for k, v in GOLDEN["cases"][name]["call"].items() if k not in NOT_IN_KEY}
    assert our_call(tmp_path, name) == theirs


def test_sglangs_call_is_not_vllms(tmp_path):
    """The comparison can fail: SGLang's recipe for the same flags differs in use_fused_finalize."""
    theirs, ours = GOLDEN["cases"]["tp2"]["call"], our_call(tmp_path, "tp2", sglang=True)
    assert theirs["use_fused_finalize"] is True and ours["use_fused_finalize"] is False
    assert {k for k in ours if ours[k] != theirs[k]} == {"use_fused_finalize", "quant_scales"}  # None vs []


@pytest.mark.skipif(not VLLM_PYTHON, reason="optional live check against vLLM itself: set FI_AUTOTUNE_VLLM_PYTHON to a Python with vLLM 0.33 (CI compares with its recorded goldens)")
@pytest.mark.parametrize("name", sorted(GOLDEN["cases"]))
def test_golden_calls_are_what_vllm_makes(name):
    case = GOLDEN["cases"][name]["case"]
    out = subprocess.run([VLLM_PYTHON, str(REPO / "tests" / "oracle" / "vllm_moe_call.py"), json.dumps({"case": case})],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["vllm"] == GOLDEN["cases"][name]["call"]


def test_a_vllm_id_given_to_the_sglang_tree_says_which_layout(tmp_path):
    assert warm(tmp_path, "--layout", "vllm", "--vllm-config-hash", H).returncode == 0
    (tmp_path / "sg").mkdir()
    proc = run_cli("verify", f"vllm:0.7.2.post1/90a/{H}", "--cache-dir", str(tmp_path / "sg"))
    assert proc.returncode == 1 and "give --layout vllm" in proc.stderr and "Traceback" not in proc.stderr


def test_a_hash_reused_for_another_configuration_is_refused(tmp_path):
    """The hash is given, not derived: an entry already at it for other flags is not "complete"
    for these - warm refuses (exit 1, nothing written) unless --force replaces it."""
    assert warm(tmp_path, "--layout", "vllm", "--vllm-config-hash", H).returncode == 0
    kdir = tmp_path / "vllm" / "flashinfer_autotune_cache" / "0.7.2.post1" / "90a" / H
    before = sorted(p.name for p in kdir.iterdir())
    for args in (["--tp", "4"], ["--max-num-batched-tokens", "1024"]):
        proc = warm(tmp_path, "--layout", "vllm", "--vllm-config-hash", H, *args)
        assert proc.returncode == 1 and "another configuration" in proc.stderr, proc.stderr
        assert sorted(p.name for p in kdir.iterdir()) == before
    both = warm(tmp_path, "--layout", "sglang,vllm", "--vllm-config-hash", H, "--tp", "4",
                "--cache-dir", str(tmp_path / "sg"))
    assert both.returncode == 1 and "another configuration" in both.stdout + both.stderr
    forced = warm(tmp_path, "--layout", "vllm", "--vllm-config-hash", H, "--tp", "4", "--force")
    assert forced.returncode == 0, forced.stderr
    assert len(list(kdir.glob("autotune_configs_*.json"))) == 4


def test_tp_must_divide_the_heads_as_vllm_requires(tmp_path):
    with pytest.raises(UsageError, match="attention heads"):
        vllm_plan(tmp_path, tp=3)


def test_a_hash_glued_to_other_letters_is_not_taken():
    with pytest.raises(UsageError):
        parse_config_hash("g" + H)


def line_for(version: str, arch: str) -> str:
    return (f"(Worker_TP0 pid=7) INFO 11-24 00:01:02 [kernel_warmup.py:496] Using FlashInfer autotune cache file: "
            f"/root/.cache/vllm/flashinfer_autotune_cache/{version}/{arch}/{H}/autotune_configs_dp0_rank0.json. Pass "
            "--disable-flashinfer-autotune to skip autotuning.")


def test_the_pasted_line_must_come_from_the_same_flashinfer_and_gpu(tmp_path):
    """Provenance: the path vLLM printed names the FlashInfer version and GPU arch of the server
    that printed it; a hash from another image or GPU is refused, never tuned under."""
    base = ["plan", "--model", QWEN, "--tp", "2", "--arch", "sm90", "--moe-runner-backend", "flashinfer_cutlass",
            "--flashinfer-version", "0.7.2.post1", "--layout", "vllm", "--json", "--vllm-config-hash"]
    env = {"VLLM_CACHE_ROOT": str(tmp_path)}
    ok = run_cli(*base, line_for("0.7.2.post1", "90a"), env=env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["workers"][0]["request"]["vllm"]["printed_at"] == "0.7.2.post1/90a"
    for version, arch in (("0.7.1", "90a"), ("0.7.2.post1", "100a")):
        bad = run_cli(*base, line_for(version, arch), env=env)
        assert bad.returncode == 2 and f"printed that hash under {version}/{arch}" in bad.stderr, bad.stderr
    bare = run_cli(*base, H, env=env)  # a bare hash (or vllm-dir's path) carries no provenance to check
    assert bare.returncode == 0 and "printed_at" not in json.loads(bare.stdout)["workers"][0]["request"]["vllm"]
