"""The real ``fi-autotune`` command line on a machine without a GPU:

    python tests/standins/fake_gpu_cli.py warm ARGS...

runs the click CLI in this process exactly as ``fi-autotune`` does (same errors, same exit
codes), with one thing swapped: the machine warm runs on (``autotune_cache.tune.workers.machine.Machine``,
handed to the commands as click's context object). It sees ``FAKE_GPUS`` (default
``2xNVIDIA H200@sm90``: count x name @ arch) and starts ``FAKE_WORKER`` (default
tests/standins/fake_worker.py, which speaks the worker protocol and writes the keys the plan's recipes
predict) as each GPU's worker. Everything else - planning, the work queue, the commits, the
stores - is the real thing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from autotune_cache.tune.workers.gpus import GpuInfo
from autotune_cache.tune.workers.machine import Machine
from fi_autotune_cli import main as cli_main

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: devtools from the repo
from devtools.fingerprint import DEFAULT_METADATA  # noqa: E402

DEFAULT_GPUS = "2xNVIDIA H200@sm90"
DEFAULT_WORKER = str(Path(__file__).resolve().parent / "fake_worker.py")


def fake_machine(gpus: str = DEFAULT_GPUS, worker: str = DEFAULT_WORKER) -> Machine:
    """``gpus`` as ``<count>x<name>@<arch>``; ``worker`` the script each worker process runs."""
    count, _, rest = gpus.partition("x")
    name, _, arch = rest.partition("@")
    # FlashInfer's metadata as the stand-in worker writes it (tests/standins/fake_worker.py)
    metadata = {**DEFAULT_METADATA, "gpu": os.environ.get("FAKE_GPU", "NVIDIA H200")}
    return Machine(GpuInfo(int(count), arch, (name,) * int(count)), (sys.executable, worker), metadata)


def run(argv: list[str], machine: Machine) -> int:
    """``fi-autotune ARGV`` with ``machine`` as every command's context object."""
    return cli_main.main(argv, obj=machine)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:], fake_machine(os.environ.get("FAKE_GPUS", DEFAULT_GPUS),
                                            os.environ.get("FAKE_WORKER", DEFAULT_WORKER))))
