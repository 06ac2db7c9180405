"""Which FlashInfer kernel modules a warm loads, and whether this machine has each one built.

A fresh machine's first warm is mostly compilation (issue 47, docs/results/first_warm_*.json: the
README's FP8 example spent 36 of 48 s compiling ``gemm`` and ``trtllm_utils``), and the engine's
own boot pays the same builds. FlashInfer 0.7.2.post1 finds a module in one of three places:
an AOT library in its own package (``flashinfer/data/aot/<name>/<name>.so``), one in a
``flashinfer-jit-cache`` package of exactly its version (not on PyPI for 0.7.2.post1: hosted on
flashinfer.ai only, ``flashinfer download-kernels``), or its JIT workspace
(``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<arch>/cached_ops/<name>/<name>.so``,
the base defaulting to the home directory); anything else is compiled on first use.

The table below is recorded from real warms (the worker reports each module it loads,
``tune/workers/kernel_modules.py``): per FlashInfer version and arch, the modules each API
loads, the autotuner's own (its stream-delay kernel) under ``"*"``. An API that no recorded run
called is reported as not recorded, never guessed. Read from disk without importing FlashInfer
(``plan`` must stay a CPU command with no CUDA).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

#: (FlashInfer version, arch) -> API -> modules it loads ("*": every warm, the autotuner's own).
#: Recorded on an H200 (benchmarks/first_warm.py, 2026-11-27); sm100 not yet run on Blackwell.
MODULES: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {
    ("0.7.2.post1", "sm90"): {
        "*": ("trtllm_utils",),
        "flashinfer.bmm_fp8": ("gemm",),
        "flashinfer.fused_moe.cutlass_fused_moe": ("fused_moe_90",),
    },
}

#: Seconds each module took to compile in a recorded run (H200 machine, 16 CPU cores,
#: MAX_JOBS=16): what a warm will spend on it where it is neither prebuilt nor cached.
#: fused_moe_90 was prebuilt in every recorded run (its compile time is not measured).
COMPILE_S: dict[str, float] = {"gemm": 29.4, "trtllm_utils": 7.4}

#: The FlashInfer functions that return each module's build spec (a ``JitSpec``), for workers
#: that start the builds a plan needs before the first op asks (``tune/workers/kernel_modules``).
#: Only argument-less ones, built exactly as the op's own call builds them (fused_moe_90's spec
#: takes the caller's ``use_fast_build``: left to the op).
SPECS: dict[str, str] = {
    "gemm": "flashinfer.jit.gemm:gen_gemm_module",
    "trtllm_utils": "flashinfer.jit.tllm_utils:gen_trtllm_utils_module",
}


@dataclass(frozen=True)
class ModuleNeed:
    """One module a warm will load: ``prebuilt``, ``cached`` (built here before), ``compile``, or
    ``unknown`` (``FLASHINFER_CUDA_ARCH_LIST`` is not one FlashInfer would take)."""

    name: str
    state: str
    compile_s: float | None  # the recorded compile seconds, where it will be compiled
    apis: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"module": self.name, "state": self.state, "compile_s": self.compile_s, "apis": list(self.apis)}


@dataclass(frozen=True)
class ModulePlan:
    needs: tuple[ModuleNeed, ...]
    unrecorded: tuple[str, ...]  # APIs of the plan whose modules no recorded run names

    @property
    def compile_s(self) -> float:
        return round(sum(n.compile_s or 0.0 for n in self.needs if n.state == "compile"), 1)

    def to_dict(self) -> dict:
        return {"modules": [n.to_dict() for n in self.needs], "unrecorded_apis": list(self.unrecorded),
                "expected_compile_s": self.compile_s}

    def describe(self) -> str:
        """One line for ``plan``: what a warm here will compile, and for how long."""
        if not self.needs and not self.unrecorded:
            return "none recorded for this FlashInfer version and arch"

        def state(n: ModuleNeed) -> str:
            if n.state != "compile":
                return n.state
            return f"compile, about {n.compile_s:.0f} s" if n.compile_s else "compile, time not recorded"

        parts = [", ".join(f"{n.name} ({state(n)})" for n in self.needs)] if self.needs else []
        if any(n.state == "compile" and n.compile_s for n in self.needs):
            parts.append(f"about {self.compile_s:.0f} s of compiling (16 CPU cores) before or during the first profiles")
        if self.unrecorded:
            parts.append(f"not recorded for {', '.join(self.unrecorded)}")
        return "; ".join(parts)


def _arch_dir(arch: str) -> str | None:
    """FlashInfer's workspace arch directory: ``FLASHINFER_CUDA_ARCH_LIST`` as it normalises it,
    else the plan's arch (``sm90`` -> ``90a``; 9.x and 10+ take the ``a`` suffix). None for a list
    FlashInfer itself would refuse (``9.0`` pairs only): where it builds is then unknown."""
    listed = os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
    if listed:
        out = []
        for item in sorted(listed.split()):
            major, _, minor = item.partition(".")
            if not major.isdigit() or not minor[:1].isdigit():
                return None
            out.append(major + (minor if minor[-1:].isalpha() or int(major) < 9 else minor + "a"))
        return "_".join(out)
    digits = arch.removeprefix("sm")
    return digits + ("a" if int(digits[:-1] or 0) >= 9 else "")


def jit_library(name: str, version: str, arch: str) -> Path | None:
    arch_dir = _arch_dir(arch)
    if arch_dir is None:
        return None
    base = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE") or Path.home())
    return base / ".cache" / "flashinfer" / version / arch_dir / "cached_ops" / name / f"{name}.so"


def aot_library(name: str) -> Path | None:
    spec = importlib.util.find_spec("flashinfer")  # the package's location; __init__ is not run
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "aot" / name / f"{name}.so"


def state_of(name: str, version: str, arch: str) -> str:
    aot = aot_library(name)
    if aot is not None and aot.exists():
        return "prebuilt"
    lib = jit_library(name, version, arch)
    if lib is None:
        return "unknown"
    return "cached" if lib.exists() else "compile"


def module_plan(apis, version: str, arch: str) -> ModulePlan:
    """The modules a warm of these APIs loads on this machine, each with its state."""
    table = MODULES.get((version, arch))
    apis = tuple(dict.fromkeys(apis))
    if table is None:
        return ModulePlan((), apis)
    wanted: dict[str, list[str]] = {name: ["*"] for name in table.get("*", ())}
    unrecorded = []
    for api in apis:
        if api not in table:
            unrecorded.append(api)
        for name in table.get(api, ()):
            wanted.setdefault(name, []).append(api)
    needs = []
    for name, by in wanted.items():
        state = state_of(name, version, arch)
        needs.append(ModuleNeed(name, state, COMPILE_S.get(name) if state == "compile" else None,
                                tuple(a for a in by if a != "*")))
    return ModulePlan(tuple(needs), tuple(unrecorded))
