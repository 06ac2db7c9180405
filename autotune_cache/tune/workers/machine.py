"""The machine a warm runs on, as one object the orchestrators take: how its GPUs are found and
what command starts a worker on one.

The defaults are this machine's (NVML, ``python -m autotune_cache.tune.workers.worker``). A GPU-less CI
passes fixed GPUs and a stand-in worker script instead (tests/standins/fake_gpu_cli.py) - through this
parameter, not through hooks in the code: everything else runs as in production.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from autotune_cache.errors import UsageError
from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tune.workers.envprobe import probe_environment
from autotune_cache.tune.workers.gpus import GpuInfo, detect_gpus
from autotune_cache.tune.workers import served
from autotune_cache.tune.workers.pool import WORKER_ARGV, WorkerPool


@dataclass(frozen=True)
class Machine:
    gpus: GpuInfo | None = None  # None: detect them (``gpus.detect_gpus``)
    worker_argv: tuple[str, ...] = WORKER_ARGV
    #: FlashInfer's ``_metadata`` on its GPUs; None: read it there (``envprobe``).
    metadata: dict | None = None

    def detect_gpus(self) -> GpuInfo:
        return self.gpus if self.gpus is not None else detect_gpus()

    def environment(self) -> dict:
        """What FlashInfer on this machine's GPU writes as ``_metadata`` (a managed store's key)."""
        return dict(self.metadata) if self.metadata is not None else probe_environment()

    def start_pool(self, n: int) -> WorkerPool:
        """``n`` workers: the served ones (``fi-autotune workers start``) when this warm may use
        them (``served.claim``), else new processes."""
        return WorkerPool(n, self.worker_argv, served=served.claim(n, self.worker_argv))

    def usable_gpus(self, n: int | None, plan_hint: str | None) -> GpuInfo:
        """This machine's GPUs, or a usage error: none at all, or fewer than ``--gpus`` asks for.
        ``plan_hint``: the command that shows the plan without a GPU (None: not a warm)."""
        info = self.detect_gpus()
        mask = os.environ.get("CUDA_VISIBLE_DEVICES") if self.gpus is None else None
        seen = "" if mask is None else f" (CUDA_VISIBLE_DEVICES={mask})" if mask.strip() else " (CUDA_VISIBLE_DEVICES is empty)"
        if info.count == 0:
            raise UsageError(f"no CUDA GPU found{seen}: " + (f"warm needs one ({plan_hint} shows the plan without a GPU)"
                                                             if plan_hint else "served workers need one"))
        if n is not None and n > info.count:
            raise UsageError(f"--gpus {n}: this machine has {info.count} GPU(s)" + (f" visible{seen}" if seen else ""))
        return info


#: This machine, as production sees it.
THIS_MACHINE = Machine()


def preflight(plan: TuningPlan, info: GpuInfo, gpus: int | None, pool: WorkerPool | None) -> int:
    """Usage errors before any work: the plan's GPUs are these, FlashInfer imports. The worker count."""
    arch = plan.resolution.arch
    if plan.resolution.moe_runner_backend == "flashinfer_megamoe" and not plan.resolution.topology.gpu_uuids:
        raise UsageError("flashinfer_megamoe names each rank file after its GPU: pass --gpu-uuids (the serving "
                         "machine's UUIDs in tp-rank order, or auto when it is this machine)")
    if info.count == 0:
        raise UsageError("no CUDA GPU found: warm needs one (run `fi-autotune plan` to see the plan without a GPU)")
    if info.arch != arch:
        raise UsageError(f"the plan targets {arch} but this machine's GPUs are {info.arch} ({info.names[0]})")
    if len(set(info.names)) > 1 and gpus != 1:
        raise UsageError(f"mixed GPU models ({', '.join(sorted(set(info.names)))}): tuned tactics would differ; use --gpus 1")
    n = info.count if gpus is None else gpus
    if n < 1 or n > info.count:
        raise UsageError(f"--gpus {n}: this machine has {info.count} GPU(s)")
    if pool is not None and len(pool.procs) != n:
        raise ValueError(f"worker pool has {len(pool.procs)} workers, not {n}")
    if importlib.util.find_spec("flashinfer") is None:
        raise UsageError("flashinfer is not importable in this Python: install flashinfer-python")
    return n
