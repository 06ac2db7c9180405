"""warm's orchestration on CPU with real worker processes speaking the worker protocol.

No GPU exists here, so tests/standins/fake_worker.py stands in for the GPU part of autotune_cache.tune.workers.worker;
it receives exactly the task files warm writes. The real worker runs in tests/tune/test_gpu.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dataclasses import replace

from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.autotuner.rankfile import RESERVED_KEYS
from autotune_cache.plan.request import TuneRequest
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.plan.flags import ServerFlags
from devtools.synthetic import write_fake_entry
from autotune_cache.tune.workers.gpus import GpuInfo
from autotune_cache.tune.workers.pool import WorkerPool
from autotune_cache.tune.session.warm import warm

from tests.conftest import REPO

FAKE = [sys.executable, str(REPO / "tests" / "standins" / "fake_worker.py")]
H200 = GpuInfo(2, "sm90", ("NVIDIA H200", "NVIDIA H200"))


@pytest.fixture
def plan(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # platformdirs work dir
    request = TuneRequest("Qwen/Qwen3-30B-A3B", ServerFlags(tp=2, moe_runner_backend="flashinfer_cutlass"), arch="sm90",
                          flashinfer_version="0.7.2.post1")
    return request.plan(tmp_path / "root")


def run(plan, monkeypatch, mode="ok", gpus=2, **kw):
    monkeypatch.setenv("FAKE_WORKER_MODE", mode)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    return warm(plan, gpus=gpus, gpu_info=H200, pool=WorkerPool(gpus, argv=FAKE), **kw)


def test_split_merge_commit(plan, monkeypatch):
    seen = []
    r = run(plan, monkeypatch, progress=lambda done, total, what, phase: seen.append((done, total)))
    assert r.status == "written" and r.profiles_tuned == r.profiles_total == 42 and r.gpus == 2
    datas = {Path(p).read_bytes() for p in r.rank_files}
    assert len(datas) == 1 and len(r.rank_files) == 2  # byte-identical across the TP group
    entries = {k for k in json.loads(datas.pop()) if k not in RESERVED_KEYS}
    assert len(entries) == 42  # both workers' disjoint buckets merged
    assert seen[-1] == (42, 42)
    (entry,) = scan_cache(plan.cache_root).entries
    assert entry.status == "complete" and entry.manifest.stats["gpus"] == 2
    # the typed request, resolved, is what verify replays
    assert TuneRequest.from_dict(entry.manifest.request) == replace(plan.request)
    assert entry.manifest.request["flags"]["moe_runner_backend"] == "flashinfer_cutlass"
    again = run(plan, monkeypatch)
    assert again.status == "complete"


def test_work_is_dealt_to_whichever_worker_is_free(plan, monkeypatch, tmp_path):
    """Worker 0 takes 1 s an item, worker 1 none: the dynamic queue hands worker 1 the rest,
    where a static half-and-half split would make the run wait on worker 0."""
    log = tmp_path / "items.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    r = run(plan, monkeypatch, mode="slow-on-0")
    assert r.status == "written" and r.profiles_tuned == 42
    items = [line.split() for line in log.read_text().splitlines()]
    by_device = {d: [int(b) for dev, _, b in items if dev == d] for d in ("0", "1")}
    assert sorted(by_device["0"] + by_device["1"]) == sorted(plan.workloads[0].ops[0].buckets)  # each once
    # a static split would give each 10-11 of the 21; the slack (3) is for a slow CI machine
    assert len(by_device["0"]) <= 3 and len(by_device["1"]) >= 18
    assert by_device["0"][0] == max(by_device["0"] + by_device["1"])  # largest bucket dealt first


@pytest.mark.parametrize("mode,needle", [("oom", r"while tuning moe.experts at \d+ tokens: out of GPU memory"),
                                         ("crash", r"stopped \(killed by SIGKILL\) while tuning moe.experts at")])
def test_failing_worker_names_op_and_bucket_and_writes_nothing(plan, monkeypatch, mode, needle):
    with pytest.raises(FiAutotuneError, match=needle) as e:
        run(plan, monkeypatch, mode=mode)
    assert "nothing was written" in str(e.value)
    assert not scan_cache(plan.cache_root).entries


def test_resume_after_a_killed_worker_tunes_only_what_is_left(plan, monkeypatch):
    with pytest.raises(FiAutotuneError, match=r"stopped \(killed by SIGKILL\)"):
        run(plan, monkeypatch, mode="crash-after-3", gpus=1)
    assert not scan_cache(plan.cache_root).entries
    r = run(plan, monkeypatch, gpus=2)
    assert (r.profiles_total, r.profiles_tuned) == (42, 42 - 3 * 2)  # 3 buckets x (gemm1, gemm2) kept
    entries = {k for k in json.loads(Path(r.rank_files[0]).read_bytes()) if k not in RESERVED_KEYS}
    assert len(entries) == 42
    forced = run(plan, monkeypatch, gpus=2, force=True)
    assert forced.profiles_tuned == 42  # --force starts from nothing


def test_mixed_metadata_is_refused(plan, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER_MODE", "ok")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    # worker 1 reports another GPU model in its files' _metadata
    argv = [sys.executable, "-c", "import os,sys,runpy; os.environ['FAKE_GPU']='NVIDIA H100 80GB HBM3' if os.environ['CUDA_VISIBLE_DEVICES']=='1' else 'NVIDIA H200'; sys.argv=['w']; runpy.run_path(%r, run_name='__main__')" % str(REPO / "tests" / "standins" / "fake_worker.py")]
    with pytest.raises(FiAutotuneError, match="different environments"):
        warm(plan, gpus=2, gpu_info=H200, pool=WorkerPool(2, argv=argv))
    assert not scan_cache(plan.cache_root).entries


def test_usage_errors_before_any_work(plan):
    with pytest.raises(UsageError, match="no CUDA GPU"):
        warm(plan, gpu_info=GpuInfo(0, None, ()))
    with pytest.raises(UsageError, match="targets sm90 but this machine's GPUs are sm100"):
        warm(plan, gpu_info=GpuInfo(1, "sm100", ("NVIDIA B200",)))
    with pytest.raises(UsageError, match="--gpus 3"):
        warm(plan, gpus=3, gpu_info=H200)
    nothing = replace(plan, workloads=tuple(replace(w, ops=()) for w in plan.workloads))
    assert warm(nothing, gpu_info=H200).status == "nothing-to-tune"


def test_warm_refuses_to_replace_another_gpu_models_entry(plan, monkeypatch):
    """An H100 cache sits at the sm90 path this H200 machine would write: refused before any
    tuning unless --force, saying why."""
    fields = plan.resolution.key_fields
    write_fake_entry(plan.cache_root, fields=fields, arch="sm90", metadata={"gpu": "NVIDIA H100 80GB HBM3"})
    with pytest.raises(FiAutotuneError, match="holds a cache tuned on NVIDIA H100 80GB HBM3, not NVIDIA H200.*--force"):
        run(plan, monkeypatch)
    assert scan_cache(plan.cache_root).entries[0].gpu == "NVIDIA H100 80GB HBM3"
    r = run(plan, monkeypatch, force=True)
    assert r.status == "written" and scan_cache(plan.cache_root).entries[0].gpu == "NVIDIA H200"


def test_a_second_warm_of_the_same_target_is_refused_while_one_runs(plan, monkeypatch):
    """Two warms of one target into one root would take each other's finished buckets (and delete
    the work dir under each other): the second is refused, nothing is written by it. Another
    root is another work dir."""
    import subprocess

    from autotune_cache.errors import EntryLocked
    from autotune_cache.tune.careful.workdir import work_dir

    wd = work_dir(plan)
    wd.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"), str(wd.parent / f"{wd.name}.lock")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(EntryLocked, match="another warm is tuning this target"):
            run(plan, monkeypatch)
        assert not scan_cache(plan.cache_root).entries
        other = replace(plan, cache_root=plan.cache_root.parent / "other-root")
        assert work_dir(other) != wd
    finally:
        holder.kill()
        holder.wait()
    assert run(plan, monkeypatch).status == "written"
