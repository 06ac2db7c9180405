"""A typed, normalized view of a model's config.json: only what shapes the tuned kernels.

config.json files disagree on names and meanings; each pitfall is handled here once:
``dtype`` vs ``torch_dtype`` vs neither; ``n_routed_experts`` / ``num_experts`` /
``num_local_experts``; ``intermediate_size`` being the dense MLP width (DeepSeek, GLM, Qwen3-MoE)
or the expert width (Mixtral, gpt-oss); first dense layers; MTP layers; MLA head dims (GLM-5's
``head_dim`` is not its attention width); and the quantization config, in config.json or in
ModelOpt's ``hf_quant_config.json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from autotune_cache.plan.config_source import ConfigSource, load_model_config, with_overrides
from autotune_cache.errors import UsageError


class Family:
    DENSE = "dense"  # Llama
    GQA_MOE = "gqa_moe"  # Qwen3-MoE, Mixtral, gpt-oss
    MLA_MOE = "mla_moe"  # DeepSeek-V3/R1, Kimi-K2
    MLA_DSA_MOE = "mla_dsa_moe"  # DeepSeek-V3.2, GLM-5.x


# architecture -> (family, SGLang 0.5.23 model_type -> hf_config class name)
# Class names: what SGLang instantiates (sglang/srt/utils/hf_transformers/common.py _CONFIG_REGISTRY
# re-parses registered model types through its own aliases; the rest come from transformers 5.19).
ARCHITECTURES = {
    "LlamaForCausalLM": Family.DENSE,
    # EAGLE / EAGLE3 draft heads (models/llama_eagle*.py): one Llama decoder layer, bf16.
    "LlamaForCausalLMEagle": Family.DENSE,
    "LlamaForCausalLMEagle3": Family.DENSE,
    "MixtralForCausalLM": Family.GQA_MOE,
    "Qwen3MoeForCausalLM": Family.GQA_MOE,
    "GptOssForCausalLM": Family.GQA_MOE,
    "DeepseekV3ForCausalLM": Family.MLA_MOE,
    "DeepseekV32ForCausalLM": Family.MLA_DSA_MOE,
    "GlmMoeDsaForCausalLM": Family.MLA_DSA_MOE,
}
CONFIG_CLASSES = {
    "llama": "LlamaConfig",
    "mixtral": "MixtralConfig",
    "qwen3_moe": "Qwen3MoeConfig",
    "gpt_oss": "GptOssConfig",
    "deepseek_v3": "DeepseekV3Config",
    # SGLang registers aliases of transformers' DeepseekV3Config for these model types, and
    # get_config() re-instantiates the config through them: the key hashes the alias name.
    "deepseek_v32": "_DeepseekV32ConfigAlias",
    "kimi_k2": "_KimiK2ConfigAlias",
    "glm_moe_dsa": "GlmMoeDsaConfig",
}


#: Model types SGLang's get_config re-parses through its own _CONFIG_REGISTRY whatever
#: --trust-remote-code loaded (utils/hf_transformers/config.py HfModelConfigParser.parse).
SGLANG_REGISTERED = ("deepseek_v32", "kimi_k2")


@dataclass(frozen=True)
class QuantSpec:
    """Checkpoint quantization as SGLang's ModelConfig would classify it."""

    method: str  # fp8 | mxfp4 | modelopt_fp8 | modelopt_fp4 | ...
    fmt: str | None = None
    weight_block_size: tuple[int, int] | None = None  # (128, 128) for DeepSeek-style block FP8
    activation_scheme: str | None = None
    modules_not_quantized: tuple[str, ...] = ()
    kv_cache_quant_algo: str | None = None
    source: str = "config.json"

    @property
    def is_block_fp8(self) -> bool:
        return self.method == "fp8" and self.weight_block_size is not None


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    top_k: int
    intermediate_size: int  # per expert, before any TP split
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    layer_freq: int = 1
    n_group: int | None = None
    topk_group: int | None = None
    routed_scaling_factor: float | None = None
    norm_topk_prob: bool = True
    scoring_func: str = "softmax"
    has_bias: bool = False  # gpt-oss experts carry biases
    activation: str = "silu"
    swiglu_limit: float | None = None


