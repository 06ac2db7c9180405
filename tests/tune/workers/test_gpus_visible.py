"""Which GPUs a warm counts: CUDA_VISIBLE_DEVICES applied as CUDA applies it (autotune_cache.tune.workers.gpus).

NVML and nvidia-smi list every GPU of the machine; a warm under CUDA_VISIBLE_DEVICES=2 with --gpus 2 (seen on
a 4 x H100 machine) started a second worker on a device it could not see and died with an IndexError. The
machine's GPU list comes from a stand-in nvidia-smi here (CI has none); it answers only the exact query our
code makes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from autotune_cache.errors import UsageError
from autotune_cache.tune.workers import gpus as gpus_mod
from autotune_cache.tune.workers.gpus import Gpu, detect_gpu_uuids, detect_gpus, mask_entries, visible
from autotune_cache.tune.workers.gpus import devices

U = ["GPU-0a1b2c3d-0000-4000-8000-000000000000", "GPU-0a1b9999-0000-4000-8000-000000000001",
     "GPU-7f000000-0000-4000-8000-000000000002", "GPU-8e000000-0000-4000-8000-000000000003"]
MACHINE = [Gpu("NVIDIA H100 80GB HBM3", U[0], (9, 0)), Gpu("NVIDIA H100 80GB HBM3", U[1], (9, 0)),
           Gpu("NVIDIA H200", U[2], (9, 0)), Gpu("NVIDIA B200", U[3], (10, 0))]


@pytest.mark.parametrize("env,want", [
    (None, [0, 1, 2, 3]),
    ("2", [2]),
    ("3,0", [3, 0]),  # CUDA's order, not the machine's
    (" 1 , 2 ", [1, 2]),
    ("0,7,1", [0]),  # the list stops at the first entry that names no device
    ("0,2,-1,1", [0, 2]), ("0,,1", [0]), ("1,none,2", [1]),  # ... or has no index (CUDA's example: 0,2,-1,1)
    ("1,1,2", []),  # a repeated entry empties the list
    ("1gpu,2x", [1, 2]),  # an index is the integer its entry starts with (strtoul)
    ("", []), ("-1", []), ("none", []),
    ("GPU-7f", [2]),  # a unique UUID prefix
    ("GPU-0a1b", []),  # an ambiguous one names no device
    ("GPU-8e000000-0000-4000-8000-000000000003,0", [3]),  # a UUID list ends at the first entry without GPU-
    ("GPU-8E000000", []),  # prefixes match as written (NVML's hex is lower case)
    ("GPU-7f,GPU-7f0", []),  # two prefixes of one GPU empty the list
])
def test_visible_follows_cudas_rules(env, want):
    assert visible(MACHINE, env) == [MACHINE[i] for i in want]


GOLDEN = json.loads((Path(__file__).resolve().parents[2] / "data" / "torch-visible-devices.json").read_text())


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: repr(c["mask"]))
def test_the_mask_is_read_as_torch_reads_it(case):
    """torch's own reading of the variable (what the workers' CUDA sees), recorded on CPU by
    tests/oracle/torch_visible_devices.py: the entries, then the GPUs of MACHINE they name (torch's NVML
    count and UUID matching). torch counts no MIG instance through NVML (ordinals None)."""
    assert [g.uuid for g in MACHINE] == GOLDEN["uuids"]
    assert mask_entries(case["mask"]) == case["parsed"]
    if case["ordinals"] is not None:
        assert visible(MACHINE, case["mask"]) == [MACHINE[i] for i in case["ordinals"]]


def test_mig_entries_are_devices_of_the_first_gpus_kind():
    v = visible(MACHINE, "MIG-11111111-2222-3333-4444-555555555555,MIG-6")
    assert len(v) == 2 and all(g.capability == (9, 0) and g.name.endswith("MIG") for g in v)
    assert visible([], "MIG-1") == []


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """A stand-in nvidia-smi on PATH listing MACHINE (no NVML here: CI has no driver)."""
    rows = "".join(f"echo '{g.name}, {g.uuid}, {g.capability[0]}.{g.capability[1]}'\n" for g in MACHINE)
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n"
                   '[ "$1" = "--query-gpu=name,uuid,compute_cap" ] && [ "$2" = "--format=csv,noheader" ] '
                   '&& [ $# -eq 2 ] || { echo "unexpected: $*" >&2; exit 6; }\n' + rows)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # the nvidia-smi path, whatever this Python has
    return exe


def test_detect_counts_the_visible_gpus_only(smi, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    info = detect_gpus()
    assert info.count == 4 and info.arch == "sm90" and info.names[3] == "NVIDIA B200"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    info = detect_gpus()
    assert info.count == 2 and info.arch == "sm100" and info.names == ("NVIDIA B200", "NVIDIA H200")
    # --gpu-uuids auto: rank i runs on the i-th visible GPU
    assert detect_gpu_uuids() == [U[3][4:].lower(), U[2][4:].lower()]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_gpus().count == 0 and detect_gpu_uuids() == []


def test_a_failing_nvidia_smi_is_no_gpu(tmp_path, monkeypatch):
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert gpus_mod._physical() == [] and detect_gpus().count == 0


def test_mask_entries_read_as_cuda_reads_them_without_a_driver():
    assert mask_entries(None) is None and mask_entries("") == [] and mask_entries("-1") == []
    assert mask_entries(" 3 , 01 ,GPU-7f") == ["3", "1"]  # an index list: GPU-7f has no index
    assert mask_entries("0,-1,1") == ["0"] and mask_entries("0,,1") == ["0"] and mask_entries("2,02") == []
    assert mask_entries("GPU-7f,gpu-8e") == ["GPU-7f"] and mask_entries("MIG-a,MIG-b,0") == ["MIG-a", "MIG-b"]


def test_worker_devices_refuse_more_workers_than_the_mask_shows(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert devices(3) == ["0", "1", "2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert devices(2) == ["2", "3"] and devices(1) == ["2"]
    with pytest.raises(UsageError, match=r"--gpus 3: CUDA_VISIBLE_DEVICES=2,3 shows this command 2 GPU\(s\)"):
        devices(3)
    for mask in ("0,-1,1", "0,,1"):  # CUDA shows GPU 0 alone: no worker may start on 1
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mask)
        assert devices(1) == ["0"]
        with pytest.raises(UsageError, match=f"--gpus 2: CUDA_VISIBLE_DEVICES={mask} shows this command 1 GPU"):
            devices(2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,0,1")  # a repeat: CUDA shows none
    with pytest.raises(UsageError, match="shows this command 0 GPU"):
        devices(1)


def test_warm_with_more_gpus_than_visible_is_a_usage_error(smi, tmp_path):
    """The command as a user runs it: one line, exit 2, nothing written (not an internal error)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "2"}
    env.pop("PYTHONPATH", None)
    root = tmp_path / "cache"
    for gpus, msg in (("2", "--gpus 2: CUDA_VISIBLE_DEVICES=2 shows this command 1 GPU(s)"),):
        p = subprocess.run([sys.executable, "-m", "fi_autotune_cli", "warm", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2",
                            "--gpus", gpus, "--cache-dir", str(root)], capture_output=True, text=True, env=env,
                           cwd=Path(__file__).resolve().parents[3], timeout=120)
        assert p.returncode == 2 and p.stderr.strip() == f"fi-autotune: error: {msg}", p.stderr
        assert "Traceback" not in p.stderr and not root.exists()
