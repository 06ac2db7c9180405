"""``plan`` on a MoE model SGLang would not autotune names the runner backends under which it
would, each planned for real; a model that autotunes, or a dense one, gets no hint."""

from __future__ import annotations

import json

from ..conftest import run_cli


def _plan(*args):
    proc = run_cli("plan", "--arch", "sm90", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    (target,) = data["workers"]
    return {**target, "would_autotune_with": data["would_autotune_with"]}


def test_a_moe_model_left_on_auto_is_told_which_backend_would_autotune():
    data = _plan("--model", "Qwen/Qwen3-30B-A3B")
    assert data["autotunes"] is False
    hints = data["would_autotune_with"]
    assert [h["options"] for h in hints] == [{"moe_runner_backend": "flashinfer_cutlass"}]
    # the hint's numbers are the plan's own: the same command with the flag tunes that much
    chosen = _plan("--model", "Qwen/Qwen3-30B-A3B", "--moe-runner-backend", "flashinfer_cutlass")
    assert chosen["autotunes"] is True and hints[0]["profiles"] == chosen["profiles"] > 0
    human = run_cli("plan", "--arch", "sm90", "--model", "Qwen/Qwen3-30B-A3B").stdout
    assert "Hint        SGLang would autotune with --moe-runner-backend flashinfer_cutlass" in human


def test_mxfp4_is_offered_only_for_mxfp4_weights():
    offered = [h["options"]["moe_runner_backend"] for h in _plan("--model", "openai/gpt-oss-20b")["would_autotune_with"]]
    assert "flashinfer_mxfp4" in offered
    assert "flashinfer_mxfp4" not in [h["options"]["moe_runner_backend"]
                                      for h in _plan("--model", "Qwen/Qwen3-30B-A3B")["would_autotune_with"]]


def test_no_hint_where_it_autotunes_already_or_has_no_experts():
    assert _plan("--model", "Qwen/Qwen3-30B-A3B", "--moe-runner-backend", "flashinfer_cutlass")["would_autotune_with"] == []
    assert _plan("--model", "meta-llama/Meta-Llama-3.1-8B")["would_autotune_with"] == []


def test_presets_are_listed_and_a_mistyped_model_gets_the_nearest():
    listed = run_cli("plan", "--list-presets")
    assert listed.returncode == 0 and "Qwen/Qwen3-30B-A3B" in listed.stdout.split()
    typo = run_cli("plan", "--arch", "sm90", "--model", "qwen/qwen3-30b-a3b")
    assert typo.returncode == 2 and "did you mean Qwen/Qwen3-30B-A3B" in typo.stderr, typo.stderr
    assert len(typo.stderr.strip().splitlines()) == 1
    none = run_cli("plan", "--arch", "sm90", "--model", "foo/bar")
    assert none.returncode == 2 and "--list-presets" in none.stderr
