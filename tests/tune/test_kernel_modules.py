"""Which FlashInfer kernel modules a worker loads, and how (tune/workers/kernel_modules.py), and
what the warm's timings make of them (session/timings.py). The wrapped method is FlashInfer's own
``JitSpec.build_and_load`` (the lock, the AOT fast path and the build call are FlashInfer's); the
specs are subclasses of its real ``JitSpec`` whose artefacts are files in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune_cache.tune.session.timings import compiling_s, kernel_modules, worker_timings

core = pytest.importorskip("flashinfer.jit.core")


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
