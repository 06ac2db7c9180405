"""``check``: the coverage check a docker build can run (no GPU, no torch, no flashinfer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune_cache.plan.request import TuneRequest
from autotune_cache.plan.flags import ServerFlags
from devtools.synthetic import DEFAULT_METADATA, entry_path, write_plan_entry

from .conftest import imported_packages, run_cli

QWEN = ["--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass", "--arch", "sm90",
        "--flashinfer-version", "0.7.2.post1"]


def qwen_plan(root: Path, **flags):
    req = TuneRequest("Qwen/Qwen3-30B-A3B", ServerFlags(tp=2, moe_runner_backend="flashinfer_cutlass", **flags),
                      arch="sm90", flashinfer_version="0.7.2.post1", model_path=flags.pop("model_path", None))
    return req.plan(root)


def check(root: Path, *args, strict: bool = True):
    """(exit code, the report by worker, stderr): one worker's report itself, or target and draft."""
    proc = run_cli("check", "--cache-dir", str(root), *(["--strict"] if strict else []), "--json", *args)
    return proc.returncode, by_worker(json.loads(proc.stdout)) if proc.stdout.strip() else None, proc.stderr


def by_worker(envelope: dict) -> dict:
    workers = {w["worker"]: w for w in envelope["workers"]}
    assert envelope["ok"] == all(w["ok"] for w in workers.values()) and not envelope["errors"]
    return workers["target"] if len(workers) == 1 else {"ok": envelope["ok"], **workers}


@pytest.fixture
def fingerprint(tmp_path) -> Path:
    p = tmp_path / "env.json"
    p.write_text(json.dumps({"format": 1, "fingerprint": DEFAULT_METADATA, "arch": "sm90"}))
    return p


def test_a_complete_cache_passes(root, fingerprint):
    write_plan_entry(qwen_plan(root))
    code, report, _ = check(root, *QWEN, "--env-from", str(fingerprint))
    assert code == 0 and report["ok"] and report["found"]
    assert report["keys_checked"] == 42 and report["rank_files"] == 2 and report["warnings"] == []
    human = run_cli("check", *QWEN, "--cache-dir", str(root), "--env-from", str(fingerprint))
    assert human.returncode == 0 and "OK:" in human.stdout and "42 startup lookups, all present" in human.stdout


def test_served_path_versus_hub_id_is_named(root):
    write_plan_entry(qwen_plan(root))  # tuned for --model-path Qwen/Qwen3-30B-A3B
    code, report, _ = check(root, *QWEN, "--model-path", "/models/Qwen3-30B-A3B")
    assert code == 1 and not report["found"]
    (miss,) = report["misses"]
    assert "model path" in miss and "'Qwen/Qwen3-30B-A3B' there, '/models/Qwen3-30B-A3B' here" in miss
    # without --strict a miss is reported, not fatal
    assert check(root, *QWEN, "--model-path", "/models/Qwen3-30B-A3B", strict=False)[0] == 0


@pytest.mark.parametrize("flag,value,needle", [
    ("--ep", "2", "ep: 1 there, 2 here"),
    ("--skip-ops", "fp8_gemm", "--flashinfer-autotune-skip-ops"),
])
def test_other_key_fields_are_named(root, flag, value, needle):
    write_plan_entry(qwen_plan(root))
    code, report, _ = check(root, *QWEN, flag, value)
    assert code == 1 and needle in report["misses"][0], report["misses"]


def test_another_flashinfer_version_is_named(root):
    write_plan_entry(qwen_plan(root))
    args = [a if a != "0.7.2.post1" else "0.7.3" for a in QWEN]
    code, report, _ = check(root, *args)
    assert code == 1 and "FlashInfer version (0.7.2.post1 there, 0.7.3 for this server)" in report["misses"][0]


