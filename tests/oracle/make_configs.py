"""Writes tests/data/configs/: config.json files for checkpoints whose own config the hub cannot
give here (no network), each derived from a shipped preset and stated as such.

NVFP4 (ModelOpt) checkpoints: the base model's config with its block-FP8 quantization_config
replaced by ModelOpt's NVFP4 one (quant_method modelopt, quant_algo NVFP4, 16-element groups) and
an ``ignore`` list. The lists below are assumptions (nvidia's hf_quant_config.json files cannot be
read here): attention and the MTP layer stay in bf16, except that DeepSeek-R1-0528-FP4-v2 also
quantizes o_proj ("additionally quantizes the wo module in attention layers", its model card).
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


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, cfg in CONFIGS.items():
        (OUT / f"{name}.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    # Llama-3.1-8B-Instruct-FP8: the 8B config with the 70B-FP8 checkpoint's ModelOpt FP8 facts.
    llama = json.loads((PRESETS / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
    llama["_fi_autotune_derived"] = "Meta-Llama-3.1-8B config; ModelOpt FP8 sidecar as nvidia/Llama-3.1-70B-Instruct-FP8's"
    (OUT / "nvidia--Llama-3.1-8B-Instruct-FP8.json").write_text(json.dumps(llama, indent=2, sort_keys=True) + "\n")
    (OUT / "nvidia--Llama-3.1-8B-Instruct-FP8.hf_quant_config.json").write_bytes(
        (PRESETS / "nvidia--Llama-3.1-70B-Instruct-FP8.hf_quant_config.json").read_bytes())


if __name__ == "__main__":
    main()
