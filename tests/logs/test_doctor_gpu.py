"""``doctor`` on a log of FlashInfer's own autotuner, captured on a lent GPU (issue 35).

Run through the device tool: ``python3 -m pytest -m gpu tests/logs/test_doctor_gpu.py``. ``verify``
replays the engine's startup pass under FlashInfer's ``autotune(True)`` with FlashInfer's logger
at info, and its stderr is the log: over a warmed entry nothing is tuned (doctor exits 0), over
the same entry emptied of its tactics every op is tuned again and FlashInfer prints its tqdm
bars (doctor exits 1 and names the ops). The captured logs are kept under
``$FI_AUTOTUNE_RESULTS_DIR`` when set, to become fixtures (tests/data/engine_logs/README.md).
Run on an H200 on 2026-11-28, after doctor's reader was rebuilt on engine dialects: passed (52.9 s).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from autotune_cache.autotuner.rankfile import RESERVED_KEYS

from ..conftest import run_cli

pytestmark = pytest.mark.gpu

QWEN = ["--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass"]
LOG_ENV = {"FLASHINFER_LOGGING_LEVEL": "info"}


def _verify_log(root: Path, name: str, tmp_path: Path) -> tuple[Path, int]:
    proc = run_cli("verify", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass",
                   "--cache-dir", str(root), timeout=1800, env=LOG_ENV)
    log = tmp_path / f"{name}.log"
    log.write_text(proc.stderr)
    keep = os.environ.get("FI_AUTOTUNE_RESULTS_DIR")
    if keep:
        shutil.copy(log, Path(keep) / f"verify-{name}.log")
    return log, proc.returncode


def test_doctor_reads_verify_log_over_warmed_and_emptied_entry(tmp_path):
    root = tmp_path / "cache"
    proc = run_cli("warm", *QWEN, "--gpus", "1", "--cache-dir", str(root), "--json", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warmed = json.loads(proc.stdout)
    log, rc = _verify_log(root, "warmed", tmp_path)
    assert rc == 0, log.read_text()[-3000:]
    d = run_cli("doctor", str(log), "--cache-dir", str(root), "--json")
    assert d.returncode == 0, d.stdout + d.stderr
    # the same entry with every tactic gone (the metadata kept): the replay tunes every op again
    for f in Path(warmed["key_dir"]).glob("rank_*.json"):
        data = json.loads(f.read_text())
        f.write_text(json.dumps({k: v for k, v in data.items() if k in RESERVED_KEYS}))
    log, _ = _verify_log(root, "emptied", tmp_path)
    d = run_cli("doctor", str(log), "--cache-dir", str(root), "--json")
    assert d.returncode == 1, d.stdout + d.stderr
    report = json.loads(d.stdout)
    ops = {o["op"] for s in report["servers"] for o in s["shared_tuning"]} | {
        o["op"] for s in report["servers"] for r in s["ranks"] for x in r["sessions"] for o in x["tuned"]}
    assert {"trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2"} <= ops, report
