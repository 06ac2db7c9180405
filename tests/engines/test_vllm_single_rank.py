"""A single-rank vLLM 0.33 (tp x pp x dp = 1) reads FlashInfer's managed store, not per-rank
files (``use_flashinfer_autotune_v2``), at ``resolve_flashinfer_autotune_v2_root``: warm tunes
vLLM's own call and publishes it there; FlashInfer's own store class (run on CPU) is the judge
of what was written. The real CLI on stand-in GPUs (tests/standins/fake_gpu_cli.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from autotune_cache.errors import FiAutotuneError
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.request import TuneRequest
from autotune_cache.engines.vllm.target import VllmTarget
from autotune_cache.tune.workers.envprobe import probe_environment

from ..conftest import run_cli
from ..support.fake_gpus import gpu_env, run_gpu_cli
from devtools.synthetic import DEFAULT_METADATA

QWEN = "Qwen/Qwen3-30B-A3B"
FLAGS = ["--model", QWEN, "--moe-runner-backend", "flashinfer_cutlass", "--flashinfer-version", "0.7.2.post1"]
#: What the stand-in worker writes as ``_metadata`` (FAKE_GPU defaults to an H200).
META = {**DEFAULT_METADATA, "gpu": "NVIDIA H200"}


def env_for(tmp_path: Path, **extra) -> dict:
    return gpu_env(tmp_path, **{"VLLM_CACHE_ROOT": str(tmp_path / "vllm"),
                                "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(tmp_path / "vroot"), **extra})


def warm1(tmp_path, *args, **env):
    return run_gpu_cli("warm", *FLAGS, "--tp", "1", "--layout", "vllm", *args, env=env_for(tmp_path, **env))


def fingerprint(tmp_path: Path, **fields) -> str:
    p = tmp_path / "env.json"
    p.write_text(json.dumps({"format": 1, "tool": "fi-autotune env", "fingerprint": {**META, **fields}, "arch": "sm90",
                             "gpus": [], "host": "serving", "captured": "2026-11-24T00:00:00+00:00"}))
    return str(p)


def single_plan(tmp_path, layout="vllm", **flags):
    r = TuneRequest(QWEN, ServerFlags(moe_runner_backend="flashinfer_cutlass", **flags), arch="sm90",
                    flashinfer_version="0.7.2.post1", engine=VllmTarget.of("", 8192, layout))
    return r.plan(tmp_path / "root")


def test_a_single_rank_plans_into_the_managed_store_keyed_by_environment(tmp_path):
    plan = single_plan(tmp_path, tp=1)
    assert plan.layout == "flashinfer-v2" and plan.engine.name == "vllm" and not plan.bound
    assert plan.key_dir == tmp_path / "root" / "v2" and plan.rank_files == []
    bound = plan.for_environment(META)
    from flashinfer.autotune_cache import ManagedAutotuneCache  # FlashInfer's own hash of the same environment

    assert bound.key_dir == ManagedAutotuneCache(META, tmp_path / "root").env_dir
    # the call is vLLM's (use_fused_finalize left at FlashInfer's default), not SGLang's
    (op,) = plan.workloads[0].ops
    assert op.recipe.kwargs["use_fused_finalize"] is True and op.recipe.kwargs["tp_size"] == 1


def test_two_ranks_still_read_per_rank_files(tmp_path):
    r = TuneRequest(QWEN, ServerFlags(moe_runner_backend="flashinfer_cutlass", tp=1, dp=2), arch="sm90",
                    flashinfer_version="0.7.2.post1", engine=VllmTarget.of("ab" * 32, 8192, "vllm"))
    assert r.plan(tmp_path).layout == "vllm"


def test_warm_publishes_what_flashinfers_own_store_serves(tmp_path):
    """Every key of the plan: an entry FlashInfer's ``lookup`` returns and ``preload`` accepts (its
    key_fields round-trip to the key), in the directory FlashInfer hashes the environment to, at
    vLLM's root ($VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR); no config hash was asked for."""
    proc = warm1(tmp_path, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    from flashinfer.autotune_cache import ManagedAutotuneCache

    store = ManagedAutotuneCache(META, tmp_path / "vroot")
    assert out["status"] == "written" and Path(out["key_dir"]) == store.env_dir and out["rank_files"] == []
    assert json.loads((store.env_dir / "manifest.json").read_text()) == store.manifest
    plan = single_plan(tmp_path, tp=1)
    keys = [group[0] for op in plan.workloads[0].ops for group in op.lookups()]
    assert len(keys) == 42 and all(store.lookup(k) is not None for k in keys)
    entries, total, skipped = store.preload()
    assert (len(entries), total, skipped) == (42, 42, 0)
    assert not (tmp_path / "vllm").exists()  # vLLM's per-rank tree is not what a single rank reads


def test_the_second_warm_finds_the_store_complete_and_tunes_nothing(tmp_path):
    log = tmp_path / "tuned.log"
    assert warm1(tmp_path, FAKE_LOG=str(log)).returncode == 0
    first = log.read_text().count("\n")
    proc = warm1(tmp_path, "--json", FAKE_LOG=str(log))
    assert json.loads(proc.stdout)["status"] == "complete" and log.read_text().count("\n") == first == 21  # (op, bucket) items: 21 buckets


def test_an_entry_gone_makes_it_incomplete(tmp_path):
    out = json.loads(warm1(tmp_path, "--json").stdout)
    sorted(Path(out["key_dir"]).glob("entries/*.json"))[3].unlink()
    again = json.loads(warm1(tmp_path, "--json").stdout)
    assert again["status"] == "written" and "1 entries written, 41 already there" in again["message"]


def test_an_entry_naming_another_key_is_a_miss(tmp_path):
    """FlashInfer's lookup rejects an entry whose embedded key is not the one it hashes from: so do we."""
    out = json.loads(warm1(tmp_path, "--json").stdout)
    a, b = sorted(Path(out["key_dir"]).glob("entries/*.json"))[:2]
    a.write_bytes(b.read_bytes())
    assert json.loads(warm1(tmp_path, "--json").stdout)["status"] == "written"


def test_the_root_follows_vllm(tmp_path):
    """No $VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR: FlashInfer's default root ($FLASHINFER_AUTOTUNE_CACHE_DIR
    here); vllm-dir without the variable has no root (set it, or --cache-dir)."""
    proc = warm1(tmp_path, "--json", VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR="")
    assert proc.returncode == 0, proc.stderr
    assert Path(json.loads(proc.stdout)["key_dir"]).parent == tmp_path / "v2" / "v2"
    proc = run_gpu_cli("warm", *FLAGS, "--tp", "1", "--layout", "vllm-dir",
                       env=env_for(tmp_path, VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR=""))
    assert proc.returncode == 2 and "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR" in proc.stderr and "Traceback" not in proc.stderr


def test_a_given_config_hash_is_not_used_and_said_so(tmp_path):
    proc = run_cli("plan", *FLAGS, "--tp", "1", "--layout", "vllm", "--arch", "sm90", "--vllm-config-hash", "ab" * 32,
                   env=env_for(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "--vllm-config-hash is not used" in proc.stdout and "environment hash" in proc.stdout
    assert f"Store dir   {tmp_path / 'vroot' / 'v2'}/<the tuning GPU's environment hash>" in proc.stdout


def test_check_reads_the_store_the_serving_environment_names(tmp_path):
    assert warm1(tmp_path).returncode == 0
    check = ["check", *FLAGS, "--tp", "1", "--layout", "vllm", "--strict"]
    ok = run_cli(*check, "--env-from", fingerprint(tmp_path), env=env_for(tmp_path))
    assert ok.returncode == 0 and "42 startup lookups, all present" in ok.stdout, ok.stdout + ok.stderr
    other = run_cli(*check, "--env-from", fingerprint(tmp_path, gpu="NVIDIA H100 80GB HBM3"), env=env_for(tmp_path))
    assert other.returncode == 1 and "no store for the serving environment" in other.stdout
    bare = run_cli(*check, "--arch", "sm90", env=env_for(tmp_path))
    assert bare.returncode == 2 and "--env-from" in bare.stderr and "Traceback" not in bare.stderr


def test_ls_and_rm_manage_the_store_at_vllms_root(tmp_path):
    out = json.loads(warm1(tmp_path, "--json").stdout)
    env = env_for(tmp_path)
    listed = json.loads(run_cli("ls", "--layout", "flashinfer-v2", "--cache-dir", str(tmp_path / "vroot"), "--json",
                                env=env).stdout)
    (entry,) = listed["entries"]
    assert entry["status"] == "complete" and entry["id"].endswith(Path(out["key_dir"]).name)
    rm = run_cli("rm", "-y", "--layout", "flashinfer-v2", "--cache-dir", str(tmp_path / "vroot"), entry["id"], env=env)
    assert rm.returncode == 0, rm.stderr
    assert not Path(out["key_dir"]).exists()


def test_the_probe_fails_in_one_line():
    with pytest.raises(FiAutotuneError, match="cannot read FlashInfer's environment on this GPU"):
        probe_environment((sys.executable, "-c", "import sys; sys.exit('no CUDA driver')"))
    with pytest.raises(FiAutotuneError, match="no CUDA driver"):
        probe_environment((sys.executable, "-c", "import sys; sys.exit('no CUDA driver')"))


# --- targets files -------------------------------------------------------------------------------

def targets(tmp_path: Path, body: str) -> str:
    p = tmp_path / "targets.yaml"
    p.write_text(f"defaults:\n  model: {QWEN}\n  moe_runner_backend: flashinfer_cutlass\n"
                 f"  flashinfer_version: 0.7.2.post1\ntargets:\n{body}")
    return str(p)


def test_vllm_targets_in_one_run_each_where_its_engine_reads(tmp_path):
    h = "7a11" * 16
    t = targets(tmp_path, "  - {name: v1, tp: 1, layouts: [vllm]}\n"
                          f"  - {{name: v2, tp: 2, layouts: [vllm-dir], vllm_config_hash: '{h}'}}\n"
                          "  - {name: sg, tp: 2}\n")
    proc = run_gpu_cli("warm", "--targets", t, "--cache-dir", str(tmp_path / "sg"), "--json", env=env_for(tmp_path))
    assert proc.returncode == 0, proc.stderr
    by = {x["name"]: x for x in json.loads(proc.stdout)["workers"]}
    assert {n: x["status"] for n, x in by.items()} == {"v1": "written", "v2": "written", "sg": "written"}
    # --cache-dir applies to every target, as `warm --layout vllm --cache-dir` applies it (issue 45)
    assert Path(by["v1"]["key_dir"]).parent == tmp_path / "sg" / "v2"
    assert Path(by["v2"]["key_dir"]) == tmp_path / "sg" / h
    assert Path(by["sg"]["key_dir"]).is_relative_to(tmp_path / "sg")
    check = run_cli("check", "--targets", t, "--cache-dir", str(tmp_path / "sg"), "--env-from", fingerprint(tmp_path),
                    "--strict", env=env_for(tmp_path))
    assert check.returncode == 0 and "3 of 3 targets covered" in check.stdout, check.stdout + check.stderr


@pytest.mark.parametrize("body,message", [
    ("  - {name: x, tp: 1, layouts: [sglang, vllm]}\n", "one engine per target"),
    ("  - {name: x, tp: 2, vllm_config_hash: 'ab'}\n", "vllm_config_hash goes with layouts: [vllm]"),
    ("  - {name: x, tp: 2, layouts: [vllm-dir]}\n", "needs --vllm-config-hash"),
    ("  - {name: x, tp: 2, layouts: [vllm], vllm_config_hash: '" + "ab" * 32 + "'}\n", "use --layout vllm-dir"),
    ("  - {name: x, tp: 1, layouts: [vllm, flashinfer-v2]}\n", "written from the sglang tuning"),
    ("  - {name: x, tp: 1, layouts: [trtllm]}\n", "warm writes"),
])
def test_targets_file_errors(tmp_path, body, message):
    proc = run_cli("plan", "--targets", targets(tmp_path, body), "--arch", "sm90", env=env_for(tmp_path))
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
