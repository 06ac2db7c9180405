"""Key schemas against the formula in sglang/srt/model_executor/runner/flashinfer_autotune.py."""

import hashlib

import pytest

from autotune_cache.errors import UsageError
from autotune_cache.keys import KeyFields, get_schema, render_dtype, render_optional

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
