"""Reading a pasted vLLM serving command exactly as vLLM 0.33's own parser reads it.

``fi-autotune plan|warm|check -- vllm serve Qwen/Qwen3-30B-A3B -tp 2 --moe-backend flashinfer_cutlass``
(or ``python -m vllm.entrypoints.openai.api_server --model ...``).

Every flag of ``vllm serve`` is in ``data/vllm-0.33.0-flags.json``, recorded from vLLM's own parser
(``make_arg_parser`` over ``FlexibleArgumentParser``: every spelling it accepts, the hidden
``--no-enable-x`` ones too) with what vLLM's own code did with it (``tests/oracle/record_vllm.py
flags``: the base commands resolved and built again with each flag, and compared on what the
autotune pass reads): ``modelled`` (fi-autotune reads it), ``none`` (nothing the pass reads
changed), ``matters`` (it changed what vLLM tunes: refused, naming the flag), ``reaches`` (it
changed the linear or attention kernels, which fi-autotune's plan does not tune: a warning) and
``unknown`` (vLLM rejected every probe, or the value is JSON no probe covers: a warning). The
environment variables vLLM reads (``vllm.envs``) are in the same table, probed the same way.

The parsing is vLLM's: ``FlexibleArgumentParser.parse_args``'s rewriting (``--model`` moved to the
positional under ``vllm serve``; ``_`` read as ``-`` in flag names; ``-O3``; dotted JSON flags such
as ``--compilation-config.mode 3`` merged), then argparse itself, given the recorded flags - so
abbreviations, value counts, choices and errors are argparse's, with vLLM's own messages.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from autotune_cache.engines.logged_args import flag_words, spelling, wanted
from autotune_cache.errors import UsageError
from autotune_cache.engines.vllm.parser import (API_SERVER, FLAG_TABLE, MODELLED, PROGRAMS, SERVE, Flag, argparser,
                                                flexible_args, environment_table, flag_table, human_readable_int)
from autotune_cache.plan.launcher import PastedCommand

__all__ = ["API_SERVER", "FLAG_TABLE", "MODELLED", "PROGRAMS", "SERVE", "flag_table", "human_readable_int",
           "parse_serving_command", "check_option_values"]

#: The fields of ``--kernel-config`` fi-autotune reads (any other field is refused: it may change a kernel).
KERNEL_CONFIG_FIELDS = ("enable_flashinfer_autotune", "moe_backend")
#: vLLM's environment variables fi-autotune reads itself (where the files go, which ops it skips).
ENV_MODELLED = {"VLLM_CACHE_ROOT", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS",
                "XDG_CACHE_HOME"}


#: What vLLM serves when no model is named (``EngineArgs.model``'s default).
_DEFAULT_MODEL_NOTE = "vLLM would serve its default model"


#: fi-autotune's serving options that a vLLM flag with choices sets: option -> that flag's dest.
CHOICE_OPTIONS = {"moe_runner_backend": "moe_backend", "dtype": "dtype", "quantization": "quantization"}


def check_option_values(options: dict) -> None:
    """fi-autotune's serving options against vLLM's choices: a value vLLM's parser rejects
    (``--moe-runner-backend flashinfer_cutlas``) is a usage error here too."""
    table = flag_table()
    for name, dest in CHOICE_OPTIONS.items():
        flag, value = table.get(dest), options.get(name)
        if flag is None or flag.choices is None or not isinstance(value, str) or value == "auto":
            continue
        if value not in flag.choices:
            raise UsageError(f"--{name.replace('_', '-')} {value!r}: vLLM 0.33's {flag.spelling} takes "
                             f"{', '.join(flag.choices[:16])}{', ...' if len(flag.choices) > 16 else ''}")


def is_secret(name: str) -> bool:
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    return bool({"password", "passwd", "secret", "credential", "credentials", "apikey", "token"} & set(words)) \
        or (len(words) > 1 and words[-1] == "key" and words[-2:-1] != ["cache"])


def _shown(name: str, value: str) -> str:
    return "***" if is_secret(name) else value


@dataclass
class VllmCommand:
    """A serving command as vLLM 0.33 reads it: the modelled values, and every other flag and
    variable sorted by what vLLM's own code showed of it."""

    program: str
    values: dict = field(default_factory=dict)  # dest -> value (modelled flags)
    env: dict = field(default_factory=dict)  # modelled variables
    ignored: list[str] = field(default_factory=list)
    not_understood: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def check_refused(self) -> None:
        if self.refused:
            raise UsageError("serving command: " + self.refused[0]
                             + (f" (and {len(self.refused) - 1} more such flags)" if len(self.refused) > 1 else ""))

    @property
    def layout(self) -> str:
        """vLLM's tree: ``vllm-dir`` under ``$VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``, else ``vllm``."""
        return "vllm-dir" if self.env.get("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR") else "vllm"

    @property
    def autotune_disabled(self) -> str | None:
        """Why vLLM will not tune (``kernel_warmup``: ``kernel_config.enable_flashinfer_autotune``):
        the flag, the kernel config's field, else the optimization level's default (off at -O0)."""
        v = self.values
        flag, kernel = v.get("enable_flashinfer_autotune"), (v.get("kernel_config") or {}).get("enable_flashinfer_autotune")
        if flag is not None and kernel is not None:  # EngineArgs.create_engine_config
            raise UsageError("serving command: vLLM refuses it: enable_flashinfer_autotune and "
                             "kernel_config.enable_flashinfer_autotune are mutually exclusive")
        if flag is not None:
            return None if flag else "--disable-flashinfer-autotune"
        if kernel is not None:
            return None if kernel else "--kernel-config enable_flashinfer_autotune=false"
        level = str(v.get("optimization_level", "2"))
        return "-O0 (vLLM's optimization level 0 turns its FlashInfer autotune off)" if level == "0" else None

    def serving_kwargs(self) -> dict:
        """The modelled values as ``fi-autotune plan --layout vllm`` options (click keyword names)."""
        v = self.values
        out: dict = {}
        model = v.get("model_tag") if self.program == SERVE and v.get("model_tag") is not None else v.get("model")
        if model is None:
            raise UsageError(f"serving command: no model: {_DEFAULT_MODEL_NOTE} (Qwen/Qwen3-0.6B); name it "
                             + ("(vllm serve MODEL)" if self.program == SERVE else "(--model MODEL)"))
        out["model_path"] = model
        for dest, name in (("revision", "revision"), ("tensor_parallel_size", "tp"), ("pipeline_parallel_size", "pp"),
                           ("data_parallel_size", "dp"), ("dtype", "dtype"), ("quantization", "quantization"),
                           ("moe_backend", "moe_runner_backend"),
                           ("max_num_batched_tokens", "max_num_batched_tokens")):
            if v.get(dest) is not None:
                out[name] = v[dest]
        overrides = v.get("hf_overrides")
        if overrides:  # ModelConfig: a JSON object; a name (a registered function) is not modelled
            if not isinstance(overrides, dict):
                raise UsageError(f"serving command: --hf-overrides {str(overrides)[:60]}: a function name, which "
                                 "fi-autotune cannot apply; give the JSON object it sets")
            out["json_model_override_args"] = json.dumps(overrides, sort_keys=True)
        kernel = v.get("kernel_config") or {}
        if kernel.get("moe_backend") not in (None, "auto") and v.get("moe_backend") in (None, "auto"):
            out["moe_runner_backend"] = kernel["moe_backend"]  # --moe-backend, when not auto, wins (arg_utils)
        disabled = self.autotune_disabled
        if disabled:
            out["autotune_disabled_by"] = disabled
        if v.get("enable_expert_parallel"):
            # FusedMoEParallelConfig.make: the experts are split whole over every rank of tp x dp
            out["ep"] = v.get("tensor_parallel_size", 1) * v.get("data_parallel_size", 1)
        skip = self.env.get("VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS")
        if skip is not None:  # vllm.envs: comma-separated, blanks dropped; empty: skip nothing
            out["skip_ops"] = tuple(s.strip() for s in skip.split(",") if s.strip())
        if self.env.get("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"):
            out["cache_dir"] = os.path.expanduser(self.env["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"])
        elif "VLLM_CACHE_ROOT" in self.env:
            out["cache_dir"] = os.path.expanduser(self.env["VLLM_CACHE_ROOT"])
        elif "XDG_CACHE_HOME" in self.env:
            out["cache_dir"] = os.path.expanduser(os.path.join(self.env["XDG_CACHE_HOME"], "vllm"))
        return out


