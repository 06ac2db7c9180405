"""Reading a pasted SGLang serving command, and the served model path."""

from __future__ import annotations

import json

import pytest

from autotune_cache.errors import UsageError
from autotune_cache.plan.config_source import PRESETS_DIR
from autotune_cache.engines.sglang.serving_command import parse_serving_command

from ..conftest import run_cli, run_json


def kw(*argv):
    return parse_serving_command(list(argv)).serving_kwargs()


def test_spellings_aliases_and_abbreviations():
    assert kw("python", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "8", "--dp", "8",
              "--enable-dp-attention", "--ep", "2") == {"model_path": "m", "tp": 8, "ep": 2, "dp": 8, "no_dp_attention": False}
    assert kw("sglang", "serve", "--model", "m", "--tensor-parallel-size=4", "--data-parallel-size", "2") == {
        "model_path": "m", "tp": 4, "dp": 2, "no_dp_attention": True}  # --dp-size alone: replicas
    assert kw("--model-path", "m", "--tp-size", "8", "--attn-dp-size", "4")["dp"] == 4
    assert kw("--model-path", "m", "--expert-parallel-size", "4", "--pp-size", "2") == {"model_path": "m", "pp": 2, "ep": 4}


def test_values_that_shape_the_plan():
    got = kw("SGLANG_FLASHINFER_AUTOTUNE_EXTEND=1", "SGLANG_CACHE_DIR=/cache", "python3", "-m", "sglang.launch_server",
             "--model-path", "m", "--quantization", "fp8", "--moe-runner-backend", "flashinfer_trtllm",
             "--cuda-graph-max-bs-decode", "256", "--max-running-requests", "512", "--chunked-prefill-size", "4096",
             "--flashinfer-autotune-skip-ops", "b", "a,c", "--dtype", "bfloat16")
    assert got == {"model_path": "m", "quantization": "fp8", "moe_runner_backend": "flashinfer_trtllm",
                   "cuda_graph_max_bs": 256, "max_running_requests": 512, "chunked_prefill_size": 4096,
                   "skip_ops": ("b", "a,c"), "dtype": "bfloat16", "autotune_extend": True, "cache_dir": "/cache"}


def test_flags_are_sorted_by_what_sglangs_code_showed_with_their_values():
    """Ignored only where the oracle showed the flag does not reach SGLang's autotune path; an
    SGLang or FlashInfer variable fi-autotune has no evidence on is "not understood", never ignored;
    a variable outside their namespaces (CUDA_*, NCCL_*, HF_*) is one their code never reads."""
    cmd = parse_serving_command(["SGLANG_X=1", "CUDA_X=1", "python", "-m", "sglang.launch_server", "--model-path", "m",
                                 "--host", "0.0.0.0", "--trust-remote-code", "--port=30000", "--mem-fraction-static",
                                 "0.9"])
    assert cmd.ignored[1:] == ["--host 0.0.0.0", "--port 30000", "--mem-fraction-static 0.9"]
    assert cmd.ignored[0].startswith("CUDA_X=1 (environment outside SGLang's and FlashInfer's")
    assert cmd.values["trust_remote_code"] is True  # modelled: it can change the key's config class
    assert cmd.not_understood == ["SGLANG_X=1 (environment: fi-autotune has no evidence on what it does)"]


def test_a_flag_read_at_a_flashinfer_call_site_is_never_ignored():
    """The probes compare SGLang's resolution, not its calls: a flag SGLang's MoE code reads (the
    MXFP4 activation precision) is not understood even though no probe changed the plan."""
    cmd = parse_serving_command(["--model-path", "m", "--flashinfer-mxfp4-moe-precision", "bf16"])
    assert not cmd.ignored and "--flashinfer-mxfp4-moe-precision bf16" in cmd.not_understood[0]


def test_env_prefix_and_credentials():
    """`env VAR=... python -m ...` reads the variables as a shell would; credentials never echo."""
    cmd = parse_serving_command(["env", "-u", "X", "SGLANG_FLASHINFER_AUTOTUNE_EXTEND=1", "HF_TOKEN=hf_secret",
                                 "python3", "-m", "sglang.launch_server", "--model-path", "m", "--api-key", "sk-1"])
    assert cmd.env == {"SGLANG_FLASHINFER_AUTOTUNE_EXTEND": "1"}
    shown = " ".join(cmd.ignored)
    assert "HF_TOKEN=***" in shown and "--api-key ***" in shown and "secret" not in shown and "sk-1" not in shown


