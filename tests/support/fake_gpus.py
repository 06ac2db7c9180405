"""The real command line on two stand-in H200s (tests/standins/fake_gpu_cli.py runs the click CLI with a
fake ``Machine``, whose workers are tests/standins/fake_worker.py), shared by the fleet and vLLM tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: The real command line on two stand-in H200s.
FAKE_GPU_CLI = [sys.executable, str(REPO / "tests" / "standins" / "fake_gpu_cli.py")]


def gpu_env(tmp_path: Path, **extra) -> dict:
    return {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "FLASHINFER_AUTOTUNE_CACHE_DIR": str(tmp_path / "v2"),
            "PYTHONPATH": str(REPO), **extra}


def run_gpu_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``run_cli`` on the stand-in GPUs: a real process, as a user runs it on a GPU machine (forked
    by the CLI fork server as ``python fake_gpu_cli.py``, like the fault launcher)."""
    from tests.conftest import run_cli  # the suite's conftest: it imports nothing of this module

    return run_cli(*args, env=env, timeout=timeout, launcher=FAKE_GPU_CLI)