@dataclass(frozen=True)
class MLASpec:
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None
    index_topk: int | None = None  # DSA
    index_head_dim: int | None = None
    index_n_heads: int | None = None
    #: YaRN's attention-scale factor (models/deepseek_v2.py: scaling *= mscale**2), 1.0 without YaRN.
    yarn_mscale_squared: float = 1.0

    @property
    def qk_head_dim(self) -> int:
        """The attention width per head; not config.json's ``head_dim`` (64 on GLM-5)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """The MLA decode call's bmm1_scale: qk_head_dim**-0.5, times YaRN's mscale squared."""
        return self.qk_head_dim ** -0.5 * self.yarn_mscale_squared


@dataclass(frozen=True)
class ModelSpec:
    architecture: str
    model_type: str
    family: str
    config_class: str
    dtype: str  # torch dtype name SGLang's --dtype auto resolves to
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int  # attention head width for GQA models
    vocab_size: int
    dense_intermediate_size: int | None  # width of dense MLP layers, None if the model has none
    max_position_embeddings: int
    num_mtp_layers: int = 0
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    quant: QuantSpec | None = None
    #: The class ``--trust-remote-code`` instantiates: config.json's ``auto_map`` AutoConfig class,
    #: unless SGLang re-parses the model type through its own registry (then ``config_class``).
    remote_config_class: str = ""
    #: The checkpoint-level quantization method when ``quant`` is None only because this (draft)
    #: model's layers are excluded from it: what SGLang's ModelConfig still reports (draft_quant=).
    config_quantization: str | None = None

    def nextn(self) -> "ModelSpec":
        """The speculative draft SGLang builds from the checkpoint's own MTP layer(s)
        (``<Arch>NextN``, ModelConfig(is_draft_model=True)): the MTP decoder layers only, each
        with the model's MoE block and attention; same config class and quantization."""
        if not self.num_mtp_layers:
            raise UsageError(f"{self.architecture} has no MTP layer (num_nextn_predict_layers): its EAGLE "
                             "draft needs --speculative-draft-model-path")
        moe = None
        if self.moe is not None:
            from dataclasses import replace as _replace

            moe = _replace(self.moe, first_dense_layers=0, layer_freq=1)
        from dataclasses import replace
        import fnmatch

        quant, config_quant = self.quant, None
        if quant is not None:
            # The MTP layer is decoder layer num_hidden_layers of the checkpoint; a ModelOpt exclude
            # list that covers it leaves the draft's MoE unquantized (bf16 trtllm MoE on sm100).
            path = f"model.layers.{self.num_layers}.mlp.experts"
            if any(fnmatch.fnmatch(path, pat) or path.startswith(pat.rstrip("*")) and pat.endswith("*")
                   for pat in quant.modules_not_quantized):
                quant, config_quant = None, quant.method
        return replace(self, architecture=self.architecture + "NextN", num_layers=self.num_mtp_layers,
                       num_mtp_layers=0, moe=moe, dense_intermediate_size=None, quant=quant,
                       config_quantization=config_quant)

    @property
    def num_moe_layers(self) -> int:
        if self.moe is None:
            return 0
        return sum(1 for i in range(self.moe.first_dense_layers, self.num_layers) if i % self.moe.layer_freq == 0)

    @property
    def num_dense_mlp_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def to_dict(self) -> dict:
        return asdict(self)


def _first(cfg: dict, *names, default=None):
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def _dtype(cfg: dict) -> str:
    """SGLang ``--dtype auto``: the config's dtype, float32 served as bfloat16, none as bfloat16."""
    raw = _first(cfg, "dtype", "torch_dtype")
    name = str(raw).replace("torch.", "") if raw is not None else "bfloat16"
    if name in ("float32", "float"):
        return "bfloat16"
    if name in ("float16", "half"):
        return "float16"
    return "bfloat16"


