"""Which FlashInfer an engine release brings, and what a plan made with another FlashInfer says.

A stock SGLang 0.5.23 install has FlashInfer 0.7.2 (its wheel pins ``flashinfer_python[cu13]==0.7.2``),
vLLM 0.33.0 has 0.7.2.post1. The engine reads the cache under its own FlashInfer's version
directory, so a cache tuned here with the other one is never found. The pins are recorded from the
wheels (``tests/oracle/engine_pins.py`` -> ``tests/data/engine_flashinfer_pins.json``)."""

from __future__ import annotations

import json
import sys
import zipfile
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

import pytest

from autotune_cache import registry
from autotune_cache.engines.requests import build_request
from autotune_cache.engines.sglang.key_schemas import serving_release
from autotune_cache.plan.options import ServingOptions
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.request import TuneRequest
from devtools.synthetic import DEFAULT_METADATA, write_plan_entry

from ..conftest import REPO, run_cli
from ..support.fake_gpus import gpu_env, run_gpu_cli

GOLDEN = json.loads((REPO / "tests" / "data" / "engine_flashinfer_pins.json").read_text())
INSTALLED = version("flashinfer-python")  # the test extra pins 0.7.2.post1: vLLM 0.33.0's, not SGLang 0.5.23's
QWEN = ["--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass", "--arch", "sm90"]
SGLANG_NOTE = "SGLang 0.5.23 requires flashinfer-python==0.7.2 (its wheel's metadata)"

needs_post1 = pytest.mark.skipif(INSTALLED != "0.7.2.post1", reason=f"flashinfer-python {INSTALLED} installed, "
                                 "these cases read 0.7.2.post1 as the FlashInfer installed here")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_each_engines_pins_are_what_its_wheels_require(engine):
    recorded = {release: row["flashinfer"] for release, row in GOLDEN[engine].items()}
    assert registry.get_engine(engine).flashinfer_pins == recorded
    for row in GOLDEN[engine].values():  # the pin as the wheel spells it
        assert row["requires_dist"].replace("_", "-").split("==")[1] == row["flashinfer"]


def test_the_recorder_reads_an_exact_pin_from_a_wheels_metadata(tmp_path):
    sys.path.insert(0, str(REPO / "tests" / "oracle"))
    try:
        from engine_pins import requirement
    finally:
        sys.path.remove(str(REPO / "tests" / "oracle"))
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    meta = ("Metadata-Version: 2.1\nName: x\nRequires-Dist: flashinfer-cubin==9.9\n"
            "Requires-Dist: flashinfer_python[cu13]==0.7.2 ; extra == \"cu13\"\nRequires-Dist: torch\n")
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("x-1.0.dist-info/METADATA", meta)
    assert requirement(wheel) == ("flashinfer_python[cu13]==0.7.2 ; extra == \"cu13\"", "0.7.2")


@pytest.mark.parametrize("release,plan_version,noted", [
    ("0.5.23", "0.7.2.post1", True), ("0.5.23", "0.7.4", True),
    ("0.5.23", "0.7.2", False), ("0.5.23", "0.7.2+cu130", False),  # a local build of the pinned release
    ("0.5.20", "0.7.2.post1", False),  # its wheel's pin is not recorded: nothing said on a guess
    (None, "0.7.2.post1", False),
])
def test_sglangs_pin_note(release, plan_version, noted):
    note = registry.get_engine("sglang").pin_note(release, plan_version)
    assert (note is not None) == noted
    assert not noted or note.startswith(f"SGLang {release} requires flashinfer-python==0.7.2") \
        and f"this plan is for FlashInfer {plan_version}: a stock install does not use" in note


@needs_post1
def test_a_plan_on_the_installed_flashinfer_names_sglangs_pin_and_a_chosen_version_does_not():
    flags = ServerFlags(tp=2, moe_runner_backend="flashinfer_cutlass")
    defaulted = TuneRequest("Qwen/Qwen3-30B-A3B", flags, arch="sm90", engine_release="0.5.23").plan(Path("/nonexistent"))
    assert defaulted.flashinfer_version == "0.7.2.post1"
    assert sum(n.startswith(SGLANG_NOTE) for n in defaulted.version_warnings) == 1
    assert not any(n.startswith(SGLANG_NOTE) for n in defaulted.notes)  # said once, as a warning
    chosen = TuneRequest("Qwen/Qwen3-30B-A3B", flags, arch="sm90", engine_release="0.5.23",
                         flashinfer_version="0.7.2.post1").plan(Path("/nonexistent"))
    assert chosen.version_warnings == ()
    # a plan that tunes nothing (SGLang's default MoE runner on Hopper: no FlashInfer autotune) says nothing
    untuned = TuneRequest("Qwen/Qwen3-30B-A3B", ServerFlags(tp=2), arch="sm90", engine_release="0.5.23").plan(
        Path("/nonexistent"))
    assert not untuned.autotunes and untuned.version_warnings == ()


