"""Which FlashInfer kernel modules a worker loads, and how (tune/workers/kernel_modules.py), and
what the warm's timings make of them (session/timings.py). The wrapped method is FlashInfer's own
``JitSpec.build_and_load`` (the lock, the AOT fast path and the build call are FlashInfer's); the
specs are subclasses of its real ``JitSpec`` whose artefacts are files in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune_cache.tune.session.timings import compiling_s, kernel_modules, worker_timings

from ...support.lazy import importorskip_lazily

core = importorskip_lazily("flashinfer.jit.core")


def spec_class():
    class FileSpec(core.JitSpec):
        """A module whose library is one file: prebuilt (AOT), built earlier, or built on load."""

        def __init__(self, name: str, root: Path, aot: bool = False):
            self.name, self.root, self.is_aot, self.builds = name, root, aot, 0

        @property
        def lock_path(self) -> Path:
            return self.root / f"{self.name}.lock"

        @property
        def is_compiled(self) -> bool:
            return self.get_library_path().exists()

        def get_library_path(self) -> Path:
            return self.root / f"{self.name}.so"

        def try_load(self):
            return f"aot:{self.name}" if self.is_aot else None

        def build(self) -> None:
            self.builds += 1
            self.get_library_path().write_text("built")

        def load(self):
            return f"jit:{self.name}"

    return FileSpec


@pytest.fixture
def watched(monkeypatch):
    """The watcher installed on FlashInfer's JitSpec for one test, then taken off again."""
    from autotune_cache.tune.workers import kernel_modules as km

    monkeypatch.setattr(core.JitSpec, "build_and_load", core.JitSpec.build_and_load)
    monkeypatch.setattr(km, "_listener", {})
    return km


def test_each_module_is_reported_once_with_how_it_was_loaded_and_the_op_that_asked(watched, tmp_path):
    events, op = [], ["layers.0.mlp"]
    watched.watch(lambda event, **f: events.append({"event": event, **f}), lambda: op[0])
    FileSpec = spec_class()
    (tmp_path / "gemm.so").write_text("from an earlier warm")
    moe, gemm, aot = FileSpec("fused_moe_90", tmp_path), FileSpec("gemm", tmp_path), FileSpec("norm", tmp_path, aot=True)
    assert moe.build_and_load() == "jit:fused_moe_90" and moe.builds == 1
    op[0] = "layers.0.self_attn.o_proj"
    assert gemm.build_and_load() == "jit:gemm" and aot.build_and_load() == "aot:norm"
    assert moe.build_and_load() == "jit:fused_moe_90"  # loaded again: not reported again
    assert [(e["module"], e["how"], e["op"]) for e in events] == [
        ("fused_moe_90", "compiled", "layers.0.mlp"), ("gemm", "cached", "layers.0.self_attn.o_proj"),
        ("norm", "prebuilt", "layers.0.self_attn.o_proj")]
    assert all(e["event"] == "module" and e["seconds"] >= 0 for e in events)


def test_a_served_workers_next_session_reports_to_its_own_listener_without_wrapping_twice(watched, tmp_path):
    first, second = [], []
    watched.watch(lambda event, **f: first.append(f), lambda: "a")
    wrapped = core.JitSpec.build_and_load
    watched.watch(lambda event, **f: second.append(f), lambda: "b")
    assert core.JitSpec.build_and_load is wrapped
    spec_class()("sampling", tmp_path).build_and_load()
    assert first == [] and [(e["module"], e["op"]) for e in second] == [("sampling", "b")]


def test_a_spec_that_cannot_say_is_unknown_not_guessed():
    from autotune_cache.tune.workers.kernel_modules import how_loaded

    class Opaque:
        @property
        def is_compiled(self):
            raise NotImplementedError

    assert how_loaded(Opaque()) == "unknown"


def ev(worker, module, how, seconds, op="moe"):
    return {"event": "module", "worker": worker, "module": module, "how": how, "seconds": seconds, "op": op, "t": 1.0}


