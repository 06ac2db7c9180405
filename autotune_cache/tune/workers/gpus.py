"""This machine's GPUs, seen from the parent process without a CUDA context (NVML, else
nvidia-smi): each worker then owns its device, and a machine without a driver has no GPU."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from autotune_cache.autotuner.arch import arch_from_capability
from autotune_cache.errors import UsageError
from autotune_cache.plan.topology import normalize_gpu_uuid


@dataclass(frozen=True)
class GpuInfo:
    count: int
    arch: str | None
    names: tuple[str, ...]


NO_GPU = GpuInfo(0, None, ())
#: ``verify``'s refusal without a GPU: said by the CLI where NVML lists none (before torch's seconds
#: of import), and by the replay where CUDA reaches none of the GPUs NVML lists
NO_GPU_TO_REPLAY_ON = "no CUDA GPU found: verify replays the engine's pass on one"


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as NVML / nvidia-smi list it (index order)."""

    name: str
    uuid: str  # "GPU-..." as NVML gives it
    capability: tuple[int, int]


def _leading_int(text: str) -> int:
    """The integer a ``CUDA_VISIBLE_DEVICES`` entry starts with, as C's strtoul reads it (``1gpu`` is 1);
    -1 for none or a negative one."""
    digits = 0
    while digits < len(text) and (text[digits].isdigit() or (digits == 0 and text[0] in "+-")):
        digits += 1
    try:
        return int(text[:digits]) if digits else -1
    except ValueError:  # a sign alone
        return -1


def mask_entries(env_value: str | None) -> list[str] | None:
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value CUDA reads (None: unset, every GPU). Needs no
    driver: what ``--gpus N`` is checked against before any worker starts. CUDA's rules, as torch
    reads them (``torch.cuda._parse_visible_devices``, compared in tests/tune/workers/test_gpus_visible.py):
    a list of ``GPU-`` UUID prefixes or of ``MIG-`` instances when the value starts so, read up to the
    first entry without that prefix; else of indices, each the integer its entry starts with, read up
    to the first entry that has none or a negative one (``0,2,-1,1`` shows 0 and 2); a repeated entry
    makes the whole list empty."""
    if env_value is None:
        return None
    if env_value.startswith(("GPU-", "MIG-")):
        prefix, out = env_value[:4], []
        for e in env_value.split(","):
            if e in out:
                return []
            if not e.startswith(prefix):
                break
            out.append(e)
        return out
    ints: list[int] = []
    for e in env_value.split(","):
        i = _leading_int(e.strip())
        if i in ints:
            return []
        if i < 0:
            break
        ints.append(i)
    return [str(i) for i in ints]


def devices(n: int) -> list[str]:
    """Worker ``w``'s CUDA_VISIBLE_DEVICES: the w-th visible device (``pool.WorkerPool``). A usage
    error when the variable lists fewer than ``n`` (``--gpus`` starts the workers before the GPUs are
    counted, so this is the first place to see it)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    found = mask_entries(visible)
    if found is None:
        return [str(i) for i in range(n)]
    if len(found) < n:
        raise UsageError(f"--gpus {n}: CUDA_VISIBLE_DEVICES={visible} shows this command {len(found)} GPU(s)")
    return found[:n]


def visible(physical: list[Gpu], env_value: str | None) -> list[Gpu]:
    """The GPUs a CUDA process started with ``CUDA_VISIBLE_DEVICES=env_value`` sees, in its order.
    Why: NVML and nvidia-smi list every GPU of the machine whatever the variable says, and a warm
    run under ``CUDA_VISIBLE_DEVICES=2`` (torchrun, Slurm, a pod's device plugin) with ``--gpus 2``
    started a second worker on a device it could not see. The entries are :func:`mask_entries`'; the
    list then stops at an index past the last GPU or a UUID prefix that matches none or several, and
    two prefixes of one GPU make it empty (torch's ``_device_count_nvml`` and
    ``_transform_uuid_to_ordinals``). Indices are matched in NVML's (PCI bus) order: CUDA's order on
    machines of one GPU kind and under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (on a mixed machine CUDA's
    default puts the fastest first). ``MIG-`` entries are MIG instances of the first GPU's kind
    (torch counts none of them through NVML; NVML's MIG handles are not read here)."""
    entries = mask_entries(env_value)
    if entries is None:
        return list(physical)
    if entries and entries[0].startswith("MIG-"):
        return [Gpu(f"{physical[0].name} MIG", e, physical[0].capability) for e in entries] if physical else []
    out: list[Gpu] = []
    for e in entries:
        if e.startswith("GPU-"):
            hit = [g for g in physical if g.uuid.startswith(e)]
            if len(hit) != 1:
                break
            if hit[0] in out:
                return []
        elif int(e) < len(physical):
            hit = [physical[int(e)]]
        else:
            break
        out.append(hit[0])
    return out


def _info(gpus: list[Gpu]) -> GpuInfo:
    """The count, the first GPU's arch (what the plan is checked against, as before), every name."""
    if not gpus:
        return NO_GPU
    return GpuInfo(len(gpus), arch_from_capability(*gpus[0].capability), tuple(g.name for g in gpus))


def _physical_from_smi() -> list[Gpu]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,uuid,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    gpus = []
    for row in out.stdout.strip().splitlines():
        parts = [x.strip() for x in row.rsplit(",", 2)]
        if len(parts) != 3:
            continue
        major, _, minor = parts[2].partition(".")
        try:
            gpus.append(Gpu(parts[0], parts[1], (int(major), int(minor or 0))))
        except ValueError:
            continue
    return gpus


def _physical() -> list[Gpu]:
    """Every GPU of the machine through NVML (nvidia-smi without it): no CUDA context in the parent."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no nvidia-ml-py or no driver
        return _physical_from_smi()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            gpus.append(Gpu(str(pynvml.nvmlDeviceGetName(h)), uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                            tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h))))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def visible_gpus() -> list[Gpu]:
    """The GPUs this process's CUDA would see (``CUDA_VISIBLE_DEVICES`` applied)."""
    return visible(_physical(), os.environ.get("CUDA_VISIBLE_DEVICES"))


def detect_gpus() -> GpuInfo:
    """The visible GPUs, through NVML (or nvidia-smi): no CUDA context in the parent, so workers own
    their devices."""
    return _info(visible_gpus())


def detect_gpu_uuids() -> list[str]:
    """The visible GPUs' UUIDs in CUDA's order (rank i runs on the i-th), as SGLang writes them (no
    "GPU-", lowercase)."""
    return [normalize_gpu_uuid(g.uuid) for g in visible_gpus() if g.uuid.startswith("GPU-")]
