"""The command that makes the server's next boot a hit, for each cause ``doctor`` finds.

Built from what the log states: the arguments the server logged, read back into the serving
command its engine parses (each engine's ``command_from_logged_args``, through the registry; only
the flags fi-autotune models, since the others do not change the key), so ``fi-autotune warm --
<that command>`` tunes the very key the server looked for. Where the log states no arguments, the key fields of the
entry that differs only in its directory, or in one field, give them. Nothing here runs a command.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from autotune_cache import registry
from autotune_cache.logs.dialect import LogDialect
from autotune_cache.logs.formats import default_dialect
from autotune_cache.plan.entry_key import KeyFields


@dataclass(frozen=True)
class Fix:
    command: str
    where: str | None = None  # where to run it ("in the serving image (FlashInfer 0.8.0)"), if anywhere special

    def to_dict(self) -> dict:
        return {"command": self.command, "where": self.where}


def server_command(engine: LogDialect | None, args: dict | None) -> list[str] | None:
    """The serving command that makes ``args`` (as the server logged them), or None where the
    engine is unknown or the log names no model."""
    if engine is None or engine.name not in registry.KNOWN_ENGINES:
        return None
    return registry.get_engine(engine.name).command_from_logged_args(args)


def warm_options(fields: KeyFields) -> list[str]:
    """``warm``'s own options for a key's fields (no serving command in the log)."""
    words = ["--model-path", fields.model_path]
    for opt, value, default in (("--tp", fields.tp, 1), ("--pp", fields.pp, 1), ("--dp", fields.attn_dp_size, 1),
                                ("--ep", fields.ep, 1), ("--quantization", fields.quantization, None),
                                ("--moe-runner-backend", fields.moe_runner_backend, "auto")):
        if value != default:
            words += [opt, str(value)]
    if fields.dtype in ("float16", "float32"):
        words += ["--dtype", fields.dtype]
    if fields.skip_ops:
        words += ["--skip-ops", ",".join(fields.skip_ops)]
    return words


def root_option(engine: LogDialect | None, server_root: str | None) -> list[str]:
    """``--cache-dir ROOT`` where the server's root is not its engine's default one (which
    ``warm`` and ``import`` use unless told)."""
    if not server_root or engine is None or not engine.default_root:
        return []
    return [] if str(PurePosixPath(server_root)).endswith(engine.default_root) else ["--cache-dir", server_root]


def shell(words: list[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


def warm(engine: LogDialect | None, args: dict | None, fields: KeyFields | None, server_root: str | None,
         opaque_key: str | None = None, store: str | None = None) -> str:
    """``fi-autotune warm ...`` for the server's own flags, else its key's fields, else a
    placeholder for them. An engine whose key only it computes (``key_option``) is warmed from
    its own command with that key given, never from fields."""
    head = ["fi-autotune", "warm", *root_option(engine, server_root)]
    if store:
        head += ["--push", store]
    cmd = server_command(engine, args)
    if engine is not None and engine.key_option:
        if opaque_key:
            head += [engine.key_option, opaque_key]
        return shell(head) + " -- " + (shell(cmd) if cmd else engine.command_placeholder)
    if cmd:
        return shell(head) + " -- " + shell(cmd)
    if fields is not None and not fields.is_draft:
        # a draft worker's entry comes from the server's --speculative-* flags, which no key field
        # holds: from the fields alone, warm would tune the target's entry again
        return shell([*head, *warm_options(fields)])
    return shell(head) + " -- " + (engine or default_dialect()).command_placeholder


def pull(store: str, entry_id: str, server_root: str | None) -> str:
    """The server's own entry, fetched from the fleet's store into its tree."""
    return shell(["fi-autotune", "pull", store, entry_id, *(["--cache-dir", server_root] if server_root else [])])


def export_import(entry_id: str, engine: LogDialect | None, server_root: str | None, layout: str,
                  our_root: str) -> str:
    """Our entry, copied whole from the tree doctor read (``our_root``: named, so that the export
    runs wherever it is pasted) into the server's tree (run the import where that tree is)."""
    archive = "entry.tar.gz"
    lay = [] if layout == registry.default_layout().name else ["--layout", layout]
    root = ["--cache-dir", server_root] if server_root else []
    return (shell(["fi-autotune", "export", *lay, entry_id, "--cache-dir", our_root, "-o", archive]) + " && "
            + shell(["fi-autotune", "import", *lay, archive, *root, "--force"]))
