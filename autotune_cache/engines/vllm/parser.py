"""vLLM 0.33's ``vllm serve`` flags as its own parser has them, and that parser rebuilt from them.

``data/vllm-0.33.0-flags.json`` holds every flag of ``make_arg_parser`` over
``FlexibleArgumentParser`` (every spelling it accepts, the hidden ``--no-enable-x`` ones too, value
counts, choices, value types, defaults), recorded from vLLM's own parser, with what vLLM's own code
did with each (``tests/oracle/record_vllm.py flags``; ``serving_command`` reads the effects). Here:
``FlexibleArgumentParser.parse_args``'s rewriting (``--model`` moved to the positional under ``vllm
serve``; ``_`` read as ``-`` in flag names; ``-O3``; dotted JSON flags such as
``--compilation-config.mode 3`` merged), then argparse itself given the recorded flags - so
abbreviations, value counts, choices and errors are argparse's, with vLLM's own messages.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from autotune_cache.errors import UsageError

FLAG_TABLE = Path(__file__).resolve().parent / "data" / "vllm-0.33.0-flags.json"

#: vLLM flags fi-autotune reads (argparse dest) -> the ``plan``/``warm`` option they set.
MODELLED: dict[str, str] = {
    "model_tag": "model_path", "model": "model_path", "revision": "revision",
    "tensor_parallel_size": "tp", "pipeline_parallel_size": "pp", "data_parallel_size": "dp",
    "enable_expert_parallel": "ep", "dtype": "dtype", "quantization": "quantization",
    "moe_backend": "moe_runner_backend", "max_num_batched_tokens": "max_num_batched_tokens",
    "enable_flashinfer_autotune": "autotune_disabled_by", "optimization_level": "autotune_disabled_by",
    "kernel_config": "autotune_disabled_by", "hf_overrides": "json_model_override_args",
}


#: The programs vLLM's server starts from, as ``plan.launcher`` normalizes them.
SERVE = "vllm serve"
API_SERVER = "python -m vllm.entrypoints.openai.api_server"
PROGRAMS = (SERVE, API_SERVER)


@dataclass(frozen=True)
class Flag:
    dest: str
    options: tuple[str, ...]  # every spelling vLLM's parser accepts
    negative: tuple[str, ...]  # the spellings that set a boolean False
    takes: object  # 0, 1, "?", "+", "*"
    choices: tuple[str, ...] | None
    kind: str | None  # the value type vLLM converts with (int, float, human_readable_int, loads, ...)
    default: object
    effect: str  # modelled | none | matters | reaches | unknown
    evidence: str
    positional: bool = False

    @property
    def spelling(self) -> str:
        longs = [o for o in self.options if o.startswith("--") and o not in self.negative]
        return max(longs or self.options, key=len)


@lru_cache(maxsize=1)
def _table() -> dict:
    return json.loads(FLAG_TABLE.read_text())


@lru_cache(maxsize=1)
def flag_table() -> dict[str, Flag]:
    """Every ``vllm serve`` flag of vLLM 0.33, by argparse dest."""
    out = {}
    for dest, f in _table()["flags"].items():
        effect = "modelled" if dest in MODELLED else f["effect"]
        out[dest] = Flag(dest, tuple(f.get("accepted") or f["options"]), tuple(f.get("negative") or ()), f["takes"],
                         tuple(f["choices"]) if f["choices"] is not None else None, f.get("type"), f.get("default"),
                         effect, f["evidence"], bool(f.get("positional")))
    return out


def environment_table() -> dict[str, dict]:
    return _table().get("environment", {})


# --- vLLM's value types -------------------------------------------------------------------------------

def human_readable_int(value: str) -> int:
    """``vllm/utils/argparse_utils.py human_readable_int``: 8192, 8k (x1000), 8K (x1024), 2.5k."""
    value = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}[suffix])
        if "." in number:
            raise argparse.ArgumentTypeError(f"Decimals are not allowed with binary suffixes like {suffix}. Did you "
                                             f"mean to use {number}{suffix.lower()} instead?")
        return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
    return int(value)


def _json_value(value: str):
    return json.loads(value)


def _optional(inner):
    def convert(value: str):
        return None if value in ("", "None") else inner(value)

    convert.__name__ = getattr(inner, "__name__", "value")
    return convert


def _union_dict_and_str(value: str):
    return _json_value(value) if re.match(r"(?s)^\s*{.*}\s*$", value) else value


_json_value.__name__ = "loads"
_CONVERTERS = {"int": int, "float": float, "str": str, "human_readable_int": human_readable_int,
               "loads": _json_value, "parse_dataclass": _json_value, "union_dict_and_str": _union_dict_and_str}


def _converter(kind: str | None):
    """argparse's ``type=`` as vLLM's parser has it, for what can be checked without vLLM (JSON
    syntax for its dataclass flags, not their fields): errors read as argparse writes them."""
    if kind is None:
        return None
    inner = kind.removeprefix("optional:")
    conv = _CONVERTERS.get(inner)
    if conv is None:
        return None
    return _optional(conv) if kind.startswith("optional:") else conv


# --- FlexibleArgumentParser's rewriting ---------------------------------------------------------------

def flexible_args(args: list[str], program: str) -> list[str]:
    """``FlexibleArgumentParser.parse_args`` before argparse: ``--model`` to the positional (``vllm
    serve``), ``_`` as ``-`` in flag names, ``-O3``, and dotted JSON flags merged into one value."""
    if program == SERVE:
        at = next((i for i, a in enumerate(args) if re.match(r"^--model(=.+|$)", a)), None)
        if at is not None:
            if args[at] == "--model":
                if at + 1 >= len(args):
                    raise UsageError("serving command: vllm serve: error: argument --model: expected one argument")
                tag, rest = args[at + 1], at + 2
            else:
                tag, rest = args[at].removeprefix("--model="), at + 1
            args = [tag, *args[:at], *args[rest:]]
        if (args and args[0].startswith("-") and not any(re.match(r"^--config(=.+|$)", a) for a in args)
                and any(re.match(r"^--served[-_]model[-_]name(=.+|$)", a) for a in args)):
            raise UsageError("serving command: vLLM refuses it: `model` should be provided as the first positional "
                             "argument when using `vllm serve`. i.e. `vllm serve <model> --<arg> <value>`.")
    if any(re.match(r"^--config(=.+|$)", a) for a in args):
        raise UsageError("serving command: --config: vLLM reads its flags from that YAML file, which fi-autotune does "
                         "not read; give them on the command line")
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            key, eq, value = a.partition("=")
            head, dot, tail = key[2:].partition(".")
            out.append("--" + head.replace("_", "-") + dot + tail + eq + value)
        elif a.startswith("-O") and a != "-O":
            out += ["--optimization-level", a[3:] if a[2:3] == "=" else a[2:]]
        elif a == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            out.append("--optimization-level")
        else:
            out.append(a)
        i += 1
    merged: dict[str, dict] = {}
    kept: list[str] = []
    i = 0
    while i < len(out):
        a = out[i]
        if a.startswith("-") and "." in a.partition("=")[0]:
            key, eq, value = a.partition("=")
            if not eq:
                if i + 1 >= len(out):
                    raise UsageError(f"serving command: {key} needs a value")
                value = out[i + 1]
                i += 1
            if key.endswith("+"):
                key, value = key[:-1], json.dumps(value.split(","))
            name, *path = key.split(".")
            try:
                parsed = json.loads(value)
            except ValueError:
                try:
                    parsed = human_readable_int(value)
                except (ValueError, argparse.ArgumentTypeError):
                    parsed = value
            node = merged.setdefault(name, {})
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = parsed
        else:
            kept.append(a)
        i += 1
    for name, value in merged.items():
        kept += [name, json.dumps(value)]
    return kept


# --- argparse, given vLLM's flags ---------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own message, as vLLM prints it
        raise UsageError(f"serving command: {self.prog}: error: {message}")


class _Given(argparse.Action):
    """Stores what was given, as typed, with the spelling used (for messages)."""

    def __call__(self, parser, namespace, values, option_string=None):
        flag: Flag = self.const
        if flag.takes == 0:
            values = option_string not in flag.negative
        given = getattr(namespace, "_given", [])
        given.append((flag, option_string, values))
        namespace._given = given


@lru_cache(maxsize=2)
def argparser(program: str) -> _Parser:
    parser = _Parser(prog=program, add_help=False, allow_abbrev=True, argument_default=argparse.SUPPRESS)
    for flag in flag_table().values():
        if flag.positional:
            parser.add_argument(flag.dest, nargs="?", action=_Given, const=flag)
            continue
        kw: dict = {"dest": flag.dest, "action": _Given, "const": flag}
        if flag.takes == 0:
            kw["nargs"] = 0
        else:
            kw["nargs"] = None if flag.takes == 1 else flag.takes
            kw["type"] = _converter(flag.kind)
            if flag.choices is not None:
                kw["choices"] = flag.choices if kw["type"] in (None, str) else None
        parser.add_argument(*flag.options, **kw)
    parser.add_argument("-h", "--help", nargs=0, action=_Help)
    return parser


class _Help(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        raise UsageError(f"serving command: {option_string} prints vLLM's help and exits: not a server to plan for")


# --- the reading ---------------------------------------------------------------------------------------

