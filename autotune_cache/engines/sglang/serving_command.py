"""Reading a pasted SGLang serving command exactly as SGLang 0.5.23's argument parser reads it.

``fi-autotune plan|warm|check -- python -m sglang.launch_server --model-path ... --tp 8 ...``

Every flag SGLang 0.5.23 accepts is in ``data/sglang-0.5.23-flags.json``, recorded from SGLang's
own parser (``ServerArgs.add_cli_args``) with what the oracle (tests/oracle) found each one does
to the autotune path: ``modelled`` (fi-autotune reads it), ``none`` (resolved with and without it
on every base command, nothing the autotune path reads changed), ``matters`` (it changed what
SGLang tunes, and fi-autotune does not model it: refused, naming the flag), ``reaches`` (it
changed a resolved argument the autotune path reads, though not the outcome on the bases tried)
and ``unknown`` (SGLang rejected every probe). The last two are "not understood": a warning in
``plan`` and ``warm``, a miss under ``check --strict``; never "ignored".

Parsing follows argparse (which SGLang uses): exact spellings first, then a unique prefix
(``--tp`` is ``--tp-size``); an ambiguous prefix (``--pp``, ``--cuda-graph-max-bs``), an unknown
flag or a missing value is an error, as SGLang's parser would make it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from autotune_cache.engines.logged_args import flag_words, spelling, wanted
from autotune_cache.errors import UsageError
from autotune_cache.plan.launcher import split_command
from autotune_cache.plan.options import SERVING_OPTIONS

FLAG_TABLE = Path(__file__).resolve().parent / "data" / "sglang-0.5.23-flags.json"

#: SGLang flags fi-autotune reads (by argparse dest) -> the ``plan``/``warm`` option they set: the
#: ``reads`` column of the serving options' table.
MODELLED: dict[str, str] = {dest: o.name for o in SERVING_OPTIONS for dest in o.reads}

#: Abbreviations older SGLang releases (and many published recipes) accept that 0.5.23 finds
#: ambiguous, and the spelling they meant.
RENAMED = {"--pp": "--pp-size", "--quant": "--quantization", "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode",
           "--cuda-graph-bs": "--cuda-graph-bs-decode"}

#: Environment assignments before the command that fi-autotune models.
ENV_FLAGS = {"SGLANG_FLASHINFER_AUTOTUNE_EXTEND", "SGLANG_CACHE_DIR", "SGLANG_FLASHINFER_AUTOTUNE_CACHE",
             "SGLANG_FLASHINFER_MOE_FUSED_FINALIZE"}

_TRUE = ("1", "true", "yes", "y", "on")
#: Environment variables SGLang's and FlashInfer's code read (environ.py registries); any other
#: variable of the command (CUDA_VISIBLE_DEVICES, NCCL_*, HF_*) is outside their autotune path.
ENV_PREFIXES = ("SGLANG_", "SGL_", "FLASHINFER_")
#: Words that make a name a credential's wherever they stand (``--ssl-keyfile-password``,
#: ``AWS_SECRET_ACCESS_KEY``), and last words that do when the name takes one value (``--api-key``,
#: ``--admin-api-key``, ``HF_TOKEN``): ``--max-prefill-tokens``, ``--ssl-keyfile``,
#: ``--speculative-token-map``, ``--kt-max-deferred-experts-per-token`` and
#: ``--bucket-time-to-first-token`` (a list) are not secrets.
_SECRET_WORDS = {"password", "passwd", "secret", "credential", "credentials", "apikey"}
_SECRET_LAST = {"key", "token"}


def is_secret(name: str, *, single: bool = True) -> bool:
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    if _SECRET_WORDS & set(words):
        return True
    # "..._per_token" is a rate (--kt-max-deferred-experts-per-token), not a token
    return single and bool(words) and words[-1] in _SECRET_LAST and words[-2:-1] != ["per"]


def _shown(name: str, value: str, *, single: bool = True) -> str:
    """A value as messages show it: never a credential's (``--api-key``, ``HF_TOKEN``); every other
    flag's as given (``--max-prefill-tokens 16384``)."""
    return "***" if is_secret(name, single=single) else value


