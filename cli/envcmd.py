"""``env``: this host's fingerprint, exactly the fields FlashInfer compares before using a cache."""

from __future__ import annotations

import click

from autotune_cache.autotuner.fingerprint import this_host

from .output import Output
from .params import json_option


@click.command("env")
@json_option
def env_cmd(as_json):
    """Print this environment's FlashInfer fingerprint (imports flashinfer and torch).

    FlashInfer ignores a cache file whose `_metadata` differs from these fields in any way. Run
    it in the serving image on the target GPU and save it (`fi-autotune env --json > env.json`);
    then `ls`, `show`, `prune` and `check` take `--env-from env.json` on any machine.
    """
    out = Output(as_json)
    fp = this_host()

    def human() -> None:
        for name, value in fp.fields.items():
            out.line(f"{name:<24}{value}")
        out.line(f"{'arch':<24}{fp.arch or 'unknown (no GPU)'}")
        for g in fp.gpus:
            out.line(f"{'gpu ' + str(g['index']):<24}{g['name']} {g['uuid'] or ''}".rstrip())
        if not fp.has_gpu:
            out.note("no GPU here: this fingerprint cannot stand for a serving environment "
                     "(run it in the serving image on the target GPU)")

    out.emit(human=human, data=fp.to_dict())
