"""Key schemas against the formula in sglang/srt/model_executor/runner/flashinfer_autotune.py."""

import hashlib

import pytest

from autotune_cache.errors import UsageError
from autotune_cache.plan.entry_key import KeyFields, get_schema, render_dtype, render_optional

GLM = KeyFields(
    model_path="zai-org/GLM-5.1-FP8", dtype="bfloat16", quantization="fp8",
    moe_runner_backend="flashinfer_trtllm", tp=8, pp=1, attn_dp_size=8, ep=1, config_class="GlmMoeDsaConfig",
)


def sha16(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()[:16]


def test_glm51_fp8_tp8_dp8_sm100_key():
    s = get_schema("sglang")
    expected = "zai-org/GLM-5.1-FP8|torch.bfloat16|fp8|flashinfer_trtllm|8|1|8|1|GlmMoeDsaConfig|candidate_selection=v2_default|skip_ops="
    assert s.key_string(GLM) == expected
    assert s.key(GLM) == "d99390dfa961185d" == sha16(expected)


def test_2605_schema_has_nine_fields():
    s = get_schema("sglang-2605")
    assert s.key_string(GLM) == "zai-org/GLM-5.1-FP8|torch.bfloat16|fp8|flashinfer_trtllm|8|1|8|1|GlmMoeDsaConfig"
    assert s.key(GLM) != get_schema("sglang").key(GLM)


def test_unset_quantization_renders_like_python_str_none():
    f = KeyFields("meta-llama/Llama-3.1-8B", "torch.bfloat16", None, "auto", 1, 1, 1, 1, "LlamaConfig")
    assert get_schema("sglang").key_parts(f)[2] == "None"
    assert render_optional("None") == "None"


def test_skip_ops_sorted_and_deduplicated():
    f = KeyFields("m", "bfloat16", "fp8", "auto", 1, 1, 1, 1, "C", skip_ops=("b_op", "a_op", "b_op"))
    assert get_schema("sglang").key_parts(f)[-1] == "skip_ops=a_op,b_op"


def test_draft_worker_appends_draft_quant():
    f = KeyFields("m", "bfloat16", "fp8", "auto", 1, 1, 1, 1, "C", draft_quantization=None, is_draft=True)
    assert get_schema("sglang").key_parts(f)[-1] == "draft_quant=None"


@pytest.mark.parametrize("given,rendered", [("bfloat16", "torch.bfloat16"), ("torch.float16", "torch.float16"), ("half", "torch.float16"), ("float", "torch.float32")])
def test_dtype_rendering(given, rendered):
    assert render_dtype(given) == rendered


def test_bad_inputs():
    with pytest.raises(UsageError):
        render_dtype("int3")
    with pytest.raises(UsageError, match="unknown key schema"):
        get_schema("vllm-99")


# Test vectors of every SGLang key schema of 2026. "sglang" (0.5.23) was computed by running
# SGLang 0.5.23's own flashinfer_autotune_cache_path() with a mocked runtime context; the others
# by the same formula over the fields each release's source appends (wheels 0.5.12-0.5.22 diffed).
R1 = dict(model_path="deepseek-ai/DeepSeek-R1", dtype="torch.bfloat16", quantization="fp8",
          moe_runner_backend="flashinfer_trtllm", tp=8, pp=1, attn_dp_size=1, ep=1, config_class="DeepseekV3Config")


@pytest.mark.parametrize("schema,key", [
    ("sglang-2605", "a0062e9e5f579d31"),  # 0.5.12-0.5.16
    ("sglang-0.5.17", "027ee27644446cb3"),  # 0.5.17: skip_ops=mxfp8_gemm by default
    ("sglang-0.5.18", "db1c0018a6755b11"),  # 0.5.18-0.5.22
    ("sglang", "d6c188ee4ed2a6da"),  # 0.5.23
])
def test_every_sglang_schema_of_2026(schema, key):
    from autotune_cache.engines.sglang.key_schemas import SCHEMAS
    from autotune_cache.plan.entry_key import KeyFields

    assert SCHEMAS[schema].key(KeyFields(**R1)) == key


def test_draft_key_and_skip_ops_rendering():
    import dataclasses

    from autotune_cache.engines.sglang.key_schemas import SCHEMAS
    from autotune_cache.plan.entry_key import KeyFields

    f = KeyFields(**R1)
    assert SCHEMAS["sglang"].key(dataclasses.replace(f, is_draft=True)) == "3b4bcb78b83e1372"
    assert SCHEMAS["sglang-0.5.17"].key_string(dataclasses.replace(f, skip_ops=("fp4_gemm",))).endswith(
        "|skip_ops=fp4_gemm,mxfp8_gemm")
    assert SCHEMAS["sglang-0.5.18"].key_string(dataclasses.replace(f, skip_ops=("b", "a"))).endswith("|skip_ops=a,b")


@pytest.mark.parametrize("version,schema", [
    ("0.5.12", "sglang-2605"), ("0.5.13.post1", "sglang-2605"), ("0.5.16", "sglang-2605"),
    ("0.5.17", "sglang-0.5.17"), ("0.5.18", "sglang-0.5.18"), ("0.5.22", "sglang-0.5.18"), ("0.5.23", "sglang"),
])
def test_schema_follows_the_sglang_release(version, schema):
    from autotune_cache.engines.sglang.key_schemas import schema_for_sglang

    assert schema_for_sglang(version) == schema


def test_unknown_releases_are_refused_naming_the_known_ones():
    from autotune_cache.errors import UsageError
    from autotune_cache.engines.sglang.key_schemas import schema_for_sglang

    with pytest.raises(UsageError, match=r"0.5.24: .*known: 0.5.12-0.5.16, 0.5.17, 0.5.18-0.5.22, 0.5.23"):
        schema_for_sglang("0.5.24")
    with pytest.raises(UsageError, match="0.5.12 was the first"):
        schema_for_sglang("0.5.11")


def test_engine_option_and_installed_sglang(tmp_path):
    """--engine picks the schema; without it, the sglang installed in this Python (read from its
    distribution metadata, not imported) does; neither: 0.5.23."""
    import json

    from ..conftest import run_cli

    args = ["plan", "--model", "deepseek-ai/DeepSeek-R1", "--tp", "8", "--arch", "sm100", "--json", "--cache-dir", str(tmp_path)]
    assert json.loads(run_cli(*args, "--engine", "sglang==0.5.20").stdout)["workers"][0]["key"] == "db1c0018a6755b11"
    assert json.loads(run_cli(*args).stdout)["workers"][0]["key"] == "d6c188ee4ed2a6da"
    site = tmp_path / "site"
    dist = site / "sglang-0.5.17.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.17\n")
    (dist / "RECORD").write_text("")
    import os

    proc = run_cli(*args, env={"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert json.loads(proc.stdout)["workers"][0]["key"] == "027ee27644446cb3"
    bad = run_cli(*args, "--engine", "sglang==0.5.99")
    assert bad.returncode == 2 and "known: 0.5.12-0.5.16" in bad.stderr


def test_megamoe_rank_files_are_named_by_gpu(tmp_path):
    import json

    from ..conftest import run_cli

    uuids = "GPU-DF3C1114-24C7-4A43-8149-B2A9B8445BB9,GPU-0a1b2c3d-24c7-4a43-8149-b2a9b8445bb9"
    proc = run_cli("plan", "--model", "zai-org/GLM-5.1-FP8", "--tp", "2", "--dp", "2", "--arch", "sm100",
                   "--moe-runner-backend", "flashinfer_megamoe", "--gpu-uuids", uuids, "--json", "--cache-dir", str(tmp_path))
    (plan,) = json.loads(proc.stdout)["workers"]
    assert plan["rank_files"] == ["rank_tp0_pp0_dp0_gpudf3c1114-24c7-4a43-8149-b2a9b8445bb9.json",
                                  "rank_tp1_pp0_dp1_gpu0a1b2c3d-24c7-4a43-8149-b2a9b8445bb9.json"]
    assert any("not modelled" in n for n in plan["notes"])
    proc = run_cli("plan", "--model", "zai-org/GLM-5.1-FP8", "--tp", "2", "--dp", "2", "--arch", "sm100",
                   "--moe-runner-backend", "flashinfer_megamoe", "--gpu-uuids", "GPU-1", "--cache-dir", str(tmp_path))
    assert proc.returncode == 2 and "not a GPU UUID" in proc.stderr
