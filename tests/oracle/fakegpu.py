"""A GPU that is not there, for running an engine's own Python on a CPU-only machine.

Engines decide defaults (attention backend, MoE backend, memory-derived sizes) from the GPU's
compute capability, name and memory. No Blackwell GPU is lent and CI has no GPU at all, so the
oracle scripts under tests/oracle/ install this before importing the engine: torch.cuda answers
as the named GPU would (capability, name, total memory, count) and ``nvidia-smi`` prints its
memory. Nothing here launches a kernel; a kernel call reaches ``cudastubs`` and fails loudly.

The figures are what the real devices report (torch.cuda.get_device_properties / nvidia-smi):
H100 SXM 80 GB = 81559 MiB, H200 = 143771 MiB, B200 = 183359 MiB, B300 = 275040 MiB.
"""

from __future__ import annotations

import os
import stat
import tempfile
import types

GPUS = {
    "sm90": ("NVIDIA H100 80GB HBM3", (9, 0), 81559, 132),
    "sm90-h200": ("NVIDIA H200", (9, 0), 143771, 132),
    "sm100": ("NVIDIA B200", (10, 0), 183359, 148),
    "sm103": ("NVIDIA B300 SXM6 AC", (10, 3), 275040, 148),
}


def install(kind: str, count: int = 8) -> dict:
    """Make torch (and nvidia-smi on PATH) describe ``count`` GPUs of ``kind``; returns the facts."""
    import torch

    name, cap, mib, sms = GPUS[kind]
    total = mib * (1 << 20)
    torch.version.cuda = torch.version.cuda or "13.0"
    cuda = torch.cuda
    props = types.SimpleNamespace(
        total_memory=total, name=name, major=cap[0], minor=cap[1], multi_processor_count=sms,
        uuid="GPU-00000000-0000-0000-0000-000000000000", L2_cache_size=126 << 20,
        gcnArchName="", is_integrated=False,
    )
    cuda.is_available = lambda: True
    cuda.device_count = lambda: count
    cuda.get_device_capability = lambda *a, **k: cap
    cuda.get_device_name = lambda *a, **k: name
    cuda.get_device_properties = lambda *a, **k: props
    cuda.mem_get_info = lambda *a, **k: (total - (1 << 30), total)
    cuda.is_initialized = lambda: True
    cuda.current_device = lambda: 0
    cuda.set_device = lambda *a, **k: None
    cuda.is_current_stream_capturing = lambda: False
    bindir = tempfile.mkdtemp(prefix="fakegpu-")
    smi = os.path.join(bindir, "nvidia-smi")
    with open(smi, "w") as f:
        f.write("#!/bin/sh\n" + "".join(f"echo {mib}\n" for _ in range(count)))
    os.chmod(smi, stat.S_IRWXU)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    return {"name": name, "capability": list(cap), "total_memory_mib": mib, "count": count}
