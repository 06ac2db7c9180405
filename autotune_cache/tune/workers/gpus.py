"""This machine's GPUs, seen from the parent process without a CUDA context (NVML, else
nvidia-smi): each worker then owns its device, and a machine without a driver has no GPU."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from autotune_cache.autotuner.arch import arch_from_capability
from autotune_cache.plan.topology import normalize_gpu_uuid


@dataclass(frozen=True)
class GpuInfo:
    count: int
    arch: str | None
    names: tuple[str, ...]


NO_GPU = GpuInfo(0, None, ())


def _gpus_from_smi() -> GpuInfo:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return NO_GPU
    rows = [r.rsplit(",", 1) for r in out.stdout.strip().splitlines() if "," in r] if out.returncode == 0 else []
    if not rows:
        return NO_GPU
    major, _, minor = rows[0][1].strip().partition(".")
    return GpuInfo(len(rows), arch_from_capability(int(major), int(minor or 0)), tuple(r[0].strip() for r in rows))


def detect_gpus() -> GpuInfo:
    """Through NVML (or nvidia-smi): no CUDA context in the parent, so workers own their devices."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no nvidia-ml-py or no driver
        return _gpus_from_smi()
    try:
        n = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        names = tuple(str(pynvml.nvmlDeviceGetName(h)) for h in handles)
        arch = None
        if handles:
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handles[0])
            arch = arch_from_capability(major, minor)
        return GpuInfo(n, arch, names)
    finally:
        pynvml.nvmlShutdown()


def detect_gpu_uuids() -> list[str]:
    """This machine's GPU UUIDs in index order, as SGLang writes them (no "GPU-", lowercase)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [normalize_gpu_uuid(line) for line in out.stdout.split() if line.strip()]