def _quant(cfg: dict, sidecar: dict | None) -> QuantSpec | None:
    q = cfg.get("quantization_config")
    if isinstance(q, dict) and q.get("quant_method") not in (None, "modelopt"):
        block = q.get("weight_block_size")
        return QuantSpec(
            method=str(q["quant_method"]).lower(),
            fmt=q.get("fmt") or _compressed_tensors_scheme(q),
            weight_block_size=tuple(block) if block else None,
            activation_scheme=q.get("activation_scheme"),
            modules_not_quantized=tuple(q.get("modules_to_not_convert") or q.get("ignored_layers") or ()),
        )
    # ModelOpt: quant_algo in config.json's quantization_config or in hf_quant_config.json
    # (SGLang ModelConfig._parse_modelopt_quant_config).
    modelopt = None
    source = "config.json"
    if isinstance(q, dict):
        modelopt = q.get("quantization", q)
    elif sidecar is not None:
        modelopt = sidecar.get("quantization", sidecar)
        source = "hf_quant_config.json"
    if not isinstance(modelopt, dict) or not modelopt.get("quant_algo"):
        return None
    algo = str(modelopt["quant_algo"]).upper()
    if algo == "FP8":
        method = "modelopt_fp8"
    elif "FP4" in algo:
        method = "modelopt_fp4"
    elif algo == "MIXED_PRECISION":
        method = "modelopt_mixed"
    else:
        method = f"modelopt_{algo.lower()}"
    return QuantSpec(
        method=method, fmt=algo,
        modules_not_quantized=tuple(modelopt.get("exclude_modules") or modelopt.get("ignore") or ()),
        kv_cache_quant_algo=modelopt.get("kv_cache_quant_algo"), source=source,
    )


def _compressed_tensors_scheme(q: dict) -> str | None:
    """A compressed-tensors checkpoint's scheme, from its first config group: ``float8-w8a8``,
    ``int4-w4a16`` (``<weight type><bits>-w<bits>a<activation bits, 16 without>``)."""
    groups = q.get("config_groups") if q.get("quant_method") == "compressed-tensors" else None
    group = next(iter(groups.values()), None) if isinstance(groups, dict) and groups else None
    weights = group.get("weights") if isinstance(group, dict) else None
    if not isinstance(weights, dict):
        return None
    acts = group.get("input_activations") or {}
    bits, act_bits = weights.get("num_bits"), acts.get("num_bits", 16) if isinstance(acts, dict) else 16
    return f"{weights.get('type', 'int')}{bits}-w{bits}a{act_bits}"


def _yarn_mscale_squared(cfg: dict) -> float:
    """models/deepseek_v2.py DeepseekV2AttentionMLA: with YaRN rope scaling, the softmax scale is
    multiplied by yarn_get_mscale(factor, mscale_all_dim)**2 = (0.1 * mscale_all_dim * ln(factor) + 1)**2."""
    import math

    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(rope, dict) or rope.get("rope_type", rope.get("type")) not in ("yarn", "deepseek_yarn"):
        return 1.0
    factor = float(rope.get("factor") or 1.0)
    mscale_all_dim = float(rope.get("mscale_all_dim") or 0.0)
    mscale = 1.0 if factor <= 1 or not mscale_all_dim else 0.1 * mscale_all_dim * math.log(factor) + 1.0
    return mscale * mscale


def _moe_spec(cfg: dict, arch: str, family: Family, model_type: str) -> tuple[MoESpec | None, int | None]:
    """(the MoE layers' spec, the dense MLP width) - which config names mean what, per family."""
    moe = None
    dense_inter: int | None = int(cfg["intermediate_size"]) if cfg.get("intermediate_size") else None
    num_experts = _first(cfg, "n_routed_experts", "num_experts", "num_local_experts")
    if family != Family.DENSE:
        if not num_experts:
            raise UsageError(f"{arch} config has no expert count (n_routed_experts / num_experts / num_local_experts)")
        expert_inter = _first(cfg, "moe_intermediate_size")
        if expert_inter is None:
            # Mixtral and gpt-oss: intermediate_size *is* the expert width; no dense MLP layers.
            expert_inter, dense_inter = cfg["intermediate_size"], None
        first_dense = int(_first(cfg, "first_k_dense_replace", default=0))
        if model_type == "qwen3_moe" and not cfg.get("mlp_only_layers") and int(cfg.get("decoder_sparse_step", 1)) == 1:
            dense_inter = None  # every layer is MoE; intermediate_size is unused
        if first_dense == 0 and model_type in ("mixtral", "gpt_oss"):
            dense_inter = None
        moe = MoESpec(
            num_experts=int(num_experts),
            top_k=int(_first(cfg, "num_experts_per_tok", "experts_per_token")),
            intermediate_size=int(expert_inter),
            num_shared_experts=int(_first(cfg, "n_shared_experts", default=0)),
            first_dense_layers=first_dense,
            layer_freq=int(_first(cfg, "moe_layer_freq", default=1)),
            n_group=_first(cfg, "n_group"),
            topk_group=_first(cfg, "topk_group"),
            routed_scaling_factor=_first(cfg, "routed_scaling_factor"),
            norm_topk_prob=bool(_first(cfg, "norm_topk_prob", default=True)),
            scoring_func=str(_first(cfg, "scoring_func", default="softmax")),
            has_bias=model_type == "gpt_oss",
            activation=str(_first(cfg, "hidden_act", default="silu")),
            swiglu_limit=_first(cfg, "swiglu_limit"),
        )

    return moe, dense_inter