def _values_text(flag: Flag, spelled: str | None, values) -> str:
    if spelled is None:
        return str(values)
    if flag.takes == 0:
        return spelled
    items = values if isinstance(values, list) else [values]
    shown = [_shown(flag.dest, json.dumps(x) if isinstance(x, (dict, list)) else str(x)) for x in items]
    return " ".join([spelled, *shown])


def read_environment(cmd: VllmCommand, env: dict[str, str]) -> None:
    table = environment_table()
    for name, value in env.items():
        text = f"{name}={_shown(name, value)}"
        entry = table.get(name)
        if name in ENV_MODELLED:
            cmd.env[name] = value
        elif entry is None:
            if name.startswith(("VLLM_", "FLASHINFER_")):
                cmd.not_understood.append(f"{text} (environment: not among the variables vLLM 0.33 declares in "
                                          "vllm.envs; fi-autotune has no evidence on what it does)")
            else:
                cmd.ignored.append(f"{text} (environment vLLM 0.33 does not declare in vllm.envs)")
        elif entry["effect"] == "none":
            cmd.ignored.append(text)
        elif entry["effect"] == "matters":
            cmd.refused.append(f"{text} changes what vLLM 0.33 autotunes and fi-autotune does not model it "
                               f"(oracle: {entry['evidence'].split(';')[0]})")
        else:
            cmd.not_understood.append(f"{text} (environment: {_WHY.get(entry['effect'], _WHY['unknown'])})")