def test_a_release_whose_keys_are_not_recorded_cannot_pass_the_strict_gate(root):
    """A complete entry for FlashInfer 0.7.4: every key planned is there, but the keys are 0.7.2.post1's
    rules (0.7.4 changed some: docs/cache-layout.md), so --strict fails on that unknown, and without
    --strict it is a warning; 0.7.2, whose key code is the same, passes."""
    req = TuneRequest("Qwen/Qwen3-30B-A3B", ServerFlags(tp=2, moe_runner_backend="flashinfer_cutlass"), arch="sm90",
                      flashinfer_version="0.7.4")
    plan = req.plan(root)
    assert any("not checked" in n for n in plan.version_warnings)
    write_plan_entry(plan)
    args = [a if a != "0.7.2.post1" else "0.7.4" for a in QWEN]
    code, report, _ = check(root, *args)
    assert code == 1 and report["found"] and report["keys_missing"] == 0
    (miss,) = report["misses"]
    assert miss.startswith("FlashInfer 0.7.4: the keys planned here restate FlashInfer 0.7.2.post1's code")
    code, report, _ = check(root, *args, strict=False)
    assert code == 0 and report["ok"] and miss in report["warnings"]
    for version in ("0.7.2", "0.7.2.post1"):
        req = TuneRequest("Qwen/Qwen3-30B-A3B", ServerFlags(tp=2, moe_runner_backend="flashinfer_cutlass"), arch="sm90",
                          flashinfer_version=version)
        write_plan_entry(req.plan(root))
        assert not any("not checked" in n for n in req.plan(root).version_warnings)
        code, report, _ = check(root, *[a if a != "0.7.2.post1" else version for a in QWEN])
        assert code == 0 and report["misses"] == [], (version, report["misses"])


def test_missing_lookups_are_counted(root):
    write_plan_entry(qwen_plan(root), drop_buckets=(256,))
    code, report, _ = check(root, *QWEN)
    assert code == 1 and report["keys_missing"] == 2  # gemm1 and gemm2 at 256 tokens
    assert "2 of 42 moe.experts lookups" in report["misses"][0]


def test_incomplete_and_diverged_entries(root):
    eid = write_plan_entry(qwen_plan(root))
    d = entry_path(root, eid)
    obj = json.loads((d / "rank_tp1_pp0_dp0.json").read_text())
    key = next(k for k in obj if not k.startswith("_"))
    obj[key][1] += 1  # another tactic on one rank
    (d / "rank_tp1_pp0_dp0.json").write_text(json.dumps(obj))
    code, report, _ = check(root, *QWEN)
    assert code == 1 and any("differ" in m for m in report["misses"])
    (d / "rank_tp1_pp0_dp0.json").unlink()
    code, report, _ = check(root, *QWEN)
    assert code == 1 and any("1 of 2 rank files missing" in m for m in report["misses"])


def test_environment_of_the_serving_image(root, tmp_path):
    write_plan_entry(qwen_plan(root))
    h100 = tmp_path / "h100.json"
    h100.write_text(json.dumps({"fingerprint": {**DEFAULT_METADATA, "gpu": "NVIDIA H100 80GB HBM3"}}))
    code, report, _ = check(root, *QWEN, "--env-from", str(h100))
    assert code == 1 and "would ignore these files (gpu: 'NVIDIA H200' vs 'NVIDIA H100 80GB HBM3')" in report["misses"][0]
    blind = tmp_path / "blind.json"
    blind.write_text(json.dumps({"fingerprint": {**DEFAULT_METADATA, "cudnn_version": "unknown"}}))
    code, report, _ = check(root, *QWEN, "--env-from", str(blind))  # a gate never passes on an unknown
    assert code == 1 and any("cudnn_version" in m and "cannot be checked" in m for m in report["misses"])
    code, report, _ = check(root, *QWEN, "--env-from", str(blind), strict=False)
    assert code == 0 and any("cudnn_version" in w and "cannot be checked" in w for w in report["warnings"])
    code, report, _ = check(root, *QWEN)
    assert code == 0 and any("no --env-from" in w for w in report["warnings"])


