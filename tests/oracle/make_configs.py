"""Writes tests/data/configs/: config.json files for checkpoints whose own config the hub cannot
give here (no network), each derived from a shipped preset and stated as such.

NVFP4 (ModelOpt) checkpoints: the base model's config with its block-FP8 quantization_config
replaced by ModelOpt's NVFP4 one (quant_method modelopt, quant_algo NVFP4, 16-element groups) and
an ``ignore`` list. The lists below are assumptions (nvidia's hf_quant_config.json files cannot be
read here): attention and the MTP layer stay in bf16, except that DeepSeek-R1-0528-FP4-v2 also
quantizes o_proj ("additionally quantizes the wo module in attention layers", its model card).
MoE checkpoints of further kinds of expert weights (``DISPATCH_CONFIGS``, served as
``fi-autotune-derived/...`` in the MoE dispatch table): a preset's config with the
quantization_config the named producer writes for that format; each says which in its note.
Run: python tests/oracle/make_configs.py (stdlib only).
"""

import copy
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRESETS = REPO / "autotune_cache" / "plan" / "presets"
OUT = REPO / "tests" / "data" / "configs"


def nvfp4(base: str, ignore: list[str], note: str) -> dict:
    cfg = copy.deepcopy(json.loads((PRESETS / f"{base}.json").read_text()))
    cfg.pop("quantization_config", None)
    group = {"num_bits": 4, "type": "float", "group_size": 16, "dynamic": False}
    cfg["quantization_config"] = {
        "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
        "producer": {"name": "modelopt"},
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": group, "input_activations": group}},
        "ignore": ignore,
    }
    cfg["_fi_autotune_derived"] = note
    return cfg


def attn(layers: int, extra: list[str] = ()) -> list[str]:
    return ["lm_head", "model.layers.*.self_attn*", f"model.layers.{layers}*", *extra]


def attn_but_o_proj(layers: int) -> list[str]:
    parts = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")
    return ["lm_head", *(f"model.layers.*.self_attn.{p}" for p in parts), f"model.layers.{layers}*"]


CONFIGS = {
    "nvidia--DeepSeek-R1-FP4": nvfp4("deepseek-ai--DeepSeek-R1", attn(61), "DeepSeek-R1 config + ModelOpt NVFP4 (attention and MTP layer bf16: assumed)"),
    "nvidia--DeepSeek-R1-0528-FP4": nvfp4("deepseek-ai--DeepSeek-R1", attn(61), "DeepSeek-R1 config + ModelOpt NVFP4 (attention and MTP layer bf16: assumed)"),
    "nvidia--DeepSeek-R1-0528-FP4-v2": nvfp4("deepseek-ai--DeepSeek-R1", attn_but_o_proj(61), "DeepSeek-R1 config + ModelOpt NVFP4 with o_proj quantized too (model card); other attention projections and the MTP layer bf16: assumed"),
    "nvidia--DeepSeek-V3.2-NVFP4": nvfp4("deepseek-ai--DeepSeek-V3.2", attn(61), "DeepSeek-V3.2 config + ModelOpt NVFP4 (attention incl. the indexer and the MTP layer bf16: assumed)"),
    "nvidia--GLM-5-NVFP4": nvfp4("zai-org--GLM-5", attn(78), "GLM-5 config + ModelOpt NVFP4 (attention and MTP layer bf16: assumed)"),
    "nvidia--GLM-5.1-NVFP4": nvfp4("zai-org--GLM-5.1", attn(78), "GLM-5.1 config + ModelOpt NVFP4 (attention and MTP layer bf16: assumed)"),
    "nvidia--GLM-5.2-NVFP4": nvfp4("zai-org--GLM-5.1", attn(78), "GLM-5.1's config (GLM-5.2-FP8 shares its shapes) + ModelOpt NVFP4 (attention and MTP layer bf16: assumed)"),
}


# --- MoE checkpoints of further kinds of expert weights, for the MoE dispatch table --------------
# (tests/oracle/record.py DISPATCH_MODELS). Each is a shipped preset's config with the
# quantization_config the named producer writes for that format; the served names are under
# "fi-autotune-derived/" because no such checkpoint's own config.json could be read here. Only
# the fields SGLang 0.5.23's quantization configs read matter (layers/quantization/*.py
# from_config); the rest follow the producer's usual output.

QWEN3_GATES = [f"model.layers.{i}.mlp.gate" for i in range(48)]


def derived(base: str, quantization_config: dict | None, note: str, **overrides) -> dict:
    cfg = copy.deepcopy(json.loads((PRESETS / f"{base}.json").read_text()))
    cfg.pop("quantization_config", None)
    cfg.update(overrides)
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    cfg["_fi_autotune_derived"] = note
    return cfg


def ct_args(num_bits: int, type_: str, strategy: str, *, dynamic: bool, group_size: int | None = None) -> dict:
    """One compressed-tensors QuantizationArgs as llm-compressor serializes it."""
    return {"num_bits": num_bits, "type": type_, "strategy": strategy, "symmetric": True, "dynamic": dynamic,
            "group_size": group_size, "block_structure": None, "actorder": None,
            "observer": None if dynamic else "minmax", "observer_kwargs": {}}


def compressed_tensors(fmt: str, weights: dict, input_activations: dict | None) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "global_compression_ratio": None, "kv_cache_scheme": None, "sparsity_config": {},
            "ignore": ["lm_head", "re:.*mlp.gate$"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": input_activations, "output_activations": None,
                                          "format": fmt}}}


