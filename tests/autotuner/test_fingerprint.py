"""Our staleness verdict against FlashInfer's own ``_classify_metadata_mismatches``, case by case.

FlashInfer imports without a GPU, so its function is the oracle here: where the target's value
is known, we reject exactly what FlashInfer rejects; where it is unknown, we claim nothing and
say "unknown" instead (FlashInfer would reject, but a field the fingerprint could not read is
no ground to delete a cache).
"""

from __future__ import annotations

import itertools
import json
import shutil

import pytest

from autotune_cache.errors import UsageError
from autotune_cache.autotuner.fingerprint import FIELDS, Fingerprint
from devtools.synthetic import DEFAULT_METADATA

from ..support.lazy import importorskip_lazily

flashinfer_autotuner = importorskip_lazily("flashinfer.autotuner.autotuner")

VALUES = ["13.0", "12.9", "unknown", None, "None", "*", "missing"]


def _saved(value) -> dict:
    d = dict(DEFAULT_METADATA)
    if value == "missing":
        del d["cuda_version"]
    else:
        d["cuda_version"] = value
    return d


@pytest.mark.parametrize("saved,target", list(itertools.product(VALUES, ["13.0", "unknown", "None"])))
def test_verdict_matches_flashinfer(saved, target):
    current = {**DEFAULT_METADATA, "cuda_version": target}
    hard, soft = flashinfer_autotuner._classify_metadata_mismatches(_saved(saved), current)
    theirs = set(hard) | set(soft)
    verdict = Fingerprint(current, "test").compare(_saved(saved))
    ours, unknown = set(verdict.mismatched), set(verdict.unknown)
    assert ours <= theirs  # never stale where FlashInfer would load the file
    if target == "13.0":
        assert ours == theirs and not unknown  # a known target: exactly FlashInfer's verdict
    else:
        assert ours | unknown == theirs and not ours  # an unknown target: only "cannot tell"


def test_no_metadata_is_loaded_unchecked_as_in_flashinfer():
    fp = Fingerprint(dict(DEFAULT_METADATA), "test")
    assert not fp.compare({}).stale and not fp.compare(None).stale
    # a corrupt (non-object) _metadata counts as every field missing, as in FlashInfer
    hard, soft = flashinfer_autotuner._classify_metadata_mismatches("junk", DEFAULT_METADATA)
    assert set(fp.compare("junk").mismatched) == set(hard) | set(soft) == set(FIELDS)


def test_fields_are_flashinfers():
    meta = flashinfer_autotuner._collect_metadata()
    assert tuple(meta) == FIELDS


def test_load_accepts_env_output_rank_files_and_plain_objects(tmp_path):
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"format": 1, "tool": "fi-autotune env", "fingerprint": DEFAULT_METADATA, "arch": "sm90"}))
    assert Fingerprint.load(env).fields == DEFAULT_METADATA and Fingerprint.load(env).arch == "sm90"
    rank = tmp_path / "rank.json"
    rank.write_text(json.dumps({"_metadata": DEFAULT_METADATA, "k": ["R", 1]}))
    assert Fingerprint.load(rank).fields == DEFAULT_METADATA
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(DEFAULT_METADATA))
    assert Fingerprint.load(plain).has_gpu
    for bad, needle in (("[1]", "not a fingerprint"), ("{", "not JSON"), ('{"gpu": "x"}', "lacks"),
                        ('{"format": 9, "fingerprint": {}}', "newer")):
        p = tmp_path / "bad.json"
        p.write_text(bad)
        with pytest.raises(UsageError, match=needle):
            Fingerprint.load(p)
    with pytest.raises(UsageError, match="No such file"):
        Fingerprint.load(tmp_path / "absent.json")