def test_a_stray_argument_is_rejected_as_sglang_would():
    with pytest.raises(UsageError, match="takes no argument 'CUDA_X=1'"):
        parse_serving_command(["--model-path", "m", "--host", "0.0.0.0", "CUDA_X=1"])


def test_one_quoted_string_works_too():
    assert kw("python -m sglang.launch_server --model-path 'my model' --tp 2") == {"model_path": "my model", "tp": 2}


@pytest.mark.parametrize("argv,needle", [
    (["--model-path", "m", "--pp", "2"], "write --pp-size"),
    (["--model-path", "m", "--quant", "fp8"], "write --quantization"),
    (["--model-path", "m", "--cuda-graph-max-bs", "8"], "--cuda-graph-max-bs-decode"),
    (["--tp-size", "8"], "no --model-path"),
    (["--model-path", "m", "--tp-size", "eight"], "takes an integer"),
    (["--model-path"], "needs a value"),
])
def test_what_sglang_would_reject(argv, needle):
    with pytest.raises(UsageError, match=needle):
        parse_serving_command(argv)


def test_disabled_autotune_is_carried():
    cmd = parse_serving_command(["--model-path", "m", "--disable-flashinfer-autotune"])
    assert cmd.serving_kwargs()["autotune_disabled_by"] == "--disable-flashinfer-autotune"
    cmd = parse_serving_command(["SGLANG_FLASHINFER_AUTOTUNE_CACHE=0", "--model-path", "m"])
    assert "SGLANG_FLASHINFER_AUTOTUNE_CACHE=0" in cmd.autotune_disabled


def test_plan_from_the_serving_command_matches_the_flags(tmp_path):
    (by_flags,) = run_json("plan", "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--dp", "8", "--arch", "sm100",
                           "--cache-dir", str(tmp_path))["workers"]
    proc = run_cli("plan", "--arch", "sm100", "--cache-dir", str(tmp_path), "--json", "--", "python", "-m",
                   "sglang.launch_server", "--model-path", "zai-org/GLM-5.1-FP8", "--tp", "8", "--dp", "8",
                   "--enable-dp-attention", "--host", "0.0.0.0")
    assert proc.returncode == 0, proc.stderr
    (by_cmd,) = json.loads(proc.stdout)["workers"]
    assert by_cmd["key"] == by_flags["key"] == "d99390dfa961185d"
    assert "--host 0.0.0.0" in proc.stderr


def test_served_path_is_not_where_the_config_comes_from(tmp_path):
    """An image serves /models/GLM-5.1-FP8: the key hashes that path; the config comes from elsewhere."""
    proc = run_cli("plan", "--model", "/models/GLM-5.1-FP8", "--arch", "sm100", "--cache-dir", str(tmp_path))
    assert proc.returncode == 2 and "--model-path /models/GLM-5.1-FP8" in proc.stderr and "--config" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    (served,) = run_json("plan", "--model", "zai-org/GLM-5.1-FP8", "--model-path", "/models/GLM-5.1-FP8", "--tp", "8",
                         "--dp", "8", "--arch", "sm100", "--cache-dir", str(tmp_path))["workers"]
    assert served["key_string"].startswith("/models/GLM-5.1-FP8|") and served["source"]["kind"] == "preset"
    config = tmp_path / "cfg"
    config.mkdir()
    (preset,) = run_json("plan", "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--dp", "8", "--arch", "sm100",
                         "--cache-dir", str(tmp_path))["workers"]
    assert preset["key"] == "d99390dfa961185d"
    from autotune_cache.plan.config_source import PRESETS_DIR

    (config / "config.json").write_bytes((PRESETS_DIR / "zai-org--GLM-5.1-FP8.json").read_bytes())
    (from_config,) = run_json("plan", "--model-path", "/models/GLM-5.1-FP8", "--config", str(config), "--tp", "8",
                              "--dp", "8", "--arch", "sm100", "--cache-dir", str(tmp_path))["workers"]
    assert from_config["key"] == served["key"] and from_config["source"]["kind"] == "config-file"


