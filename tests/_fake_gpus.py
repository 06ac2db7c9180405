"""The environment that makes the real ``warm`` command see two H200s and run
tests/_fake_worker.py as its workers (shared by the fleet and vLLM planner tests)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def gpu_env(tmp_path: Path, **extra) -> dict:
    return {"FI_AUTOTUNE_TEST_GPUS": "2xNVIDIA H200@sm90", "FI_AUTOTUNE_TEST_WORKER": str(REPO / "tests" / "_fake_worker.py"),
            "XDG_CACHE_HOME": str(tmp_path / "xdg"), "FLASHINFER_AUTOTUNE_CACHE_DIR": str(tmp_path / "v2"),
            "PYTHONPATH": str(REPO), **extra}
