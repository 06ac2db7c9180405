"""``env``: this host's fingerprint, exactly the fields FlashInfer compares before using a cache."""

from __future__ import annotations

import click

from autotune_cache.autotuner.fingerprint import this_host
from autotune_cache.errors import FiAutotuneError

from ..output import Output
from ..params import json_option


@click.command("env")
@click.option("--allow-unknown", is_flag=True,
              help="Print (and exit 0) even where the GPU, CUDA or a library cannot be read; the JSON lists those "
                   "fields under `unknown`, and `check --strict --env-from` fails on each.")
@json_option
def env_cmd(allow_unknown, as_json):
    """Print this environment's FlashInfer fingerprint (imports flashinfer and torch).

    FlashInfer ignores a cache file whose `_metadata` differs from these fields in any way. Run
    it in the serving image on the target GPU and save it (`fi-autotune env --json > env.json`);
    then `ls`, `show`, `prune` and `check` take `--env-from env.json` on any machine. Where a
    field cannot be read (no GPU, no CUDA) it exits 1 and prints no JSON: such a fingerprint
    stands for no serving environment (`--allow-unknown` prints it anyway, marked).
    """
    out = Output(as_json)
    fp = this_host()
    refused = None if allow_unknown or not fp.unknown else FiAutotuneError(
        f"cannot read {', '.join(fp.unknown)} here: this fingerprint stands for no serving environment",
        hint="run it in the serving image on its GPU; --allow-unknown prints it anyway, its unknown fields listed")
    if refused and out.mode.value == "json":
        raise refused  # no JSON a redirect could save as if it were a serving environment

    def human() -> None:
        for name, value in fp.fields.items():
            out.line(f"{name:<24}{value}")
        out.line(f"{'arch':<24}{fp.arch or 'unknown (no GPU)'}")
        for g in fp.gpus:
            out.line(f"{'gpu ' + str(g['index']):<24}{g['name']} {g['uuid'] or ''}".rstrip())

    out.emit(human=human, data=fp.to_dict())
    if refused:
        raise refused
