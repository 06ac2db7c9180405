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
