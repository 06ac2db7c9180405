"""Which FlashInfer kernel modules a worker loads, and how each came to be loaded.

A fresh machine's first warm is mostly compilation (issue 47: 37.6 s of a worker's JIT on a
freshly started machine, 1.4 s minutes later). To say which module costs what, every module
FlashInfer loads passes through ``JitSpec.build_and_load`` (FlashInfer 0.7's one template for
nvcc and CuTe-DSL modules alike: AOT fast path, cross-process lock, build, load). This wraps it
once per process and reports, per module: its name, whether it was ``prebuilt`` (an AOT
artefact shipped in a package), ``cached`` (built before, in FlashInfer's JIT workspace: ninja
finds it up to date) or ``compiled`` (built now), the seconds it took (a wait on another
worker's build of the same module included: FlashInfer serialises builds with a file lock), and
the op being built or tuned when it was first asked for.

Worker-only (imports FlashInfer); the parent reads the events (``session/timings.py``).
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from typing import Callable

from autotune_cache.autotuner.jit_modules import SPECS, module_plan

#: The name prefix of the threads ``prebuild`` starts (their loads are reported as op "prebuild").
PREBUILD = "prebuild"

#: Where reports go, and who holds an op now: set by each ``watch`` (a served worker's sessions
#: each bring their own worker; the wrapper is installed once per process).
_listener: dict = {}


def how_loaded(spec) -> str:
    """``prebuilt``, ``cached`` or ``compiled``: decided before the load, from what is on disk
    (an AOT artefact, or the JIT workspace's library); ``unknown`` for a spec that says neither."""
    try:
        if getattr(spec, "is_aot", False):
            return "prebuilt"
        return "cached" if spec.is_compiled else "compiled"
    except Exception:  # noqa: BLE001 - a spec type this FlashInfer did not have: said, not guessed
        return "unknown"


def watch(emit: Callable[..., None], op_in_hand: Callable[[], str | None]) -> None:
    """Report each kernel module the first time this process loads it (``module`` events, to
    ``emit``, naming ``op_in_hand()``); a module loaded in an earlier session stays loaded and
    is not reported again."""
    from flashinfer.jit.core import JitSpec

    first = not _listener
    _listener.update(emit=emit, op=op_in_hand)
    if not first:
        return
    original = JitSpec.build_and_load
    seen: set[str] = set()

    def build_and_load(self):
        name = getattr(self, "name", type(self).__name__)
        if name in seen:
            return original(self)
        seen.add(name)
        how = how_loaded(self)
        t = time.perf_counter()
        try:
            return original(self)
        finally:
            op = PREBUILD if threading.current_thread().name.startswith(PREBUILD) else _listener["op"]()
            _listener["emit"]("module", module=name, how=how, seconds=round(time.perf_counter() - t, 3), op=op)

    JitSpec.build_and_load = build_and_load


def prebuild(apis, version: str, arch: str) -> list[str]:
    """Start compiling, each in a thread of its own, the modules these APIs load that this machine
    has neither prebuilt nor cached (``autotuner/jit_modules.py``): FlashInfer builds a module when
    an op first asks for it, one after another (the autotuner's own ``trtllm_utils`` only at the
    first profile); started together they overlap each other and the layer builds. An op that
    asks for a module being built waits on FlashInfer's own lock; a build that fails here is left
    to the op's call, which reports it. The names started."""
    started: list[str] = []
    if os.environ.get("FI_AUTOTUNE_PREBUILD") == "0":  # benchmarks/first_warm.py's side-by-side
        return started
    for need in module_plan(apis, version, arch).needs:
        if need.state != "compile" or need.name not in SPECS:
            continue
        module, _, fn = SPECS[need.name].partition(":")

        def build(module=module, fn=fn):
            try:
                getattr(importlib.import_module(module), fn)().build_and_load()
            except Exception:  # noqa: BLE001 - the op's own first call builds it again and says why
                pass

        threading.Thread(target=build, name=f"{PREBUILD}-{need.name}", daemon=True).start()
        started.append(need.name)
    return started


def prebuild_on(device, apis) -> list[str]:
    """``prebuild`` for the GPU ``device`` and the FlashInfer installed here."""
    import flashinfer
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return prebuild(apis, flashinfer.__version__, f"sm{major}{minor}")