@needs_post1
def test_plan_says_it_for_sglang_and_not_for_vllm_or_flashinfers_own_store(tmp_path):
    env = {"HOME": str(tmp_path)}
    sglang = run_cli("plan", *QWEN, "--cache-dir", str(tmp_path), "--json", env=env)
    assert sglang.returncode == 0, sglang.stderr
    assert sum(n.startswith(SGLANG_NOTE) for n in json.loads(sglang.stdout)["workers"][0]["notes"]) == 1
    older = run_cli("plan", *QWEN, "--engine", "sglang==0.5.20", "--cache-dir", str(tmp_path), "--json", env=env)
    assert older.returncode == 0 and "requires flashinfer-python" not in older.stdout
    vllm = run_cli("plan", *[a if a != "2" else "1" for a in QWEN], "--layout", "vllm", "--cache-dir", str(tmp_path),
                   "--json", env=env)  # vLLM 0.33.0 pins the 0.7.2.post1 installed here
    assert vllm.returncode == 0 and "requires flashinfer-python" not in vllm.stdout, vllm.stderr


def test_the_release_that_serves_is_the_layouts_engines_and_flashinfers_own_store_has_none():
    options = ServingOptions(model="Qwen/Qwen3-30B-A3B", tp=2)
    assert build_request(options).engine_release == serving_release(None)  # sglang installed here, else 0.5.23
    assert build_request(replace(options, engine="sglang==0.5.20")).engine_release == "0.5.20"
    # --schema names a key schema, not a release, and overrides --engine (whatever it says)
    assert build_request(replace(options, schema="sglang-0.5.18")).engine_release is None
    assert build_request(replace(options, schema="sglang", engine="vllm==0.33.0")).engine_release is None
    assert build_request(options, layout="vllm").engine_release == "0.33.0"
    # the managed store is written from SGLang's calls, but read by whatever FlashInfer the server has
    store = build_request(options, layout="flashinfer-v2")
    assert store.engine.name == "sglang" and store.engine_release is None


@needs_post1
def test_check_without_the_serving_image_warns_and_with_it_does_not(root, tmp_path):
    req = TuneRequest("Qwen/Qwen3-30B-A3B", ServerFlags(tp=2, moe_runner_backend="flashinfer_cutlass"), arch="sm90",
                      flashinfer_version="0.7.2.post1")
    write_plan_entry(req.plan(root))
    proc = run_cli("check", *QWEN, "--cache-dir", str(root), "--strict", "--json")
    (report,) = json.loads(proc.stdout)["workers"]
    assert proc.returncode == 0 and report["found"], proc.stdout  # a warning: the image may have another FlashInfer
    assert sum(w.startswith(SGLANG_NOTE) for w in report["warnings"]) == 1
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"format": 1, "fingerprint": DEFAULT_METADATA, "arch": "sm90"}))
    proc = run_cli("check", *QWEN, "--cache-dir", str(root), "--strict", "--json", "--env-from", str(env))
    (report,) = json.loads(proc.stdout)["workers"]
    assert proc.returncode == 0 and report["warnings"] == [], report


@needs_post1
def test_warm_says_it_on_stderr_once_alone_and_once_for_a_fleet(tmp_path):
    """warm writes under the FlashInfer installed here: the one command that most needs to say it."""
    env = gpu_env(tmp_path)
    proc = run_gpu_cli("warm", *QWEN[:-2], "--cache-dir", str(tmp_path / "one"), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(f"fi-autotune: warning: {SGLANG_NOTE}") == 1, proc.stderr
    fleet = tmp_path / "targets.yaml"
    fleet.write_text("targets:\n"
                     "  - {name: a, model: Qwen/Qwen3-30B-A3B, tp: 2, moe_runner_backend: flashinfer_cutlass}\n"
                     "  - {name: b, model: Qwen/Qwen3-30B-A3B, tp: 1, moe_runner_backend: flashinfer_cutlass}\n")
    proc = run_gpu_cli("warm", "--targets", str(fleet), "--cache-dir", str(tmp_path / "fleet"), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(f"fi-autotune: warning: a, b: {SGLANG_NOTE}") == 1, proc.stderr