def test_a_host_where_cuda_can_reach_no_device_is_gpu_less_without_asking_flashinfer(tmp_path, monkeypatch):
    """``ls --check-env`` / ``prune --status stale`` on a GPU-less host: no device node (the NVIDIA
    driver's, WSL's, Jetson's, ROCm's) and no NVIDIA display controller on the PCI bus means torch
    sees no GPU, which is all FlashInfer's fingerprint would say there (tests/cli/test_cli.py checks
    that against the real one). Where any of them is, or on another OS, FlashInfer is asked (a GPU
    cannot exist here: a stand-in ``this_host`` records that it was). The real patterns are used,
    under a stand-in root."""
    from autotune_cache.autotuner import fingerprint as fpmod

    on_gpu = Fingerprint(dict(DEFAULT_METADATA), "this host", "sm90")
    asked = []
    monkeypatch.setattr(fpmod, "this_host", lambda: asked.append(1) or on_gpu)
    monkeypatch.setattr(fpmod, "CUDA_DEVICE_PATHS", tuple(str(tmp_path) + p for p in fpmod.CUDA_DEVICE_PATHS))
    bus = tmp_path / "sys" / "bus" / "pci" / "devices"
    monkeypatch.setattr(fpmod, "PCI_DEVICES", str(bus))
    monkeypatch.setattr(fpmod.sys, "platform", "linux")
    (tmp_path / "dev").mkdir()
    (tmp_path / "proc" / "driver").mkdir(parents=True)

    def pci(name: str, vendor: str, cls: str) -> None:
        (bus / name).mkdir(parents=True)
        (bus / name / "vendor").write_text(vendor + "\n")
        (bus / name / "class").write_text(cls + "\n")

    pci("0000:00:01.0", "0x8086", "0x060000")  # a host bridge
    pci("0000:00:1f.3", "0x10de", "0x040300")  # NVIDIA, but audio
    assert fpmod.fingerprint_for_staleness(None, required=False) is None
    with pytest.raises(UsageError, match="this host has no GPU"):
        fpmod.fingerprint_for_staleness(None, required=True)
    assert not asked
    for node in ("dev/nvidiactl", "dev/nvidia3", "proc/driver/nvidia", "dev/dxg", "dev/nvhost-ctrl-gpu",
                 "dev/nvgpu/igpu0/ctrl", "dev/nvmap", "dev/kfd"):
        (tmp_path / node).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / node).touch()
        assert fpmod.fingerprint_for_staleness(None, required=True) is on_gpu and asked == [1], node
        asked.clear()
        (tmp_path / node).unlink()
        if node.startswith("dev/nvgpu/"):
            shutil.rmtree(tmp_path / "dev" / "nvgpu")
    pci("0000:41:00.0", "0x10de", "0x030200")  # an NVIDIA 3D controller whose driver is not loaded yet
    assert fpmod.fingerprint_for_staleness(None, required=True) is on_gpu and asked == [1]
    asked.clear()
    (bus / "0000:41:00.0" / "vendor").unlink()  # a device that cannot be read might be one
    assert fpmod.fingerprint_for_staleness(None, required=True) is on_gpu and asked == [1]
    shutil.rmtree(bus / "0000:41:00.0")
    assert fpmod.fingerprint_for_staleness(None, required=False) is None and asked == [1]
    monkeypatch.setattr(fpmod, "PCI_DEVICES", str(tmp_path / "no-sysfs"))  # no view of the bus
    assert fpmod.fingerprint_for_staleness(None, required=True) is on_gpu and asked == [1, 1]
    monkeypatch.setattr(fpmod, "PCI_DEVICES", str(bus))
    # a device node, but FlashInfer reads no GPU (CUDA_VISIBLE_DEVICES="", a driver that fails): still refused
    (tmp_path / "dev" / "nvidiactl").touch()
    monkeypatch.setattr(fpmod, "this_host", lambda: asked.append(2) or Fingerprint({**DEFAULT_METADATA, "gpu": "unknown"}, "this host"))
    asked.clear()
    with pytest.raises(UsageError, match="this host has no GPU"):
        fpmod.fingerprint_for_staleness(None, required=True)
    assert fpmod.fingerprint_for_staleness(None, required=False) is None and asked == [2, 2]
    monkeypatch.setattr(fpmod, "this_host", lambda: asked.append(3) or on_gpu)
    (tmp_path / "dev" / "nvidiactl").unlink()
    monkeypatch.setattr(fpmod.sys, "platform", "win32")
    assert fpmod.fingerprint_for_staleness(None, required=True) is on_gpu and asked == [2, 2, 3]
