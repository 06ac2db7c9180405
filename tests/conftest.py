from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# No test may wait on the Hugging Face hub (CI has no network); the hub path is exercised through
# a real local cache in test_config_spec.py.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def run_cli(*args: str, env: dict | None = None, input: str | None = None, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """The real command in a real process, as a user runs it."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "cli", *args], capture_output=True, text=True,
        env=full_env, input=input, timeout=timeout, cwd=kw.pop("cwd", REPO), **kw,
    )


def run_json(*args: str, **kw):
    proc = run_cli(*args, "--json", **kw)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "sglang-cache"
    r.mkdir()
    return r


def pytest_collection_modifyitems(config, items):
    """GPU tests need CUDA; skip them (visibly) on machines without a GPU."""
    try:
        has_gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine (run with the device tool: -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
