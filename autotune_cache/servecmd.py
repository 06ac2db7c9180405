"""Reading a pasted SGLang serving command: the flags that shape the cache key and the plan.

``fi-autotune plan|warm|check -- python -m sglang.launch_server --model-path ... --tp 8 ...``

Spellings are SGLang 0.5.23's (``sglang/srt/arg_groups/fields/*.py``, ``ServerArgs.add_cli_args``),
including its aliases (``--tensor-parallel-size``, ``--ep``) and the abbreviations its argparse
accepts because they are unique prefixes (``--tp``, ``--dp``, ``--attn-dp``). Abbreviations
that SGLang itself rejects as ambiguous (``--pp``, ``--quant``, and ``--cuda-graph-max-bs`` /
``--cuda-graph-bs`` since 0.5.20) are rejected here too, with the spelling to use. Every other
flag is ignored and reported, so nothing is dropped silently.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

from .errors import UsageError

#: dest, whether it takes a value ("+" for one or more), and every spelling SGLang accepts.
FLAGS: dict[str, tuple[str, object, tuple[str, ...]]] = {
    "model_path": ("model_path", 1, ("--model-path", "--model")),
    "revision": ("revision", 1, ("--revision",)),
    "tp": ("tp", 1, ("--tp-size", "--tensor-parallel-size", "--tp")),
    "pp": ("pp", 1, ("--pp-size", "--pipeline-parallel-size")),
    "dp": ("dp", 1, ("--dp-size", "--data-parallel-size", "--dp")),
    "attn_dp": ("attn_dp", 1, ("--attn-dp-size", "--attention-data-parallel-size", "--attn-dp")),
    "enable_dp_attention": ("enable_dp_attention", 0, ("--enable-dp-attention",)),
    "ep": ("ep", 1, ("--ep-size", "--expert-parallel-size", "--ep")),
    "dtype": ("dtype", 1, ("--dtype",)),
    "quantization": ("quantization", 1, ("--quantization",)),
    "moe_runner_backend": ("moe_runner_backend", 1, ("--moe-runner-backend",)),
    "moe_a2a_backend": ("moe_a2a_backend", 1, ("--moe-a2a-backend",)),
    "skip_ops": ("skip_ops", "+", ("--flashinfer-autotune-skip-ops",)),
    "max_running_requests": ("max_running_requests", 1, ("--max-running-requests",)),
    "cuda_graph_max_bs": ("cuda_graph_max_bs", 1, ("--cuda-graph-max-bs-decode",)),
    "chunked_prefill_size": ("chunked_prefill_size", 1, ("--chunked-prefill-size",)),
    "disable_autotune": ("disable_autotune", 0, ("--disable-flashinfer-autotune",)),
    "deterministic": ("deterministic", 0, ("--enable-deterministic-inference",)),
}

#: What SGLang (0.5.20+) rejects as ambiguous, and what to write instead.
AMBIGUOUS = {
    "--pp": "--pp-size",
    "--quant": "--quantization",
    "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode",
    "--cuda-graph-bs": "--cuda-graph-bs-decode",
}

#: Environment assignments before the command that change the key or the plan.
ENV_FLAGS = {"SGLANG_FLASHINFER_AUTOTUNE_EXTEND", "SGLANG_CACHE_DIR", "SGLANG_FLASHINFER_AUTOTUNE_CACHE"}

@dataclass
class ServingCommand:
    """The part of a serving command fi-autotune uses, and what it ignored."""

    values: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def autotune_disabled(self) -> str | None:
        if self.values.get("disable_autotune"):
            return "--disable-flashinfer-autotune"
        if self.values.get("deterministic"):
            return "--enable-deterministic-inference"
        if str(self.env.get("SGLANG_FLASHINFER_AUTOTUNE_CACHE", "1")).lower() in ("0", "false", "no", "n", "off"):
            return "SGLANG_FLASHINFER_AUTOTUNE_CACHE=0 (SGLang tunes but neither reads nor writes the cache)"
        return None

    def serving_kwargs(self) -> dict:
        """The values as ``fi-autotune plan`` options (the click keyword names)."""
        v = self.values
        out: dict = {}
        if "model_path" in v:
            out["model_path"] = v["model_path"]
        for name in ("revision", "dtype", "quantization", "moe_runner_backend", "max_running_requests",
                     "cuda_graph_max_bs", "chunked_prefill_size"):
            if name in v:
                out[name] = v[name]
        for name in ("tp", "pp", "ep"):
            if name in v:
                out[name] = v[name]
        if "attn_dp" in v:
            out["dp"], out["no_dp_attention"] = v["attn_dp"], False
        elif "dp" in v:
            # --dp-size N: N replicas, unless --enable-dp-attention (deprecated) makes it attention DP.
            out["dp"], out["no_dp_attention"] = v["dp"], not v.get("enable_dp_attention", False)
        if "skip_ops" in v:
            # SGLang keeps each token whole (nargs="+", no comma splitting): a tuple says so.
            out["skip_ops"] = tuple(v["skip_ops"])
        if self.autotune_disabled:
            out["autotune_disabled_by"] = self.autotune_disabled
        if str(self.env.get("SGLANG_FLASHINFER_AUTOTUNE_EXTEND", "")).lower() in ("1", "true", "yes", "y", "on"):
            out["autotune_extend"] = True
        if "SGLANG_CACHE_DIR" in self.env:
            out["cache_dir"] = self.env["SGLANG_CACHE_DIR"]
        return out


def _int(flag: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"serving command: {flag} takes an integer, got {value!r}") from None


_SPELLINGS = {s: name for name, (_, _, spellings) in FLAGS.items() for s in spellings}
_INTS = {"tp", "pp", "dp", "attn_dp", "ep", "max_running_requests", "cuda_graph_max_bs", "chunked_prefill_size"}


def parse_serving_command(argv: list[str] | tuple[str, ...]) -> ServingCommand:
    """Parse a serving command given as arguments (or one shell-quoted string)."""
    args = list(argv)
    if len(args) == 1 and " " in args[0]:
        args = shlex.split(args[0])
    cmd = ServingCommand()
    while args and "=" in args[0] and not args[0].startswith("-"):
        name, _, value = args.pop(0).partition("=")
        if name in ENV_FLAGS:
            cmd.env[name] = value
        else:
            cmd.ignored.append(f"{name}= (environment)")
    # Skip the launcher: python[3] -m sglang.launch_server | sglang serve | a bare flag list.
    for i in range(len(args)):
        if args[i].startswith("--"):
            launcher, args = args[:i], args[i:]
            break
    else:
        launcher, args = args, []
    if launcher and not (any(a in ("sglang.launch_server", "serve") for a in launcher)
                         or os.path.basename(launcher[-1]).startswith("sglang")):
        cmd.notes.append(f"not a command fi-autotune knows ({' '.join(launcher)}): read as SGLang 0.5.23 flags")
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("--"):
            cmd.ignored.append(token)
            continue
        flag, eq, inline = token.partition("=")
        if flag in AMBIGUOUS:
            raise UsageError(f"serving command: SGLang rejects {flag} as ambiguous; write {AMBIGUOUS[flag]}")
        name = _SPELLINGS.get(flag)
        if name is None:
            # Not ours: skip it and its value (the next token, unless it is a flag).
            if not eq and i < len(args) and not args[i].startswith("--"):
                cmd.ignored.append(f"{flag} {args[i]}")
                i += 1
            else:
                cmd.ignored.append(token)
            continue
        dest, nargs, _ = FLAGS[name]
        if nargs == 0:
            cmd.values[dest] = True
            continue
        if nargs == "+":
            values = [inline] if eq else []
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
            if not values:
                raise UsageError(f"serving command: {flag} needs a value")
            cmd.values[dest] = values
            continue
        if eq:
            value = inline
        elif i < len(args):
            value = args[i]
            i += 1
        else:
            raise UsageError(f"serving command: {flag} needs a value")
        cmd.values[dest] = _int(flag, value) if dest in _INTS else value
    if "model_path" not in cmd.values:
        raise UsageError("serving command: no --model-path")
    if "cuda_graph_max_bs" in cmd.values:
        cmd.notes.append("--cuda-graph-max-bs-decode sets the dummy pass's decode batch")
    return cmd