def test_the_fingerprint_gives_arch_and_version(root, tmp_path):
    """In a docker build: the serving image's fingerprint says which FlashInfer and GPU arch."""
    write_plan_entry(qwen_plan(root))
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"fingerprint": {**DEFAULT_METADATA, "flashinfer_version": "0.7.2.post1"}, "arch": "sm90"}))
    code, report, _ = check(root, "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend",
                            "flashinfer_cutlass", "--env-from", str(env))
    assert code == 0 and report["entry"].startswith("0.7.2.post1/sm90/")


def test_an_arch_that_contradicts_the_env_from_is_refused_not_checked(root, tmp_path):
    """``--arch sm90`` with an env.json of an sm100 image: the gate checked sm90's tree and said
    OK, while the engine looks under sm100. One line, exit 2, under --strict or not."""
    write_plan_entry(qwen_plan(root))
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"fingerprint": {**DEFAULT_METADATA, "flashinfer_version": "0.7.2.post1"}, "arch": "sm100"}))
    for strict in ((), ("--strict",)):
        proc = run_cli("check", *strict, "--cache-dir", str(root), "--env-from", str(env), *QWEN)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "--arch sm90 here, but --env-from" in proc.stderr and "sm100" in proc.stderr


def test_the_serving_command_itself(root):
    write_plan_entry(qwen_plan(root))
    proc = run_cli("check", "--arch", "sm90", "--flashinfer-version", "0.7.2.post1", "--cache-dir", str(root), "--strict",
                   "--", "python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "2",
                   "--moe-runner-backend", "flashinfer_cutlass", "--host", "0.0.0.0", "--port", "30000")
    assert proc.returncode == 0, proc.stderr
    assert "ignored" in proc.stderr and "--host 0.0.0.0" in proc.stderr and "--port 30000" in proc.stderr
    proc = run_cli("check", "--tp", "4", "--arch", "sm90", "--cache-dir", str(root),
                   "--", "python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B", "--tp-size", "2")
    assert proc.returncode == 2 and "--tp is 4 here but 2 in the serving command" in proc.stderr


SGLANG_QWEN = ["python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B", "--moe-runner-backend",
               "flashinfer_cutlass"]


@pytest.mark.parametrize("command", ["plan", "check", "warm"])
@pytest.mark.parametrize("front,serving", [
    (["--tp", "2"], SGLANG_QWEN),  # the server runs TP1
    (["--dp", "2", "--tp", "2"], [*SGLANG_QWEN, "--tp-size", "2"]),  # no --enable-dp-attention: no DP attention
    (["--dtype", "float16"], SGLANG_QWEN),
    (["--autotune-extend"], SGLANG_QWEN),  # its environment variable is the command's
    (["--skip-ops", "x"], ["vllm", "serve", "Qwen/Qwen3-30B-A3B"]),
    (["--max-num-batched-tokens", "4096"], ["vllm", "serve", "Qwen/Qwen3-30B-A3B"]),  # an engine's own option
])
def test_a_server_option_the_serving_command_does_not_set_is_refused(root, command, front, serving):
    """The command is the server: an option given beside it that it does not set would plan an
    entry the server never reads (``--tp 2`` beside a TP1 server's command). One line, exit 2,
    naming the option; nothing written."""
    proc = run_cli(command, "--arch", "sm90", "--cache-dir", str(root), *front, "--", *serving)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"{front[0]} is " in lines[0] and "the serving command does not set it" in lines[0], lines[0]
    assert not any(root.iterdir())


def test_beside_a_serving_command_our_own_options_and_a_servers_default_are_taken(root, tmp_path):
    """fi-autotune's own options (the arch, the config, the key schema's release, --max-tokens,
    --cache-dir) are not the server's; a server option at the value the server runs with anyway
    changes nothing."""
    def plan(*front: str) -> dict:
        proc = run_cli("plan", "--json", "--arch", "sm90", "--cache-dir", str(tmp_path / "elsewhere"), *front,
                       "--", *SGLANG_QWEN)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["workers"][0]

    worker = plan("--engine", "sglang==0.5.23", "--max-tokens", "512", "--tp", "1", "--dtype", "auto")
    alone_worker = plan()
    assert worker["key"] == alone_worker["key"] and worker["max_tokens_override"] == 512


