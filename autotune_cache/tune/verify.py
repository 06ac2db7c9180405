"""``verify``: replay what the engine runs at startup against a cache, on a GPU, and count hits.

For each distinct rank workload: load a temporary copy of its rank file the way SGLang does
(``AutoTuner.load_configs``; False means FlashInfer here rejects the file's ``_metadata``), then
run the skeleton forward at the engine's own dummy-pass token counts - not warm's superset -
inside ``flashinfer.autotune(True)`` and ``lm_head_stub()``. Every profile the engine would look
up and find is a hit; every one FlashInfer has to tune is a miss. Importing this module imports
torch (the skeleton); the command imports it only when it runs.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from autotune_cache.autotuner.fingerprint import this_host
from autotune_cache.autotuner.rankfile import parse_cache_bytes, read_regular_file
from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.plan.tuning import TuningPlan, dummy_tokens
from autotune_cache.tune.workers.gpus import NO_GPU_TO_REPLAY_ON
from autotune_cache.tune.workers.lm_head import lm_head_stub
from autotune_cache.tune.workers.skeleton import SkeletonModel


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

    if not torch.cuda.is_available():
        raise UsageError(NO_GPU_TO_REPLAY_ON)
    buckets = plan.engine.tuning_buckets(plan)
    if buckets is not None:
        return verify_bucketed(plan, Path(key_dir), buckets)
    return _verify_passes(plan, key_dir)


def _verify_passes(plan: TuningPlan, key_dir: Path) -> VerifyReport:
    """SGLang: its dummy passes at their token counts, over rank 0's file of each workload."""
    import torch
    from flashinfer.autotuner import AutoTuner, autotune

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


def _entry_bytes(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.glob("v2/*/entries/*.json")}


def verify_bucketed(plan: TuningPlan, key_dir: Path, buckets: tuple[int, ...]) -> VerifyReport:
    """vLLM: one dummy run at the largest token count inside ``autotune(tuning_buckets=buckets,
    round_up=True)``, over a copy of what it reads - its rank files (they must pass its hit test:
    one ``_metadata`` and one field count on every rank, else it tunes everything), or, single
    rank, its managed store entered as ``autotune_v2(mode="tune", cache_root=...)``. What the pass
    tunes is a miss: counted from the store's new entries, or from the tuner's new winners."""
    import torch
    from flashinfer import autotune_v2
    from flashinfer.autotuner import AutoTuner, autotune

    device = torch.device("cuda", 0)
    n = buckets[-1]
    reports = []
    for workload in plan.workloads:
        if not workload.ops:
            continue
        w = workload.to_dict()
        tmp = Path(tempfile.mkdtemp(prefix="fi-autotune-verify-"))
        try:
            tuner = AutoTuner.get()
            tuner.clear_cache()
            # the layout stages what the engine reads: rank files behind vLLM's hit test, or a copy
            # of the managed store entered in tune mode (a miss then publishes into the copy)
            replay = plan.layout_obj.stage_replay(key_dir, w["ranks"], tmp, tuner.load_configs, this_host().fields)
            context = (autotune_v2(mode="tune", cache_root=replay.store_root) if replay.store_root is not None
                       else contextlib.nullcontext())
            before = _entry_bytes(tmp)
            report = WorkloadReport(replay.source, len(w["ranks"]), replay.accepted)
            model = SkeletonModel(w["ops"], hidden=plan.spec.hidden_size, vocab=plan.spec.vocab_size,
                                  tp=plan.resolution.flags.tp, dp=plan.resolution.attn_dp_size,
                                  dtype=plan.resolution.dtype, device=device)
            t0 = time.perf_counter()
            with torch.inference_mode(), context, autotune(True, tuning_buckets=buckets, round_up=True):
                for layer in model.layers:
                    layer(n)
            torch.cuda.synchronize()
            report.replay_s = round(time.perf_counter() - t0, 3)
            changed = [data for path, data in sorted(_entry_bytes(tmp).items()) if before.get(path) != data]
            tuned = plan.layout_obj.replayed_tunes(changed, [k.file_key for k in tuner.profiling_cache])
            report.retuned, report.retuned_keys = len(tuned), tuned[:20]
            report.lookups = sum(len(op["engine_keys"]) * len(op["custom_ops"]) for op in w["ops"])
            report.hits = max(0, report.lookups - report.retuned) if replay.accepted else 0
            reports.append(report)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return VerifyReport(str(key_dir), reports)
