"""The serving options a user gives for one target - on the command line, in a targets file, or
pasted as a serving command - typed, and declared once.

``SERVING_OPTIONS`` is the one table. Each row is one option: its name, kind, default, help and
command-line spelling, the SGLang flags (argparse dests) a pasted serving command sets it from,
and the recorded server flag (``plan.flags.ServerFlags``) it fills. Everything else is derived
from it: the CLI's click options (``cli/serving.py``), a targets file's fields (``from_fields``),
the ``ServingOptions`` record (generated below), the recorded ``ServerFlags`` values
(``ServingOptions.flags``, transforms in ``RECORDED_AS``) and the SGLang flags fi-autotune models
(``engines/sglang/serving_command.MODELLED``). A new option is one row, plus the resolution code
that reads its server flag and that flag's field in ``ServerFlags`` (the manifest's recorded
form, written out by hand so its keys and their order stay what entries on disk hold;
tests/plan/test_options.py fails when the two disagree).

Why here, on the ``plan`` floor, though the options are named after SGLang's flags: every engine
takes them (vLLM's targets read the same topology and backend options), the CLI and the request
builder read them, and ``ServerFlags`` is built from them - all of which sit below or beside the
engines, and no engine may import another's package. The SGLang-specific reading (its parser,
its flag table, its choices) stays in ``engines/sglang``, which reads the ``reads`` column.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Callable, Mapping

from autotune_cache.errors import UsageError
from autotune_cache.plan.flags import ServerFlags

#: ``Option.records`` default: the server flag of the option's own name.
SAME = "="


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
    #: The SGLang flags (argparse dests) a pasted serving command sets this option from.
    reads: tuple[str, ...] = ()
    #: The ``ServerFlags`` field the option fills (None: not a server flag), as ``RECORDED_AS`` says.
    records: str | None = None
    #: False: set from a pasted serving command only, never a flag or a targets-file field.
    given: bool = True
    #: fi-autotune's own setting (where the config comes from, the arch, the key schema...), which
    #: no serving command says. Every other option is the server's: with a serving command
    #: pasted, the command alone says it (``cli/serving.fold_serving_command``).
    ours: bool = False

    @property
    def spelling(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


def _o(name: str, kind: str = "str", default: Any = None, help: str = "", *,  # noqa: A002
       records: str | None = SAME, **kw) -> Option:
    """A row: recorded as the server flag of its own name unless ``records`` says otherwise."""
    return Option(name, kind, default, help, show_default=default not in (None, "", False),
                  records=name if records == SAME else records, **kw)


SERVING_OPTIONS: tuple[Option, ...] = (
    _o("model", help="Where the config comes from: a hub id, a built-in preset, or a local model directory "
                     "(default: --model-path).", records=None, ours=True),
    _o("model_path", help="The server's --model-path exactly as it will be launched (hashed into the key), "
                          "e.g. /models/GLM-5.1-FP8 in an image (default: --model).", reads=("model_path",),
       records=None),
    _o("config_path", flag="--config", help="A config.json (or a directory holding one) to use instead of looking it up.",
       records=None, ours=True),
    _o("revision", help="Hub revision of the config.", reads=("revision",), records=None),
    _o("arch", help="Target arch: sm90, sm100 or sm103 (default: this machine's GPU).", records=None, ours=True),
    _o("tp", "positive", 1, reads=("tp_size",)),
    _o("pp", "positive", 1, reads=("pp_size",)),
    # parallel_hook.py: --dp-size counts replicas unless --enable-dp-attention; --attn-dp-size is DP attention
    _o("dp", "positive", 1, help="Attention DP size (--enable-dp-attention), or replicas with --no-dp-attention.",
       reads=("dp_size", "attn_dp_size")),
    _o("no_dp_attention", "flag", False, help="--dp means independent replicas.", reads=("enable_dp_attention",),
       records="dp_attention"),
    _o("ep", "positive", 1, reads=("ep_size",)),
    _o("dtype", default="auto", reads=("dtype",)),
    _o("quantization", help="The server's --quantization (default: unset).", reads=("quantization",)),
    _o("moe_runner_backend", default="auto", reads=("moe_runner_backend",)),
    # "a,b" (ours) or a tuple (a serving command's tokens)
    _o("skip_ops", default="", help="Comma-separated --flashinfer-autotune-skip-ops.",
       reads=("flashinfer_autotune_skip_ops",)),
    _o("max_running_requests", "positive", reads=("max_running_requests",)),
    _o("cuda_graph_max_bs", "positive", reads=("cuda_graph_max_bs_decode",)),
    _o("chunked_prefill_size", "positive", reads=("chunked_prefill_size",)),
    _o("autotune_extend", "flag", False, help="The server runs with SGLANG_FLASHINFER_AUTOTUNE_EXTEND=1."),
    _o("moe_fused_finalize", "flag", False,
       help="The server runs with SGLANG_FLASHINFER_MOE_FUSED_FINALIZE=1 (in the cutlass MoE's key)."),
    _o("trust_remote_code", "flag", False,
       help="The server runs with --trust-remote-code (the key then hashes config.json's auto_map class).",
       reads=("trust_remote_code",)),
    _o("moe_a2a_backend", default="none", reads=("moe_a2a_backend",)),
    _o("kv_cache_dtype", default="auto", reads=("kv_cache_dtype",)),
    _o("page_size", "positive", reads=("page_size",)),
    _o("context_length", "positive", reads=("context_length",)),
    _o("attention_backend", reads=("attention_backend",)),
    _o("decode_attention_backend", reads=("decode_attention_backend",)),
    _o("prefill_attention_backend", reads=("prefill_attention_backend",)),
    _o("dsa_decode_backend", reads=("dsa_decode_backend",)),
    _o("fp4_gemm_backend", default="auto", help="The server's --fp4-gemm-backend (NVFP4 linear layers).",
       reads=("fp4_gemm_runner_backend",)),
    _o("speculative_algorithm", help="EAGLE (NEXTN) or EAGLE3: SGLang then tunes a draft worker too, into an "
                                     "entry of its own.", reads=("speculative_algorithm",)),
    _o("speculative_num_steps", "positive", reads=("speculative_num_steps",)),
    _o("speculative_eagle_topk", "positive", reads=("speculative_eagle_topk",)),
    _o("speculative_num_draft_tokens", "positive", reads=("speculative_num_draft_tokens",)),
    _o("speculative_moe_runner_backend", reads=("speculative_moe_runner_backend",)),
    _o("speculative_draft_model_path", reads=("speculative_draft_model_path",)),
    _o("speculative_attention_mode", reads=("speculative_attention_mode",)),
    _o("disaggregation_mode", "choice", "null", help="decode: a PD-disaggregated decode worker.",
       choices=("null", "decode"), reads=("disaggregation_mode",)),
    # --disable-decode-cuda-graph: the decode half of it, which is what the passes read
    _o("disable_cuda_graph", "flag", False, help="The server runs with --disable-cuda-graph.",
       reads=("disable_cuda_graph", "disable_decode_cuda_graph"), records="decode_cuda_graph"),
    _o("max_tokens", "positive", help="Tune buckets up to this many tokens instead of the engine's maximum.",
       records=None, ours=True),
    # recorded as resolved by the caller (``auto``: this machine's GPUs), not as given
    _o("gpu_uuids", help="flashinfer_megamoe only: the serving GPUs' UUIDs in tp-rank order (comma-separated, as "
                         "nvidia-smi -L prints them), or 'auto' for this machine's (rank t on GPU t).", ours=True),
    _o("engine", metavar="sglang==X.Y.Z", help="The SGLang release that will serve: picks its cache-key schema (default: the sglang "
                      "installed here, read without importing it; else 0.5.23).", flag="--engine", records=None,
       ours=True),
    _o("schema", help="Key schema by name, overriding --engine.", records=None, ours=True),
    _o("flashinfer_version", help="Default: the installed flashinfer-python.", records=None, ours=True),
    _o("json_model_override_args", metavar="JSON",
       help="A JSON object the server applies to the model's config (SGLang --json-model-override-args, vLLM "
            "--hf-overrides): the plan reads the config with it applied.",
       reads=("json_model_override_args",), records="config_overrides"),
    # Why the server will not autotune at all: the serving command's flag (or environment) that says so.
    _o("autotune_disabled_by", reads=("disable_flashinfer_autotune", "enable_deterministic_inference"), given=False),
)
#: The options a user gives as flags or targets-file fields (the rest come from a serving command).
GIVEN_OPTIONS = tuple(o for o in SERVING_OPTIONS if o.given)
BY_NAME = {o.name: o for o in GIVEN_OPTIONS}


def _recorded_or(default: str) -> Callable[[Any], Any]:
    return lambda value: value or default


#: The options recorded other than as given, by option name: value -> the server flag's value
#: (``Option.records`` names the flag). ``gpu_uuids`` is recorded as its caller resolved it.
RECORDED_AS: dict[str, Callable[[Any], Any]] = {
    "no_dp_attention": operator.not_,  # -> dp_attention
    "disable_cuda_graph": operator.not_,  # -> decode_cuda_graph
    "quantization": lambda value: None if value in (None, "None", "") else value,
    "skip_ops": lambda value: split_list(value),
    "moe_a2a_backend": _recorded_or("none"),
    "kv_cache_dtype": _recorded_or("auto"),
    "fp4_gemm_backend": _recorded_or("auto"),
    "disaggregation_mode": _recorded_or("null"),
    "json_model_override_args": lambda value: canonical_overrides(value),
}


def canonical_overrides(value: "str | dict | None") -> str | None:
    """A config override as recorded: the JSON object with sorted keys; None for none (``{}``)."""
    import json

    if value is None or value == "":
        return None
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        raise UsageError(f"--json-model-override-args {str(value)[:80]!r}: not JSON") from None
    if not isinstance(parsed, dict):
        raise UsageError(f"--json-model-override-args {str(value)[:80]!r}: a JSON object is wanted")
    return json.dumps(parsed, sort_keys=True) if parsed else None


class _Record:
    """``ServingOptions``'s methods; its fields are the table's rows (generated below)."""

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
                known = sorted({o.spelling.lstrip("-").replace("-", "_") for o in GIVEN_OPTIONS}
                               | {"dp_attention", *also_known})
                raise UsageError(f"{where}: unknown field {name!r} (known: {', '.join(known)})")
            out[key] = _checked(option, value, where)
            if key == "no_dp_attention":
                out[key] = out[key] or bool(values.get("dp_attention") is False)
        return dataclasses.replace(base or cls(), **out)

    def replace(self, **changes: Any) -> "ServingOptions":
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def flags(self, gpu_uuids: tuple[str, ...] = ()) -> ServerFlags:
        """The server flags these options say (``gpu_uuids``: resolved by the caller, who may
        have to ask this machine's GPUs)."""
        recorded = {o.records: RECORDED_AS.get(o.name, _as_given)(getattr(self, o.name))
                    for o in SERVING_OPTIONS if o.records is not None}
        recorded["gpu_uuids"] = gpu_uuids
        return ServerFlags(**recorded)


def _as_given(value: Any) -> Any:
    return value


def _field_type(option: Option) -> Any:
    kind = {"positive": int, "flag": bool}.get(option.kind, str)
    return kind if option.default is not None else kind | None


#: One field per row of the table, and the serving command's flags fi-autotune did not understand.
ServingOptions = make_dataclass(
    "ServingOptions",
    [(o.name, _field_type(o), field(default=o.default)) for o in SERVING_OPTIONS]
    + [("not_understood", tuple, field(default=(), compare=False))],
    bases=(_Record,), frozen=True)
ServingOptions.__module__ = __name__
ServingOptions.__doc__ = "What the user said about one serving target, typed. ``None``: left to the default."


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
        return option.default
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