DISPATCH_CONFIGS = {
    "fi-autotune-derived--Qwen3-30B-A3B-FP8-tensor-static": derived(
        "Qwen--Qwen3-30B-A3B",
        {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head", *QWEN3_GATES]},
        "Qwen3-30B-A3B config + per-tensor FP8 as AutoFP8 writes it (quant_method fp8, no weight_block_size, "
        "activation_scheme static: per-tensor weight and input scales; lm_head and the routers unquantized)"),
    "fi-autotune-derived--Qwen3-30B-A3B-FP8-tensor-dynamic": derived(
        "Qwen--Qwen3-30B-A3B",
        {"quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": ["lm_head", *QWEN3_GATES]},
        "Qwen3-30B-A3B config + per-tensor FP8 as AutoFP8 writes it with dynamic activation scales "
        "(quant_method fp8, no weight_block_size, activation_scheme dynamic)"),
    "fi-autotune-derived--Qwen3-30B-A3B-ModelOpt-FP8": derived(
        "Qwen--Qwen3-30B-A3B", None,
        "Qwen3-30B-A3B config; ModelOpt FP8 facts in the hf_quant_config.json sidecar beside it "
        "(quant_algo FP8: per-tensor weight and static input scales), as nvidia/Llama-3.1-70B-Instruct-FP8 ships them"),
    "fi-autotune-derived--DeepSeek-R1-W4AFP8": derived(
        "deepseek-ai--DeepSeek-R1",
        {"quant_method": "w4afp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]},
        "DeepSeek-R1 config with quant_method w4afp8 (int4 routed experts with FP8 activations, the rest block "
        "FP8), the format of the DeepSeek-R1 W4AFP8 checkpoints SGLang's w4afp8.py serves"),
    "fi-autotune-derived--Qwen3-30B-A3B-CT-FP8-dynamic": derived(
        "Qwen--Qwen3-30B-A3B",
        compressed_tensors("float-quantized", ct_args(8, "float", "channel", dynamic=False),
                           ct_args(8, "float", "token", dynamic=True)),
        "Qwen3-30B-A3B config + llm-compressor's FP8_DYNAMIC scheme (compressed-tensors float-quantized: "
        "per-channel FP8 weights, dynamic per-token FP8 activations; lm_head and the routers ignored), "
        "the scheme of the FP8-dynamic Qwen3 MoE checkpoints"),
    "fi-autotune-derived--Qwen3-30B-A3B-CT-W4A16": derived(
        "Qwen--Qwen3-30B-A3B",
        compressed_tensors("pack-quantized", ct_args(4, "int", "group", dynamic=False, group_size=128), None),
        "Qwen3-30B-A3B config + llm-compressor's W4A16 scheme (compressed-tensors pack-quantized: symmetric "
        "int4 weights in groups of 128, no actorder, bf16 activations; lm_head and the routers ignored)"),
    "fi-autotune-derived--Qwen3-30B-A3B-AWQ": derived(
        "Qwen--Qwen3-30B-A3B",
        {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
         "modules_to_not_convert": None},
        "Qwen3-30B-A3B config + AutoAWQ's quantization_config (4-bit GEMM, groups of 128, zero point); "
        "torch_dtype float16, as AutoAWQ saves", torch_dtype="float16"),
    "fi-autotune-derived--Qwen3-30B-A3B-GPTQ-Int4": derived(
        "Qwen--Qwen3-30B-A3B",
        {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
         "damp_percent": 0.01, "true_sequential": True, "static_groups": False, "checkpoint_format": "gptq",
         "lm_head": False, "model_name_or_path": None, "model_file_base_name": None},
        "Qwen3-30B-A3B config + AutoGPTQ's quantization_config as Qwen's GPTQ-Int4 releases carry it "
        "(4-bit, groups of 128, symmetric, no desc_act); torch_dtype float16, as AutoGPTQ saves",
        torch_dtype="float16"),
}
DISPATCH_SIDECARS = {
    "fi-autotune-derived--Qwen3-30B-A3B-ModelOpt-FP8": {
        "producer": {"name": "modelopt"},
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None,
                         "exclude_modules": ["lm_head", "model.layers.*.mlp.gate"]},
    },
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, cfg in (CONFIGS | DISPATCH_CONFIGS).items():
        (OUT / f"{name}.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    # Llama-3.1-8B-Instruct-FP8: the 8B config with the 70B-FP8 checkpoint's ModelOpt FP8 facts.
    llama = json.loads((PRESETS / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
    llama["_fi_autotune_derived"] = "Meta-Llama-3.1-8B config; ModelOpt FP8 sidecar as nvidia/Llama-3.1-70B-Instruct-FP8's"
    (OUT / "nvidia--Llama-3.1-8B-Instruct-FP8.json").write_text(json.dumps(llama, indent=2, sort_keys=True) + "\n")
    (OUT / "nvidia--Llama-3.1-8B-Instruct-FP8.hf_quant_config.json").write_bytes(
        (PRESETS / "nvidia--Llama-3.1-70B-Instruct-FP8.hf_quant_config.json").read_bytes())
    for name, sidecar in DISPATCH_SIDECARS.items():
        (OUT / f"{name}.hf_quant_config.json").write_text(json.dumps(sidecar, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
