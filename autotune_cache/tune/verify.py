"""``verify``: replay what the engine runs at startup against a cache, on a GPU, and count hits.

For each distinct rank workload: load a temporary copy of its rank file the way SGLang does
(``AutoTuner.load_configs``; False means FlashInfer here rejects the file's ``_metadata``), then
run the skeleton forward at the engine's own dummy-pass token counts - not warm's superset -
inside ``flashinfer.autotune(True)`` and ``lm_head_stub()``. Every profile the engine would look
up and find is a hit; every one FlashInfer has to tune is a miss. Importing this module imports
torch (the skeleton); the command imports it only when it runs.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from autotune_cache.autotuner.rankfile import parse_cache_bytes, read_regular_file
from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.plan.tuning import TuningPlan, dummy_tokens
from autotune_cache.tune.lm_head import lm_head_stub
from autotune_cache.tune.skeleton import SkeletonModel


@dataclass
class WorkloadReport:
    rank_file: str
    ranks: int
    metadata_accepted: bool
    lookups: int = 0
    hits: int = 0
    retuned: int = 0
    replay_s: float = 0.0
    retuned_keys: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class VerifyReport:
    key_dir: str
    workloads: list[WorkloadReport]

    @property
    def ok(self) -> bool:
        return all(w.metadata_accepted and w.retuned == 0 for w in self.workloads)

    @property
    def lookups(self) -> int:
        return sum(w.lookups for w in self.workloads)

    @property
    def hits(self) -> int:
        return sum(w.hits for w in self.workloads)

    def to_dict(self) -> dict:
        return {"key_dir": self.key_dir, "ok": self.ok, "lookups": self.lookups, "hits": self.hits,
                "hit_rate": (self.hits / self.lookups) if self.lookups else None,
                "workloads": [w.to_dict() for w in self.workloads]}


def verify(plan: TuningPlan, key_dir: Path) -> VerifyReport:
    import torch
    from flashinfer.autotuner import AutoTuner, autotune

    if not torch.cuda.is_available():
        raise UsageError("no CUDA GPU found: verify replays the engine's pass on one")
    device = torch.device("cuda", 0)
    spec, res = plan.spec, plan.resolution
    reports = []
    for workload in plan.workloads:
        if not workload.ops:
            continue
        w = workload.to_dict()  # the skeleton builds its layers from the recipes' JSON, as the worker does
        src = Path(key_dir) / w["ranks"][0]
        try:
            parse_cache_bytes(read_regular_file(src))
        except (OSError, ValueError) as e:
            raise FiAutotuneError(f"{src}: {e}") from None
        tmpdir = Path(tempfile.mkdtemp(prefix="fi-autotune-verify-"))
        try:
            copy = tmpdir / src.name
            shutil.copyfile(src, copy)
            tuner = AutoTuner.get()
            tuner.clear_cache()
            accepted = tuner.load_configs(str(copy))
            report = WorkloadReport(str(src), len(w["ranks"]), bool(accepted))
            model = SkeletonModel(w["ops"], hidden=spec.hidden_size, vocab=spec.vocab_size, tp=res.flags.tp,
                                  dp=res.attn_dp_size, dtype=res.dtype, device=device)
            resolution = res.to_dict()
            t0 = time.perf_counter()
            with autotune(True), lm_head_stub():
                for dummy_pass in resolution["passes"]:
                    model(lambda op, p=dummy_pass: dummy_tokens(resolution, op, p), lm_tokens=dummy_pass["batch"][1])
            torch.cuda.synchronize()
            report.replay_s = round(time.perf_counter() - t0, 3)
            tuned = [k.file_key for k in tuner.profiling_cache]
            report.retuned = len(tuned)
            report.retuned_keys = tuned[:20]
            report.lookups = sum(len(op["engine_keys"]) * len(op["custom_ops"]) for op in w["ops"])
            report.hits = max(0, report.lookups - report.retuned) if accepted else 0
            reports.append(report)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
    return VerifyReport(str(key_dir), reports)