@dataclass(frozen=True)
class Flag:
    dest: str
    options: tuple[str, ...]
    takes: object  # 0, 1, "+", "*", "?"
    choices: tuple[str, ...] | None
    effect: str  # modelled | none | matters | reaches | unknown
    evidence: str

    @property
    def spelling(self) -> str:
        return max(self.options, key=len)


@lru_cache(maxsize=1)
def flag_table() -> dict[str, Flag]:
    """Every SGLang 0.5.23 flag by option string (``--tp-size`` and ``--tensor-parallel-size`` both)."""
    data = json.loads(FLAG_TABLE.read_text())["flags"]
    by_option: dict[str, Flag] = {}
    for dest, f in data.items():
        effect = "modelled" if dest in MODELLED else f["effect"]
        flag = Flag(dest, tuple(f["options"]), f["takes"], tuple(f["choices"]) if f["choices"] else None, effect,
                    f["evidence"])
        for opt in flag.options:
            by_option[opt] = flag
    return by_option


def check_option_values(options: dict) -> None:
    """fi-autotune's own serving options (click names -> values) against SGLang's choices: a value
    SGLang's parser would reject (a typo such as ``--attention-backend flashinfr``) is a usage
    error here too, not a plan for a server that cannot start."""
    by_dest = {f.dest: f for f in flag_table().values()}
    for dest, name in MODELLED.items():
        flag, value = by_dest.get(dest), options.get(name)
        if flag is None or flag.choices is None or not isinstance(value, str) or value in ("auto", "none", "null"):
            continue
        if value not in flag.choices:
            raise UsageError(f"--{name.replace('_', '-')} {value!r}: SGLang 0.5.23 takes "
                             f"{', '.join(flag.choices[:14])}{', ...' if len(flag.choices) > 14 else ''}")


@dataclass
class ServingCommand:
    """A serving command as SGLang would parse it: the modelled values, and every other flag sorted
    by what the oracle knows of it."""

    values: dict = field(default_factory=dict)  # argparse dest -> value, modelled flags only
    env: dict = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)  # proven not to reach the autotune path
    not_understood: list[str] = field(default_factory=list)  # "flag: why"
    refused: list[str] = field(default_factory=list)  # "flag: why" (they matter; not modelled)
    notes: list[str] = field(default_factory=list)

    @property
    def autotune_disabled(self) -> str | None:
        if self.values.get("disable_flashinfer_autotune"):
            return "--disable-flashinfer-autotune"
        if self.values.get("enable_deterministic_inference"):
            return "--enable-deterministic-inference"
        if str(self.env.get("SGLANG_FLASHINFER_AUTOTUNE_CACHE", "1")).lower() in ("0", "false", "no", "n", "off"):
            return "SGLANG_FLASHINFER_AUTOTUNE_CACHE=0 (SGLang tunes but neither reads nor writes the cache)"
        return None

    def check_refused(self) -> None:
        """A flag that changes what SGLang tunes and that fi-autotune cannot model: one line."""
        if self.refused:
            raise UsageError("serving command: " + self.refused[0]
                             + (f" (and {len(self.refused) - 1} more such flags)" if len(self.refused) > 1 else ""))

    def serving_kwargs(self) -> dict:
        """The modelled values as ``fi-autotune plan`` options (the click keyword names)."""
        v = self.values
        out: dict = {}
        for dest, value in v.items():
            name = MODELLED[dest]
            if name in ("dp", "no_dp_attention", "autotune_disabled_by"):
                continue
            if name == "skip_ops":
                value = tuple(value)  # SGLang keeps each token whole (nargs="+", no comma splitting)
            out[name] = value
        if "attn_dp_size" in v or "dp_size" in v:
            # parallel_hook.py: --dp-size N counts replicas; the deprecated --enable-dp-attention
            # turns it into --attn-dp-size N when --attn-dp-size is left at 1; both above 1 is refused.
            attn, dp = v.get("attn_dp_size", 1), v.get("dp_size", 1)
            if v.get("enable_dp_attention", False) and attn == 1:
                attn, dp = dp, 1
            if attn > 1 and dp > 1:
                raise UsageError(f"--dp-size {dp} with --attn-dp-size {attn}: SGLang 0.5.23 refuses data-parallel "
                                 "replicas combined with attention data parallelism")
            out["dp"], out["no_dp_attention"] = (attn, False) if attn > 1 else (dp, True)
        if self.autotune_disabled:
            out["autotune_disabled_by"] = self.autotune_disabled
        if str(self.env.get("SGLANG_FLASHINFER_AUTOTUNE_EXTEND", "")).lower() in _TRUE:
            out["autotune_extend"] = True
        if str(self.env.get("SGLANG_FLASHINFER_MOE_FUSED_FINALIZE", "")).lower() in _TRUE:
            out["moe_fused_finalize"] = True
        if "SGLANG_CACHE_DIR" in self.env:
            out["cache_dir"] = self.env["SGLANG_CACHE_DIR"]
        return out


