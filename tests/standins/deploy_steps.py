"""Stands in for the GPU steps of docs/deploy.md on machines without a GPU:

* ``env``: prints the fingerprint of an H200 serving image (what ``fi-autotune env --json``
  prints there), so later steps have a target to check against;
* ``warm ARGS``: parses ARGS with the real ``warm`` command's options and writes the entry
  ``warm`` would write for them (every key the plan's recipes predict, that fingerprint as
  ``_metadata``), through the real writer;
* ``warm --targets ...``: the real command (tests/standins/fake_gpu_cli.py), with two H200s and
  tests/standins/fake_worker.py standing in for the GPUs and the GPU worker (it writes the same keys and
  fingerprint).

Only what cannot exist in CI (a GPU) is faked; every other step of a recipe runs for real.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: tests and devtools from the repo
from devtools.synthetic import DEFAULT_METADATA, write_plan_entry  # noqa: E402
from fi_autotune_cli.serving import build_plan, request_from  # noqa: E402
from fi_autotune_cli.commands.warm import warm_cmd  # noqa: E402
from tests.standins.fake_gpu_cli import fake_machine, run  # noqa: E402

#: the recipes' shells run it as ``python deploy_steps.py`` (tests/support/zygotes.py ``cli_on_path``)
SCRIPT = Path(__file__).resolve()

H200 = {"format": 1, "tool": "fi-autotune env", "fingerprint": DEFAULT_METADATA, "arch": "sm90",
        "gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": None}], "host": "gpu-box", "captured": None}


def main() -> int:
    cmd, *args = sys.argv[1:]
    if cmd == "env":
        print(json.dumps(H200, indent=2))
        return 0
    if cmd != "warm":
        raise SystemExit(f"no stand-in for {cmd}")
    if "--targets" in args:
        return run(["warm", *args], fake_machine())
    ctx = warm_cmd.make_context("warm", [*args, "--arch", "sm90"])
    kw = {k: v for k, v in ctx.params.items() if k not in ("gpus", "force", "as_json", "serving_command")}
    plan = build_plan(request_from(kw), kw["cache_dir"])
    eid = write_plan_entry(plan)
    print(f"(stand-in for a GPU) wrote {eid}: {plan.profiles} profiles", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
