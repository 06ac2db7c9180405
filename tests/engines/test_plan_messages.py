"""What plan says: the values of flags it does not understand (only secrets masked), the store a
single-GPU vLLM plan writes, key_dir when nothing is tuned, --skip-ops values, what --dp means."""

from __future__ import annotations

import json

from ..conftest import run_cli

SERVE = ["--", "python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "2",
         "--moe-runner-backend", "flashinfer_cutlass"]


def target_plan(proc) -> dict:
    """``plan --json``'s one worker (no speculative decoding here)."""
    (worker,) = json.loads(proc.stdout)["workers"]
    return worker


def test_a_flag_not_understood_shows_its_value_and_only_secrets_are_masked(tmp_path):
    proc = run_cli("plan", "--arch", "sm90", "--cache-dir", str(tmp_path), *SERVE,
                   "--max-prefill-tokens", "16384", "--api-key", "sk-secret")
    assert proc.returncode == 0, proc.stderr
    assert "not understood: --max-prefill-tokens 16384" in proc.stderr
    assert "sk-secret" not in proc.stderr + proc.stdout


def test_only_credentials_are_secret():
    from autotune_cache.engines.sglang.serving_command import is_secret
    secret = ["api_key", "admin_api_key", "ssl_keyfile_password", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY"]
    shown = ["max_prefill_tokens", "max_total_tokens", "ssl_keyfile", "speculative_token_map", "tokenizer_path",
             "kt_max_deferred_experts_per_token", "speculative_num_draft_tokens"]
    assert all(is_secret(n) for n in secret) and not any(is_secret(n) for n in shown)
    assert not is_secret("bucket_time_to_first_token", single=False)  # a list of latencies


def test_a_single_gpu_vllm_plan_names_the_store_it_writes_not_a_rank_file(tmp_path):
    args = ["plan", "--layout", "vllm", "--tp", "1", "--model", "Qwen/Qwen3-30B-A3B", "--moe-runner-backend",
            "flashinfer_cutlass", "--arch", "sm90", "--cache-dir", str(tmp_path)]
    human = run_cli(*args)
    assert human.returncode == 0, human.stderr
    assert "autotune_configs_dp0_rank0.json" not in human.stdout and "rank(s) share it" not in human.stdout
    assert "FlashInfer's managed store" in human.stdout and str(tmp_path / "v2") in human.stdout
    d = target_plan(run_cli(*args, "--json"))
    assert d["writes"] == "store_entries" and d["rank_files"] == [] and d["key_dir"] == str(tmp_path / "v2")


def test_key_dir_is_null_when_nothing_is_tuned(tmp_path):
    none = target_plan(run_cli("plan", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--arch", "sm90",
                              "--cache-dir", str(tmp_path), "--json"))
    assert none["autotunes"] is False and none["key_dir"] is None
    assert none["writes"] is None and none["key"]  # the key is still SGLang's
    some = target_plan(run_cli("plan", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--arch", "sm90",
                              "--moe-runner-backend", "flashinfer_cutlass", "--cache-dir", str(tmp_path),
                              "--json"))
    assert some["autotunes"] is True and some["key_dir"].startswith(str(tmp_path)) and some["writes"] == "rank_files"


def test_a_skip_op_that_names_no_tuned_op_is_said_so(tmp_path):
    base = ["plan", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--arch", "sm90", "--moe-runner-backend",
            "flashinfer_cutlass", "--cache-dir", str(tmp_path)]
    d = target_plan(run_cli(*base, "--skip-ops", "bogus", "--json"))
    assert "skip_ops=bogus" in d["key_string"]  # SGLang takes any name and hashes it
    assert d["profiles"] == 42  # and skips nothing
    assert any("bogus" in n and "trtllm::fused_moe::gemm1" in n for n in d["notes"])
    real = target_plan(run_cli(*base, "--skip-ops", "trtllm::fused_moe::gemm1,trtllm::fused_moe::gemm2",
                              "--json"))
    assert real["profiles"] == 0 and not any("names no" in n for n in real["notes"])


def test_the_plan_says_what_its_dp_means(tmp_path):
    base = ["plan", "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--dp", "8", "--arch", "sm100",
            "--cache-dir", str(tmp_path)]
    attn = run_cli(*base)
    assert "dp 8 = DP attention (SGLang --tp-size 8 --dp-size 8 --enable-dp-attention)" in attn.stdout
    assert "DP attention" in target_plan(run_cli(*base, "--json"))["dp_meaning"]
    rep = run_cli(*base, "--no-dp-attention")
    assert "dp 8 = 8 replicas (SGLang --tp-size 8 --dp-size 8 without --enable-dp-attention)" in rep.stdout
    one = target_plan(run_cli("plan", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--arch", "sm90", "--cache-dir",
                             str(tmp_path), "--json"))
    assert one["dp_meaning"] is None