def _match(token: str) -> tuple[Flag | None, str, str | None]:
    """argparse's _parse_optional: (flag, the spelling as typed, an inline ``=value``)."""
    table = flag_table()
    name, eq, inline = token.partition("=")
    if token in table:
        return table[token], token, None
    if eq and name in table:
        return table[name], name, inline
    prefix = name if eq else token
    spellings = sorted(o for o in table if o.startswith(prefix))
    if len(spellings) > 1:  # argparse: more than one option string starts with it
        hint = f"; write {RENAMED[prefix]}" if prefix in RENAMED else ""
        raise UsageError(f"serving command: SGLang 0.5.23 rejects {prefix} as ambiguous (it could be "
                         f"{', '.join(spellings[:4])}{', ...' if len(spellings) > 4 else ''}){hint}")
    if spellings:
        return table[spellings[0]], prefix, inline if eq else None
    return None, prefix, inline if eq else None


def _convert(flag: Flag, spelled: str, raw: str):
    """The value as SGLang's parser types it; an invalid one is SGLang's usage error."""
    if flag.choices is not None and raw not in flag.choices:
        raise UsageError(f"serving command: {spelled} {raw!r} is not one of SGLang's choices "
                         f"({', '.join(flag.choices[:12])}{', ...' if len(flag.choices) > 12 else ''})")
    kind = _TYPES.get(flag.dest)
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise UsageError(f"serving command: {spelled} takes an integer, got {raw!r}") from None
    if kind == "human_int":
        return _human_int(spelled, raw)
    return raw


