"""What plan says: the values of flags it does not understand (only secrets masked), the store a
single-GPU vLLM plan writes, key_dir when nothing is tuned, --skip-ops values, what --dp means."""

from __future__ import annotations

import json

from ..conftest import run_cli

SERVE = ["--", "python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "2",
         "--moe-runner-backend", "flashinfer_cutlass"]


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