def _mla_spec(cfg: dict, family: Family) -> MLASpec | None:
    mla = None
    if family in (Family.MLA_MOE, Family.MLA_DSA_MOE):
        mla = MLASpec(
            kv_lora_rank=int(cfg["kv_lora_rank"]),
            qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
            qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
            v_head_dim=int(cfg["v_head_dim"]),
            q_lora_rank=_first(cfg, "q_lora_rank"),
            index_topk=_first(cfg, "index_topk") if family == Family.MLA_DSA_MOE else None,
            index_head_dim=_first(cfg, "index_head_dim") if family == Family.MLA_DSA_MOE else None,
            index_n_heads=_first(cfg, "index_n_heads") if family == Family.MLA_DSA_MOE else None,
            yarn_mscale_squared=_yarn_mscale_squared(cfg),
        )
    return mla


#: The sizes every model has, and every MoE model's: a config (or a serving command's override of
#: it) that sets one to zero or below describes no model the server would build.
_POSITIVE = ("hidden_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "vocab_size")
_POSITIVE_MOE = ("num_experts", "top_k", "intermediate_size")


def build_spec(source: ConfigSource) -> ModelSpec:
    """What the planners read from the config. A field that is missing or not a number (a
    hand-edited config.json, an override such as ``{"n_routed_experts": "x"}``) or a size below 1
    is one line naming the config, never an internal error or a wrong plan."""
    try:
        spec = _build_spec(source)
    except KeyError as e:
        raise UsageError(f"{source.describe()}: the config has no {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise UsageError(f"{source.describe()}: a config field is not a number: {e}") from None
    sizes = [(n, getattr(spec, n)) for n in _POSITIVE] + [(n, getattr(spec.moe, n)) for n in _POSITIVE_MOE if spec.moe]
    for name, value in sizes:
        if value < 1:
            raise UsageError(f"{source.describe()}: {name} is {value}: the server builds no such model")
    return spec


def _build_spec(source: ConfigSource) -> ModelSpec:
    cfg = source.config
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in ARCHITECTURES:
        raise UsageError(
            f"unsupported architecture {arch!r} (from {source.describe()}); supported: "
            + ", ".join(sorted(ARCHITECTURES))
        )
    family = ARCHITECTURES[arch]
    model_type = str(cfg.get("model_type"))
    config_class = CONFIG_CLASSES.get(model_type)
    if config_class is None:
        raise UsageError(f"unsupported model_type {model_type!r} for {arch}; supported: {', '.join(sorted(CONFIG_CLASSES))}")
    hidden = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(_first(cfg, "num_key_value_heads", default=heads))

    moe, dense_inter = _moe_spec(cfg, arch, family, model_type)
    mla = _mla_spec(cfg, family)
    head_dim = mla.qk_head_dim if mla else int(_first(cfg, "head_dim", default=hidden // heads))

    auto_config = str((cfg.get("auto_map") or {}).get("AutoConfig") or "")
    remote_class = config_class if model_type in SGLANG_REGISTERED or "." not in auto_config \
        else auto_config.rsplit(".", 1)[1]
    return ModelSpec(
        remote_config_class=remote_class,
        architecture=arch,
        model_type=model_type,
        family=family,
        config_class=config_class,
        dtype=_dtype(cfg),
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=int(cfg["vocab_size"]),
        dense_intermediate_size=dense_inter,
        max_position_embeddings=int(_first(cfg, "max_position_embeddings", default=4096)),
        num_mtp_layers=int(_first(cfg, "num_nextn_predict_layers", default=0)),
        moe=moe,
        mla=mla,
        quant=_quant(cfg, source.quant_sidecar),
    )


def load_spec(model: str, *, config: str | None, revision: str | None, model_path: str | None,
              overrides: dict | None = None, merge_rope: bool = True) -> tuple[ConfigSource, ModelSpec]:
    """The model's config, as the server's config override flag leaves it (``overrides``,
    ``config_source.with_overrides``), and what the planners read from it (no engine's view yet)."""
    source = load_model_config(model, config=config, revision=revision, model_path=model_path)
    source = with_overrides(source, overrides, merge_rope=merge_rope)
    return source, build_spec(source)