_WHY = {"reaches": "it changes vLLM's linear or attention kernels, which fi-autotune's plan does not tune",
        "unknown": "vLLM rejected every probe of it or no probe covers it, so its effect is not known",
        "not probed": "not probed: its effect is not known"}


def _check_modelled(flag: Flag, text: str, value, out: VllmCommand) -> None:
    """The modelled flags whose values vLLM validates after parsing (pydantic), as it refuses them."""
    if flag.dest == "optimization_level" and str(value) not in ("0", "1", "2", "3"):
        raise UsageError(f"serving command: {text}: vLLM 0.33's optimization levels are 0, 1, 2 and 3")
    if flag.dest == "kernel_config":
        if not isinstance(value, dict):
            raise UsageError(f"serving command: {text}: vLLM takes a JSON object")
        other = sorted(set(value) - set(KERNEL_CONFIG_FIELDS))
        if other:
            out.refused.append(f"{text}: its {', '.join(other)} may change what vLLM 0.33 autotunes and fi-autotune "
                               f"reads only {' and '.join(KERNEL_CONFIG_FIELDS)} of it")


def parse_serving_command(cmd: PastedCommand) -> VllmCommand:
    """``cmd`` (a ``vllm serve`` or api_server command) as vLLM 0.33 parses it."""
    if cmd.program is not None and cmd.program not in PROGRAMS:
        raise UsageError(f"serving command: {cmd.program!r} is not a vLLM launcher ({' or '.join(PROGRAMS)})")
    program = cmd.program or SERVE  # flags alone (with --layout vllm): read as vllm serve's
    out = VllmCommand(program)
    read_environment(out, cmd.env)
    args = flexible_args(list(cmd.args), program)
    ns = argparser(program).parse_args(args)
    for flag, spelled, value in getattr(ns, "_given", []):
        text = _values_text(flag, spelled, value)
        if flag.dest == "model_tag" and program == API_SERVER:
            out.refused.append(f"a positional model ({value}): python -m vllm.entrypoints.openai.api_server parses it "
                               "and serves --model (default Qwen/Qwen3-0.6B) instead; write --model")
        elif flag.effect == "modelled":
            out.values[flag.dest] = value
            _check_modelled(flag, text, value, out)
        elif flag.effect == "none":
            out.ignored.append(text)
        elif flag.effect == "matters":
            out.refused.append(f"{text} changes what vLLM 0.33 autotunes and fi-autotune does not model it "
                               f"(oracle: {flag.evidence.split(';')[0]})")
        else:
            out.not_understood.append(f"{text} ({_WHY.get(flag.effect, _WHY['unknown'])})")
    return out


def command_from_logged_args(args: dict | None) -> list[str] | None:
    """``vllm serve MODEL --tensor-parallel-size 4 ...`` from vLLM's ``non-default args``."""
    model = (args or {}).get("model_tag") or (args or {}).get("model")
    if not isinstance(model, str):
        return None
    table = flag_table()
    words = ["vllm", "serve", model]
    for dest in MODELLED:
        value, flag = args.get(dest), table.get(dest)
        if flag is None or not wanted(dest, value) or isinstance(value, dict):
            continue
        if flag.takes == 0 and value is not True:
            continue
        words += flag_words(spelling(tuple(o for o in flag.options if o.startswith("--")) or flag.options, dest),
                             value)
    return words