def test_nothing_to_tune_needs_no_cache(root):
    code, report, _ = check(root, "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--arch", "sm90")
    assert code == 0 and not report["autotunes"]
    code, report, _ = check(root, *QWEN[:-2], "--", "--model-path", "Qwen/Qwen3-30B-A3B", "--tp-size", "2",
                            "--moe-runner-backend", "flashinfer_cutlass", "--disable-flashinfer-autotune")
    assert code == 0 and not report["autotunes"]


def test_check_imports_neither_torch_nor_flashinfer(root, fingerprint):
    write_plan_entry(qwen_plan(root))
    proc = run_cli("check", *QWEN, "--cache-dir", str(root), "--env-from", str(fingerprint),
                   env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = imported_packages(proc.stderr)
    assert "click" in imported and not imported & {"torch", "flashinfer", "numpy"}


DSV3 = ["--arch", "sm100", "--flashinfer-version", "0.7.2.post1", "--", "python", "-m", "sglang.launch_server",
        "--model-path", "deepseek-ai/DeepSeek-V3", "--tp", "8"]
EAGLE = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4"]


def dsv3_plans(root: Path, **flags) -> list:
    req = TuneRequest("deepseek-ai/DeepSeek-V3", ServerFlags(tp=8, **flags), arch="sm100", flashinfer_version="0.7.2.post1")
    return [r.plan(root) for r in req.workers()]


def test_strict_check_fails_on_a_cache_tuned_without_fp8_kv(root):
    """--kv-cache-dtype fp8_e4m3 changes no part of the key, but every MLA decode lookup (query and
    KV in fp8, tests/data/sglang-0.5.23): a bf16-KV cache under the same key misses them all."""
    for p in dsv3_plans(root):
        write_plan_entry(p)
    assert check(root, *DSV3)[0] == 0
    code, report, _ = check(root, *DSV3, "--kv-cache-dtype", "fp8_e4m3")
    assert code == 1 and report["found"]
    assert any("attn.mla_decode.decode lookups" in m for m in report["misses"])
    for p in dsv3_plans(root, kv_cache_dtype="fp8_e4m3"):
        write_plan_entry(p)
    assert check(root, *DSV3, "--kv-cache-dtype", "fp8_e4m3")[0] == 0


def test_strict_check_fails_on_a_cache_tuned_without_speculative_decoding(root):
    """EAGLE keeps the target's key but tunes it in TARGET_VERIFY shapes, and adds a draft worker
    with a key of its own: a cache tuned for the plain command misses both."""
    for p in dsv3_plans(root):
        write_plan_entry(p)
    code, report, _ = check(root, *DSV3, *EAGLE)
    assert code == 1
    assert not report["ok"] and not report["target"]["ok"] and not report["draft"]["found"]
    assert any("target_verify" in m for m in report["target"]["misses"])
    for p in dsv3_plans(root, speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1,
                        speculative_num_draft_tokens=4):
        write_plan_entry(p)
    code, report, _ = check(root, *DSV3, *EAGLE)
    assert code == 0 and report["target"]["ok"] and report["draft"]["ok"]
    assert report["draft"]["entry"] != report["target"]["entry"]


@pytest.mark.parametrize("version,recorded", [
    ("0.7.2.post1", True), ("0.7.2", True), ("0.7.2.post1+cu130", True),  # a local build of a recorded release
    ("0.7.4", False), ("0.7.3", False), ("0.8.0rc1", False), ("0.7.2.post2", False),
])
def test_which_releases_the_key_rules_were_recorded_for(version, recorded):
    from autotune_cache.autotuner.lookup_keys import unrecorded_release_note

    note = unrecorded_release_note(version)
    assert (note is None) == recorded
    assert recorded or note.startswith(f"FlashInfer {version}: ") and f"for {version} they are not checked" in note