def test_an_ep_outside_one_and_tp_with_cutlass_is_refused_as_sglang_refuses(tmp_path):
    """moe_hook.py handle_moe_kernel_config asserts ep_size in [1, tp_size] for flashinfer_cutlass
    (the dispatch table's "ep4" probe holds SGLang's own refusal of --tp 8 --ep 4)."""
    proc = run_cli("plan", "--arch", "sm90", "--cache-dir", str(tmp_path), "--", "python", "-m", "sglang.launch_server",
                   "--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "8", "--ep", "4", "--moe-runner-backend",
                   "flashinfer_cutlass")
    assert proc.returncode == 2
    assert "The expert parallel size must be 1 or the same as the tensor parallel size" in proc.stderr
    for ep in ("1", "8"):
        ok = run_cli("plan", "--arch", "sm90", "--cache-dir", str(tmp_path), "--model", "Qwen/Qwen3-30B-A3B", "--tp", "8",
                     "--ep", ep, "--moe-runner-backend", "flashinfer_cutlass")
        assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("override,needle", [
    ('{"num_experts": "x"}', "a config field is not a number"),
    ('{"hidden_size": [1]}', "a config field is not a number"),
    ('{"num_hidden_layers": -1}', "num_layers is -1"),
    ('{"num_experts_per_tok": 0}', "top_k is 0"),
])
def test_a_config_override_that_breaks_the_config_is_one_line_naming_it(tmp_path, override, needle):
    """A serving command's override (or a hand-edited config.json) with a field that is not a
    number, or a size below 1, is a usage error naming the overridden config - not an internal
    error, and not a complaint about --pp."""
    proc = run_cli("plan", "--arch", "sm90", "--cache-dir", str(tmp_path), "--", "python", "-m", "sglang.launch_server",
                   "--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass",
                   "--json-model-override-args", override)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "internal error" not in lines[0], proc.stderr
    assert needle in lines[0] and "overridden by the serving command" in lines[0], lines[0]


def test_a_config_without_a_required_field_is_one_line_naming_it(tmp_path):
    config = json.loads((PRESETS_DIR / "Qwen--Qwen3-30B-A3B.json").read_text())
    del config["vocab_size"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    proc = run_cli("plan", "--arch", "sm90", "--config", str(path), "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2",
                   "--moe-runner-backend", "flashinfer_cutlass", "--cache-dir", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.strip() == f"fi-autotune: error: --config: {path}: the config has no 'vocab_size'"


def test_config_overrides_change_the_shapes_not_the_key(tmp_path):
    """--json-model-override-args: SGLang applies it to the HF config (utils/hf_transformers/config.py
    get_config), so the MoE runs top-4 - and top_k reaches FlashInfer's keys - while SGLang's key
    string (model path, dtype, ..., config class) is the one without it."""
    base = ["plan", "--json", "--arch", "sm90", "--cache-dir", str(tmp_path), "--", "python", "-m",
            "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend",
            "flashinfer_cutlass"]
    (plain,) = json.loads(run_cli(*base).stdout)["workers"]
    (top4,) = json.loads(run_cli(*base, "--json-model-override-args", '{"num_experts_per_tok": 4}').stdout)["workers"]
    assert top4["key"] == plain["key"]
    assert plain["spec"]["moe"]["top_k"] == 8 and top4["spec"]["moe"]["top_k"] == 4
    (op,) = [op for w in top4["workloads"] for op in w["ops"]]
    assert op["kwargs"]["token_selected_experts"]["tensor"]["shape"] == ["M", 4]
    assert top4["source"]["overrides"] == ["num_experts_per_tok"] and top4["request"]["flags"]["config_overrides"]
    spec = run_cli("plan", "--arch", "sm100", "--cache-dir", str(tmp_path), "--model", "deepseek-ai/DeepSeek-V3",
                   "--tp", "8", "--speculative-algorithm", "EAGLE", "--json-model-override-args", '{"a": 1}')
    assert spec.returncode == 2 and "applies it to the draft" in spec.stderr
