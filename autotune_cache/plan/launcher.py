"""A pasted serving command taken apart: its environment, the program that starts the server, its flags.

``fi-autotune plan -- VAR=1 python3 -u -m sglang.launch_server --model-path ... --tp 8`` or
``-- vllm serve Qwen/Qwen3-30B-A3B -tp 2``: which engine reads the flags is decided by the
program alone (``program``, normalized: ``python -m sglang.launch_server``, ``sglang serve``,
``vllm serve``, ``python -m vllm.entrypoints.openai.api_server``), asked of each engine
(``Engine.programs``) - never by what the flags look like. A command of flags alone (no program)
is the default engine's; any other program is refused by the caller, naming the ones it reads.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field

#: ``python``, ``python3``, ``python3.12``, ``/usr/bin/python3``: an interpreter running ``-m``.
_PYTHON = re.compile(r"python(?:\d+(?:\.\d+)?)?")
#: Interpreter options that take a value (``python3 -X faulthandler -W ignore -m ...``).
_PYTHON_VALUED = {"-X", "-W", "-c", "--check-hash-based-pycs"}
#: ``env`` options that take a value (``env -u VAR -C dir VAR=1 ...``).
_ENV_VALUED = {"-u", "--unset", "-C", "--chdir", "-S", "--split-string"}


@dataclass(frozen=True)
class PastedCommand:
    env: dict[str, str] = field(default_factory=dict)
    #: The launcher's tokens as given (``("python3", "-u", "-m", "sglang.launch_server")``).
    launcher: tuple[str, ...] = ()
    #: The launcher normalized (``"python -m sglang.launch_server"``, ``"vllm serve"``); None: flags only.
    program: str | None = None
    args: tuple[str, ...] = ()


def split_command(argv: "list[str] | tuple[str, ...]") -> PastedCommand:
    """(environment assignments, launcher, flags) of a pasted command, given as arguments or as one
    shell-quoted string."""
    args = list(argv)
    if len(args) == 1 and " " in args[0]:
        args = shlex.split(args[0])
    env: dict[str, str] = {}
    while args:
        if os.path.basename(args[0]) == "env":  # `env VAR=value ... python -m ...` (its options skipped)
            args.pop(0)
            while args and args[0].startswith("-"):
                if args.pop(0) in _ENV_VALUED and args:
                    args.pop(0)
        elif "=" in args[0] and not args[0].startswith("-") and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", args[0].split("=")[0]):
            name, _, value = args.pop(0).partition("=")
            env[name] = value
        else:
            break
    if not args or args[0].startswith("-"):
        return PastedCommand(env, (), None, tuple(args))
    first = os.path.basename(args[0])
    if _PYTHON.fullmatch(first):
        i = 1
        while i < len(args) and args[i].startswith("-") and args[i] != "-m":
            if args[i].startswith("-m"):  # ``-mMODULE``, as Python takes it
                module = args[i][2:]
                return PastedCommand(env, tuple(args[:i + 1]), f"python -m {module}", tuple(args[i + 1:]))
            i += 2 if args[i] in _PYTHON_VALUED else 1
        if i + 1 < len(args) and args[i] == "-m":
            return PastedCommand(env, tuple(args[:i + 2]), f"python -m {args[i + 1]}", tuple(args[i + 2:]))
        return PastedCommand(env, tuple(args[:i + 1]), f"python {' '.join(args[1:i + 1])}".strip(),
                             tuple(args[i + 1:]))
    if len(args) > 1 and not args[1].startswith("-"):
        return PastedCommand(env, tuple(args[:2]), f"{first} {args[1]}", tuple(args[2:]))
    return PastedCommand(env, tuple(args[:1]), first, tuple(args[1:]))
