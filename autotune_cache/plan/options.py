"""The serving options a user gives for one target - on the command line, in a targets file, or
pasted as a serving command - typed, and declared once.

``SERVING_OPTIONS`` is the one table: the CLI builds its click options from it
(``cli/serving.py``), a targets file's fields are checked against it (``from_fields``), and
``ServingOptions`` holds the values from parse to request. Names follow SGLang's flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from autotune_cache.errors import UsageError
from autotune_cache.plan.flags import ServerFlags


@dataclass(frozen=True)
class Option:
    name: str  # the Python name (a ServingOptions field)
    kind: str  # "str" | "positive" (int >= 1) | "flag" (bool) | "choice"
    default: Any = None
    help: str = ""
    flag: str | None = None  # the command-line spelling, when it is not --<name with dashes>
    choices: tuple[str, ...] = ()
    show_default: bool = False
    metavar: str | None = None  # how --help names the value (default: its type)

    @property
    def spelling(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


def _o(name: str, kind: str = "str", help: str = "", **kw) -> Option:  # noqa: A002
    """An option whose default is ``ServingOptions``'s (declared once, there)."""
    default = ServingOptions.__dataclass_fields__[name].default
    return Option(name, kind, default, help, show_default=default not in (None, "", False), **kw)




@dataclass(frozen=True)
class ServingOptions:
    """What the user said about one serving target, typed. ``None``: left to the default."""

    model: str | None = None
    model_path: str | None = None
    config_path: str | None = None
    revision: str | None = None
    arch: str | None = None
    tp: int = 1
    pp: int = 1
    dp: int = 1
    no_dp_attention: bool = False
    ep: int = 1
    dtype: str = "auto"
    quantization: str | None = None
    moe_runner_backend: str = "auto"
    skip_ops: str | tuple[str, ...] = ""  # "a,b" (ours) or a tuple (a serving command's tokens)
    max_running_requests: int | None = None
    cuda_graph_max_bs: int | None = None
    chunked_prefill_size: int | None = None
    autotune_extend: bool = False
    moe_fused_finalize: bool = False
    trust_remote_code: bool = False
    moe_a2a_backend: str = "none"
    kv_cache_dtype: str = "auto"
    page_size: int | None = None
    context_length: int | None = None
    attention_backend: str | None = None
    decode_attention_backend: str | None = None
    prefill_attention_backend: str | None = None
    dsa_decode_backend: str | None = None
    fp4_gemm_backend: str = "auto"
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_moe_runner_backend: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_attention_mode: str | None = None
    disaggregation_mode: str = "null"
    disable_cuda_graph: bool = False
    max_tokens: int | None = None
    gpu_uuids: str | tuple[str, ...] | None = None
    engine: str | None = None
    schema: str | None = None
    flashinfer_version: str | None = None
    #: Set by a pasted serving command, never by an option.
    autotune_disabled_by: str | None = None
    not_understood: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def pick(cls, values: Mapping[str, Any]) -> "ServingOptions":
        """The serving options out of a command's keyword arguments (the rest are the command's own)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    @classmethod
    def from_fields(cls, values: Mapping[str, Any], where: str, *, base: "ServingOptions | None" = None,
                    also_known: tuple[str, ...] = ()) -> "ServingOptions":
        """A targets file's fields (named as the flags are, dashes or underscores; ``dp_attention``
        as a boolean), checked as the command line checks them. ``also_known``: the file's other
        fields, named in the message for an unknown one."""
        out: dict[str, Any] = {}
        for name, value in values.items():
            key = str(name).replace("-", "_")
            if key == "config":
                key = "config_path"
            if key == "dp_attention":
                if not isinstance(value, bool):
                    raise UsageError(f"{where}: dp_attention is true or false, not {value!r}")
                # Like the flag: once any field says "no DP attention", it stays so.
                out["no_dp_attention"] = out.get("no_dp_attention", False) or not value
                continue
            option = BY_NAME.get(key)
            if option is None:
                known = sorted({o.spelling.lstrip("-").replace("-", "_") for o in SERVING_OPTIONS}
                               | {"dp_attention", *also_known})
                raise UsageError(f"{where}: unknown field {name!r} (known: {', '.join(known)})")
            out[key] = _checked(option, value, where)
            if key == "no_dp_attention":
                out[key] = out[key] or bool(values.get("dp_attention") is False)
        return dataclasses.replace(base or cls(), **out)

    def replace(self, **changes: Any) -> "ServingOptions":
        return dataclasses.replace(self, **changes)

    def flags(self, gpu_uuids: tuple[str, ...] = ()) -> ServerFlags:
        """The server flags these options say (``gpu_uuids``: resolved by the caller, who may
        have to ask this machine's GPUs)."""
        return ServerFlags(
            tp=self.tp, pp=self.pp, dp=self.dp, dp_attention=not self.no_dp_attention, ep=self.ep, dtype=self.dtype,
            quantization=None if self.quantization in (None, "None", "") else self.quantization,
            moe_runner_backend=self.moe_runner_backend, skip_ops=split_list(self.skip_ops),
            max_running_requests=self.max_running_requests, cuda_graph_max_bs=self.cuda_graph_max_bs,
            chunked_prefill_size=self.chunked_prefill_size, autotune_extend=self.autotune_extend,
            autotune_disabled_by=self.autotune_disabled_by, gpu_uuids=gpu_uuids,
            trust_remote_code=self.trust_remote_code, moe_a2a_backend=self.moe_a2a_backend or "none",
            kv_cache_dtype=self.kv_cache_dtype or "auto", page_size=self.page_size, context_length=self.context_length,
            attention_backend=self.attention_backend, decode_attention_backend=self.decode_attention_backend,
            prefill_attention_backend=self.prefill_attention_backend, dsa_decode_backend=self.dsa_decode_backend,
            fp4_gemm_backend=self.fp4_gemm_backend or "auto", speculative_algorithm=self.speculative_algorithm,
            speculative_num_steps=self.speculative_num_steps, speculative_eagle_topk=self.speculative_eagle_topk,
            speculative_num_draft_tokens=self.speculative_num_draft_tokens,
            speculative_moe_runner_backend=self.speculative_moe_runner_backend,
            speculative_draft_model_path=self.speculative_draft_model_path,
            speculative_attention_mode=self.speculative_attention_mode,
            disaggregation_mode=self.disaggregation_mode or "null", decode_cuda_graph=not self.disable_cuda_graph,
            moe_fused_finalize=self.moe_fused_finalize,
        )


SERVING_OPTIONS: tuple[Option, ...] = (
    _o("model", help="Where the config comes from: a hub id, a built-in preset, or a local model directory "
                     "(default: --model-path)."),
    _o("model_path", help="The server's --model-path exactly as it will be launched (hashed into the key), "
                          "e.g. /models/GLM-5.1-FP8 in an image (default: --model)."),
    _o("config_path", flag="--config", help="A config.json (or a directory holding one) to use instead of looking it up."),
    _o("revision", help="Hub revision of the config."),
    _o("arch", help="Target arch: sm90, sm100 or sm103 (default: this machine's GPU)."),
    _o("tp", "positive"),
    _o("pp", "positive"),
    _o("dp", "positive", help="Attention DP size (--enable-dp-attention), or replicas with --no-dp-attention."),
    _o("no_dp_attention", "flag", help="--dp means independent replicas."),
    _o("ep", "positive"),
    _o("dtype"),
    _o("quantization", help="The server's --quantization (default: unset)."),
    _o("moe_runner_backend"),
    _o("skip_ops", help="Comma-separated --flashinfer-autotune-skip-ops."),
    _o("max_running_requests", "positive"),
    _o("cuda_graph_max_bs", "positive"),
    _o("chunked_prefill_size", "positive"),
    _o("autotune_extend", "flag", help="The server runs with SGLANG_FLASHINFER_AUTOTUNE_EXTEND=1."),
    _o("moe_fused_finalize", "flag",
       help="The server runs with SGLANG_FLASHINFER_MOE_FUSED_FINALIZE=1 (in the cutlass MoE's key)."),
    _o("trust_remote_code", "flag",
       help="The server runs with --trust-remote-code (the key then hashes config.json's auto_map class)."),
    _o("moe_a2a_backend"),
    _o("kv_cache_dtype"),
    _o("page_size", "positive"),
    _o("context_length", "positive"),
    _o("attention_backend"),
    _o("decode_attention_backend"),
    _o("prefill_attention_backend"),
    _o("dsa_decode_backend"),
    _o("fp4_gemm_backend", help="The server's --fp4-gemm-backend (NVFP4 linear layers)."),
    _o("speculative_algorithm", help="EAGLE (NEXTN) or EAGLE3: SGLang then tunes a draft worker too, into an "
                                     "entry of its own."),
    _o("speculative_num_steps", "positive"),
    _o("speculative_eagle_topk", "positive"),
    _o("speculative_num_draft_tokens", "positive"),
    _o("speculative_moe_runner_backend"),
    _o("speculative_draft_model_path"),
    _o("speculative_attention_mode"),
    _o("disaggregation_mode", "choice", help="decode: a PD-disaggregated decode worker.",
       choices=("null", "decode")),
    _o("disable_cuda_graph", "flag", help="The server runs with --disable-cuda-graph."),
    _o("max_tokens", "positive", help="Tune buckets up to this many tokens instead of the engine's maximum."),
    _o("gpu_uuids", help="flashinfer_megamoe only: the serving GPUs' UUIDs in tp-rank order (comma-separated, as "
                         "nvidia-smi -L prints them), or 'auto' for this machine's (rank t on GPU t)."),
    _o("engine", metavar="sglang==X.Y.Z", help="The SGLang release that will serve: picks its cache-key schema (default: the sglang "
                      "installed here, read without importing it; else 0.5.23).", flag="--engine"),
    _o("schema", help="Key schema by name, overriding --engine."),
    _o("flashinfer_version", help="Default: the installed flashinfer-python."),
)
BY_NAME = {o.name: o for o in SERVING_OPTIONS}


def split_list(value: str | tuple | list | None) -> tuple[str, ...]:
    """``--skip-ops a,b`` (ours: comma-separated); a tuple comes from a serving command, where
    SGLang keeps each token whole."""
    if isinstance(value, (tuple, list)):
        return tuple(sorted(set(value)))
    return tuple(sorted({s.strip() for s in (value or "").split(",") if s.strip()}))


def take_options(values: dict, options: "tuple[Option, ...] | list[Option]", where: str) -> dict:
    """The fields of a targets-file entry that are ``options`` (an engine's own, such as vLLM's
    config hash), removed from ``values`` and checked as the command line checks them."""
    out = {}
    for option in options:
        for name in (option.name, option.name.replace("_", "-")):
            if name in values:
                value = values.pop(name)
                out[option.name] = None if value is None else _checked(option, value, where)
    return out


def _checked(option: Option, value: Any, where: str) -> Any:
    """One targets-file value, as the command line would take it (numbers for strings and lists
    for comma lists are accepted, as YAML writes them)."""
    label = option.spelling.lstrip("-").replace("-", "_")
    if option.kind == "flag":
        if not isinstance(value, bool):
            raise UsageError(f"{where}: {label} is true or false, not {value!r}")
        return value
    if value is None:
        return BY_NAME[option.name].default
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    if option.kind == "positive":
        try:
            n = int(str(value).strip()) if not isinstance(value, bool) else None
        except ValueError:
            n = None
        if n is None or n < 1:
            raise UsageError(f"{where}: Invalid value for '{option.spelling}': {value!r} is not a positive integer.")
        return n
    text = str(value)
    if option.kind == "choice" and text not in option.choices:
        raise UsageError(f"{where}: Invalid value for '{option.spelling}': {text!r} is not one of "
                         f"{', '.join(repr(c) for c in option.choices)}.")
    return text
