"""Config sources (real files, a real Hugging Face cache layout) and the spec's pitfalls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune_cache.plan.config_source import load_model_config, preset_ids
from autotune_cache.errors import UsageError
from autotune_cache.plan.spec import Family, build_spec

from autotune_cache.plan.config_source import PRESETS_DIR as REF  # copies of shared/reference/model_configs


def ref(name: str) -> dict:
    return json.loads((REF / f"{name}.json").read_text())


def make_hf_cache(cache: Path, repo: str, files: dict[str, dict], revision="main", commit="0123456789abcdef0123456789abcdef01234567"):
    """The on-disk layout huggingface_hub reads: models--org--name/{refs/<rev>, snapshots/<commit>/...}."""
    base = cache / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True)
    (base / "refs" / revision).write_text(commit)
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, content in files.items():
        (snap / name).write_text(json.dumps(content))
    return snap


SHARED = Path(__file__).resolve().parents[3] / "shared" / "reference" / "model_configs"


def test_presets_are_the_reference_configs():
    """The presets are verbatim copies of shared/reference/model_configs (beside the checkout)."""
    if not SHARED.is_dir():
        pytest.skip("optional reference data (the real config.json files in ../shared/reference) is not present")
    shared = {p.name: p.read_bytes() for p in SHARED.glob("*.json")}
    presets = {p.name: p.read_bytes() for p in REF.glob("*.json") if not p.stem.endswith(".hf_quant_config")}
    assert presets == shared
    assert set(preset_ids()) == {p.stem.replace("--", "/") for p in SHARED.glob("*.json")}


def test_config_file_and_directory(tmp_path):
    cfg = tmp_path / "my.json"
    cfg.write_text(json.dumps(ref("Qwen--Qwen3-30B-A3B")))
    s = load_model_config("anything", config=str(cfg))
    assert s.kind == "config-file" and s.config["model_type"] == "qwen3_moe"
    d = tmp_path / "dir"
    d.mkdir()
    (d / "config.json").write_text(cfg.read_text())
    assert load_model_config("anything", config=str(d)).location == str(d / "config.json")
    with pytest.raises(UsageError, match="no such file"):
        load_model_config("x", config=str(tmp_path / "missing.json"))


def test_local_model_dir_with_modelopt_sidecar(tmp_path):
    d = tmp_path / "Llama-FP8"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(ref("nvidia--Llama-3.1-70B-Instruct-FP8")))
    (d / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"]}}))
    s = load_model_config(str(d))
    assert s.kind == "local-model" and "hf_quant_config.json" in s.describe()
    spec = build_spec(s)
    assert spec.quant.method == "modelopt_fp8" and spec.quant.source == "hf_quant_config.json"
    assert spec.quant.modules_not_quantized == ("lm_head",)


def test_hf_cache_is_used_before_presets_and_offline_is_honoured(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cfg = ref("zai-org--GLM-5.1-FP8")
    cfg["num_hidden_layers"] = 7  # prove which copy was read
    make_hf_cache(cache, "zai-org/GLM-5.1-FP8", {"config.json": cfg})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import importlib

    import huggingface_hub.constants as c

    importlib.reload(c)  # constants are read from the environment at import
    try:
        s = load_model_config("zai-org/GLM-5.1-FP8")
        assert s.kind == "hf-cache" and s.config["num_hidden_layers"] == 7
        # not cached -> preset (offline: the hub is never tried)
        s = load_model_config("deepseek-ai/DeepSeek-V3")
        assert s.kind == "preset"
        with pytest.raises(UsageError, match="HF_HUB_OFFLINE is set"):
            load_model_config("someone/unknown-model")
        # a revision that is not cached falls through too
        assert load_model_config("zai-org/GLM-5.1-FP8", revision="v2").kind == "preset"
    finally:
        monkeypatch.undo()
        importlib.reload(c)


def test_unknown_model_error_names_the_ways_out():
    with pytest.raises(UsageError) as e:
        load_model_config("nobody-knows-this-model")
    msg = str(e.value)
    assert "--config" in msg and "local model directory" in msg and "Hugging Face" in msg
    # a path that is not here: the served path is --model-path, the config comes from elsewhere
    with pytest.raises(UsageError) as e:
        load_model_config("./no/such/dir")
    msg = str(e.value)
    assert "--config" in msg and "--model-path ./no/such/dir" in msg


@pytest.mark.parametrize("name,family,cls,dtype", [
    ("meta-llama--Meta-Llama-3.1-8B", Family.DENSE, "LlamaConfig", "bfloat16"),
    ("mistralai--Mixtral-8x7B-v0.1", Family.GQA_MOE, "MixtralConfig", "bfloat16"),
    ("Qwen--Qwen3-30B-A3B", Family.GQA_MOE, "Qwen3MoeConfig", "bfloat16"),
    ("openai--gpt-oss-20b", Family.GQA_MOE, "GptOssConfig", "bfloat16"),  # no dtype at all
    ("deepseek-ai--DeepSeek-V3", Family.MLA_MOE, "DeepseekV3Config", "bfloat16"),
    ("moonshotai--Kimi-K2-Instruct", Family.MLA_MOE, "_KimiK2ConfigAlias", "bfloat16"),
    ("deepseek-ai--DeepSeek-V3.2", Family.MLA_DSA_MOE, "_DeepseekV32ConfigAlias", "bfloat16"),
    ("zai-org--GLM-5.1-FP8", Family.MLA_DSA_MOE, "GlmMoeDsaConfig", "bfloat16"),  # "dtype", not "torch_dtype"
])
def test_families_and_config_classes(tmp_path, name, family, cls, dtype):
    spec = build_spec(load_model_config("x", config=str(REF / f"{name}.json")))
    assert (spec.family, spec.config_class, spec.dtype) == (family, cls, dtype)


def test_spec_pitfalls():
    def spec(name, **patch):
        cfg = {**ref(name), **patch}
        from autotune_cache.plan.config_source import ConfigSource

        return build_spec(ConfigSource("config-file", name, cfg))

    glm = spec("zai-org--GLM-5.1-FP8")
    assert glm.head_dim == 192 + 64  # qk_nope + qk_rope, not config.json's head_dim 64
    assert glm.moe.num_experts == 256 and glm.moe.intermediate_size == 2048 and glm.dense_intermediate_size == 12288
    assert glm.num_moe_layers == 75 and glm.num_mtp_layers == 1
    assert glm.quant.is_block_fp8 and glm.quant.weight_block_size == (128, 128) and "lm_head" in glm.quant.modules_not_quantized
    mix = spec("mistralai--Mixtral-8x7B-v0.1")
    assert mix.moe.num_experts == 8 and mix.moe.intermediate_size == 14336 and mix.dense_intermediate_size is None
    qwen = spec("Qwen--Qwen3-30B-A3B")
    assert qwen.moe.num_experts == 128 and qwen.moe.intermediate_size == 768 and qwen.dense_intermediate_size is None
    oss = spec("openai--gpt-oss-120b")
    assert oss.moe.num_experts == 128 and oss.moe.top_k == 4 and oss.quant.method == "mxfp4" and oss.moe.has_bias
    assert spec("meta-llama--Meta-Llama-3.1-8B", torch_dtype="float32").dtype == "bfloat16"
    assert spec("meta-llama--Meta-Llama-3.1-8B", torch_dtype=None, dtype="float16").dtype == "float16"
    with pytest.raises(UsageError, match="supported: .*LlamaForCausalLM"):
        spec("meta-llama--Meta-Llama-3.1-8B", architectures=["BertModel"])