def _human_int(spelled: str, raw: str) -> int:
    """sglang/srt/utils/common.py human_readable_int: 32768, 32k, 1M, 32Ki."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?", raw.strip())
    if not m or (m[2] and m[2].endswith("i") and "." in m[1]) or (not m[2] and "." in m[1]):
        raise UsageError(f"serving command: {spelled} takes an integer such as 32768, 32k or 32Ki, got {raw!r}")
    mult = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    from decimal import Decimal

    return int(Decimal(m[1]) * mult.get(m[2] or "", 1))


#: Value types of the modelled flags (the rest are kept as the strings SGLang was given).
_TYPES = {"tp_size": int, "pp_size": int, "dp_size": int, "attn_dp_size": int, "ep_size": int,
          "max_running_requests": int, "cuda_graph_max_bs_decode": int, "chunked_prefill_size": int,
          "page_size": int, "context_length": "human_int", "speculative_num_steps": int,
          "speculative_eagle_topk": int, "speculative_num_draft_tokens": int}


def _is_value(token: str) -> bool:
    """argparse treats a token as a value unless it looks like an option (``-x``, not ``-1``)."""
    return not token.startswith("-") or bool(re.fullmatch(r"-\d+(\.\d+)?", token))


#: The programs that start an SGLang 0.5.23 server (``plan.launcher`` normalizes what is typed).
LAUNCH_SERVER = "python -m sglang.launch_server"
SGLANG_SERVE = "sglang serve"
PROGRAMS = (LAUNCH_SERVER, SGLANG_SERVE)


def _sglang_serve(args: list[str]) -> list[str]:
    """``sglang serve``'s own rewriting (sglang/cli/serve.py): ``--model-type`` picks the backend
    and is removed; a first argument that is not a flag is the model path."""
    out, backend, i = [], "auto", 0
    while i < len(args):
        if args[i] == "--model-type":
            if i + 1 >= len(args):
                raise UsageError("serving command: sglang serve: Error: --model-type requires a value.")
            backend, i = args[i + 1], i + 2
            continue
        if args[i].startswith("--model-type="):
            backend = args[i].split("=", 1)[1]
        else:
            out.append(args[i])
        i += 1
    if backend not in ("auto", "llm"):
        raise UsageError(f"serving command: sglang serve --model-type {backend}: not SGLang's language-model server "
                         "(fi-autotune plans for --model-type llm, or auto on a language model)")
    if out and not out[0].startswith("-"):
        out = ["--model-path", *out]
    return out


def parse_serving_command(argv: list[str] | tuple[str, ...]) -> ServingCommand:
    """Parse a serving command given as arguments (or one shell-quoted string): ``python -m
    sglang.launch_server ...``, ``sglang serve [MODEL] ...``, or its flags alone."""
    pasted = split_command(argv)
    env, args = pasted.env, list(pasted.args)
    if pasted.program is not None and pasted.program not in PROGRAMS:
        raise UsageError(f"serving command: {' '.join(pasted.launcher)!r} is not an SGLang launcher "
                         f"({' or '.join(PROGRAMS)})")
    if pasted.program == SGLANG_SERVE:
        args = _sglang_serve(args)
    cmd = ServingCommand()
    for name, value in env.items():
        if name in ENV_FLAGS:
            cmd.env[name] = value
        elif name.startswith(ENV_PREFIXES):
            cmd.not_understood.append(f"{name}={_shown(name, value)} (environment: fi-autotune has no evidence on "
                                      "what it does)")
        else:
            cmd.ignored.append(f"{name}={_shown(name, value)} (environment outside SGLang's and FlashInfer's own "
                               "variables: their autotune path reads only " + ", ".join(p + "*" for p in ENV_PREFIXES)
                               + ")")
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if _is_value(token):
            raise UsageError(f"serving command: SGLang 0.5.23 takes no argument {token!r} here "
                             "(is a flag before it missing its '--'?)")
        flag, spelled, inline = _match(token)
        if flag is None:
            raise UsageError(f"serving command: SGLang 0.5.23 has no flag {spelled}")
        values: list[str] = []
        if flag.takes == 0:
            if inline is not None:
                raise UsageError(f"serving command: {spelled} takes no value (got {spelled}={inline})")
        elif inline is not None:
            values = [inline]
            if flag.takes in ("+", "*"):
                while i < len(args) and _is_value(args[i]):
                    values.append(args[i])
                    i += 1
        else:
            limit = {1: 1, "?": 1}.get(flag.takes, len(args))
            while i < len(args) and _is_value(args[i]) and len(values) < limit:
                values.append(args[i])
                i += 1
            if not values and flag.takes in (1, "+"):
                raise UsageError(f"serving command: {spelled} needs a value")
        text = " ".join([spelled, *(_shown(flag.dest, v, single=flag.takes in (1, "?")) for v in values)]) if values else spelled
        if flag.effect == "modelled":
            if flag.takes == 0:
                cmd.values[flag.dest] = True
            elif flag.takes in ("+", "*"):
                cmd.values[flag.dest] = [_convert(flag, spelled, v) for v in values]
            else:
                cmd.values[flag.dest] = _convert(flag, spelled, values[0]) if values else None
        elif flag.effect == "none":
            cmd.ignored.append(text)
        elif flag.effect == "matters":
            cmd.refused.append(f"{text} changes what SGLang 0.5.23 autotunes and fi-autotune does not model it "
                               f"(oracle: {flag.evidence.split(';')[0]})")
        else:
            why = ("it changes a resolved argument SGLang's autotune path reads" if flag.effect == "reaches"
                   else "SGLang rejected every probe of it, so its effect is not known")
            cmd.not_understood.append(f"{text} ({why})")
    if "model_path" not in cmd.values:
        raise UsageError("serving command: no --model-path")
    return cmd


def command_from_logged_args(args: dict | None) -> list[str] | None:
    """``python -m sglang.launch_server --model-path ... --tp-size 4 ...`` from ``server_args``."""
    if not args or not isinstance(args.get("model_path"), str):
        return None
    by_dest = {f.dest: f for f in flag_table().values()}
    words = [*LAUNCH_SERVER.split(), "--model-path", args["model_path"]]
    for dest in MODELLED:
        value = args.get(dest)
        if dest == "model_path" or dest not in by_dest or not wanted(dest, value):
            continue
        if by_dest[dest].takes == 0 and value is not True:
            continue
        words += flag_words(spelling(by_dest[dest].options, dest), value)
    return words