def test_timings_name_each_module_slowest_first_and_the_compile_time_of_the_slowest_worker():
    # GPU 0 compiles the MoE module (30 s); GPU 1 waits on it under FlashInfer's lock (29 s) and
    # finds the GEMM module built earlier; both compile the norm module (2 s each, in turn).
    events = [ev(0, "fused_moe_90", "compiled", 30.0), ev(1, "fused_moe_90", "compiled", 29.0),
              ev(0, "gemm", "cached", 0.4, "qkv"), ev(1, "gemm", "cached", 0.3, "qkv"),
              ev(0, "norm", "compiled", 2.0), ev(1, "norm", "cached", 0.1)]
    rows = kernel_modules(events)
    assert [(r["module"], r["how"], r["seconds"], r["workers"]) for r in rows] == [
        ("fused_moe_90", "compiled", 30.0, 2), ("norm", "compiled", 2.0, 2), ("gemm", "cached", 0.4, 2)]
    assert compiling_s(events) == 32.0  # GPU 0: 30 + 2; GPU 1: 29 + 0.1
    assert compiling_s([ev(0, "gemm", "cached", 0.4)]) == 0.0
    t = worker_timings(events + [{"event": "finished", "worker": 0, "tune_s": 1.0, "jit_s": 33.0, "peak_mem": 0}],
                       0.0, 40.0)
    assert t["compiling_s"] == 32.0 and t["kernel_modules"] == rows


# --- what a plan says a warm will compile (autotuner/jit_modules.py) --------------------------------

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

from autotune_cache.autotuner import jit_modules as jm  # noqa: E402

from tests.conftest import run_cli, run_json  # noqa: E402

DENSE = ["--model", "nvidia/Llama-3.1-70B-Instruct-FP8", "--tp", "4", "--arch", "sm90"]


def flashinfer_library_paths(env: dict) -> dict:
    """FlashInfer's own idea of where each module's JIT library lives, from its real specs (CPU)."""
    code = ("import json; from flashinfer.jit.gemm import gen_gemm_module as g; "
            "from flashinfer.jit.tllm_utils import gen_trtllm_utils_module as t; "
            "print(json.dumps({s.name: str(s.get_library_path()) for s in (g(), t())}))")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_jit_library_we_look_for_is_where_flashinfer_puts_it(tmp_path, monkeypatch):
    """FlashInfer's own specs (one interpreter: importing FlashInfer costs seconds) against ours for
    each way the arch may be given: the list as FlashInfer normalises it, already suffixed, or
    absent (the plan's arch, as FlashInfer names a 9.x GPU)."""
    theirs = flashinfer_library_paths({"FLASHINFER_WORKSPACE_BASE": str(tmp_path), "FLASHINFER_CUDA_ARCH_LIST": "9.0"})
    assert set(theirs) == {"gemm", "trtllm_utils"}
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    for arch_list in ("9.0", "9.0a", None):
        if arch_list is None:
            monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST")
        else:
            monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", arch_list)
        assert {n: str(jm.jit_library(n, "0.7.2.post1", "sm90")) for n in theirs} == theirs, arch_list


def test_a_module_is_compiled_cached_or_prebuilt_as_the_disk_says(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST", raising=False)
    plan = jm.module_plan(["flashinfer.bmm_fp8", "flashinfer.bmm_fp8"], "0.7.2.post1", "sm90")
    assert [(n.name, n.state, n.apis) for n in plan.needs] == [
        ("trtllm_utils", "compile", ()), ("gemm", "compile", ("flashinfer.bmm_fp8",))]
    assert plan.compile_s == round(jm.COMPILE_S["gemm"] + jm.COMPILE_S["trtllm_utils"], 1)
    lib = jm.jit_library("gemm", "0.7.2.post1", "sm90")
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF")
    plan = jm.module_plan(["flashinfer.bmm_fp8"], "0.7.2.post1", "sm90")
    assert {n.name: n.state for n in plan.needs} == {"trtllm_utils": "compile", "gemm": "cached"}
    assert plan.compile_s == jm.COMPILE_S["trtllm_utils"]
    aot = tmp_path / "flashinfer" / "data" / "aot" / "trtllm_utils" / "trtllm_utils.so"
    aot.parent.mkdir(parents=True)
    aot.write_bytes(b"\x7fELF")
    monkeypatch.setattr(jm, "aot_library", lambda name: tmp_path / "flashinfer" / "data" / "aot" / name / f"{name}.so")
    assert jm.state_of("trtllm_utils", "0.7.2.post1", "sm90") == "prebuilt"


def test_an_api_no_run_recorded_is_said_not_guessed():
    plan = jm.module_plan(["flashinfer.fused_moe.trtllm_fp8_block_scale_moe"], "0.7.2.post1", "sm100")
    assert plan.needs == () and plan.unrecorded == ("flashinfer.fused_moe.trtllm_fp8_block_scale_moe",)
    assert plan.describe() == "not recorded for flashinfer.fused_moe.trtllm_fp8_block_scale_moe"
    assert jm.module_plan(["flashinfer.bmm_fp8", "flashinfer.new_op"], "0.7.2.post1", "sm90").unrecorded == (
        "flashinfer.new_op",)


def test_plan_names_the_modules_a_warm_will_compile(tmp_path):
    env = {"FLASHINFER_WORKSPACE_BASE": str(tmp_path)}
    doc = run_json("plan", *DENSE, env=env)
    km = doc["workers"][0]["kernel_modules"]
    assert [(m["module"], m["state"]) for m in km["modules"]] == [("trtllm_utils", "compile"), ("gemm", "compile")]
    assert km["expected_compile_s"] > 30 and km["unrecorded_apis"] == []
    lib = tmp_path / ".cache/flashinfer/0.7.2.post1/90a/cached_ops/gemm/gemm.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF")
    doc = run_json("plan", *DENSE, env=env)
    assert {m["module"]: m["state"] for m in doc["workers"][0]["kernel_modules"]["modules"]}["gemm"] == "cached"


def test_prebuild_starts_what_must_be_compiled_in_threads_and_reports_it_as_prebuild(watched, tmp_path, monkeypatch):
    FileSpec = spec_class()
    gate = threading.Event()
    specs = {}

    class Slow(FileSpec):
        def build(self):
            gate.wait(10)
            super().build()

    def gen(name):
        return specs.setdefault(name, Slow(name, tmp_path))

    mod = type(sys)("fake_gen")
    mod.gemm, mod.trtllm_utils = (lambda: gen("gemm")), (lambda: gen("trtllm_utils"))
    monkeypatch.setitem(sys.modules, "fake_gen", mod)
    monkeypatch.setattr(watched, "SPECS", {"gemm": "fake_gen:gemm", "trtllm_utils": "fake_gen:trtllm_utils"})
    monkeypatch.setattr(watched, "module_plan", lambda apis, v, a: jm.ModulePlan(tuple(
        jm.ModuleNeed(n, s, None, ()) for n, s in (("gemm", "compile"), ("trtllm_utils", "cached"))), ()))
    events = []
    watched.watch(lambda event, **f: events.append({"event": event, **f}), lambda: "layers.0")
    assert watched.prebuild(["flashinfer.bmm_fp8"], "0.7.2.post1", "sm90") == ["gemm"]  # the cached one is left
    assert events == []  # building, in its own thread
    gate.set()
    for t in [t for t in threading.enumerate() if t.name.startswith("prebuild-")]:
        t.join(10)
    assert [(e["module"], e["how"], e["op"]) for e in events] == [("gemm", "compiled", "prebuild")]
    assert specs["gemm"].builds == 1 and "trtllm_utils" not in specs


def test_an_arch_list_flashinfer_would_refuse_makes_the_state_unknown_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "junk")
    plan = jm.module_plan(["flashinfer.bmm_fp8"], "0.7.2.post1", "sm90")
    assert {n.name: n.state for n in plan.needs} == {"trtllm_utils": "unknown", "gemm": "unknown"}
    assert plan.compile_s == 0 and "gemm (unknown)" in plan.describe()
    proc = run_cli("plan", *DENSE, env={"FLASHINFER_WORKSPACE_BASE": str(tmp_path), "FLASHINFER_CUDA_ARCH_LIST": "junk"})
    assert proc.returncode == 0 and "Kernels     trtllm_utils (unknown), gemm (unknown)" in proc.stdout, proc.stderr
