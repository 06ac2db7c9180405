"""FlashInfer's own autotune cache keys for a FlashInfer API call, computed on a CPU-only machine.

    /work/oracle/bin/python tests/oracle/flashinfer_keys.py CALLS.json [--out OUT.json] [--id ID ...] [--verify]

CALLS.json is a list of calls::

    {"id": "...", "arch": "sm100" | "sm90" | ..., "api": "flashinfer.fused_moe.trtllm_fp8_block_scale_moe",
     "kwargs": {...}, "buckets": [1, 2, 4, ...] (optional), "tune_max": 8192 (optional)}

Tensors in ``kwargs`` are ``{"tensor": {"shape": [...], "dtype": "float8_e4m3fn",
"layout": "row_major" | "column_major"}}`` (autotune_cache/recipes.py ``T.to_dict()`` with
concrete shapes; "fill" is ignored: no value reaches a key), enums ``{"enum": qualname,
"value": int}`` (the value is checked), dtypes ``{"dtype": name}``; lists are decoded element-wise,
anything else is passed as is. ``buckets`` is passed as ``flashinfer.autotune(True,
tuning_buckets=buckets)``, otherwise the call runs under ``autotune(True)``; ``tune_max`` sets the
call's ``tune_max_num_tokens`` keyword argument.

Output (JSON list, one entry per call): ``keys``: one entry per optimization profile and
custom_op, ``{"custom_op", "bucket" (the profile's value of the dynamic dim), "candidates":
[{"runner", "file_key", "valid_tactics"}]}``; ``choose_one``: per AutoTuner.choose_one call the
runners, the caller's input shapes, the dynamic/constraint specs in force, the profiling policy,
``lookup_without_context`` (the nearest profile and keys a serving process without any autotune
context looks up for the caller's own shapes) and, with ``--verify``, the cross-check below;
``notes``; ``optional_stacks`` (package versions that decide which runners exist).

What runs is FlashInfer 0.7.2.post1's own code: the public API function, its argument checks,
its runner classes and ``TuningConfig`` objects, ``AutoTuner._apply_tuning_overrides``,
``_generate_optimization_profiles``, ``_prepare_input_tensors``, ``_get_cache_key``,
``_find_nearest_profile`` and every runner's ``get_cache_key_extras``. Replaced:

* ``AutoTuner.choose_one``, tune-mode branch: for every optimization profile it builds, with the
  methods above, the key each candidate runner would store if it won that profile (extras taken
  from the profile's synthesized tensors, as the real loop does), records them and returns
  ``(runners[0], -1)`` without profiling. The real method stores the winning runner's key only;
  which runner wins is a measurement, so all candidates are listed. ``valid_tactics`` says, where
  the runner's get_valid_tactics is plain Python, how many tactics it has for the profile (0: it
  can never win there, so its key is never written); null where that needs the kernel library.
* ``--verify`` additionally runs FlashInfer's *unmodified* ``choose_one`` once per runner, with
  profiling replaced by fixed timings that make that runner win every profile (and
  get_valid_tactics -> [0], forward -> no-op), and checks that the keys it stores in its
  in-memory cache are exactly the listed candidates.
* JIT modules: ``JitSpec.build_and_load`` returns a stand-in whose functions record the call and
  return a stub; nothing is compiled or launched. The stand-in's class is named ``Module``, the
  class ``tvm_ffi.load_module`` returns for a FlashInfer ``.so`` (asserted at start-up), because
  ``type(moe_op).__name__`` is the first element of the trtllm-gen MoE key's extras. The
  trtllm-gen spec generators that download cubin headers from the artifactory while *building
  the spec* are replaced by ones returning a stub spec (``_stub_artifact_spec_generators``).
* The GPU: ``fakegpu.install(arch)`` makes torch.cuda describe one B200 / H100, and tensors are
  meta-backed FakeTensors (``torch._subclasses.fake_tensor``) reporting device ``cuda:0``, so
  FlashInfer's ``device.type == "cuda"`` checks, ``device_support_pdl`` and
  ``get_compute_capability`` run unpatched. torch.cuda's device swap and current stream, which
  need a driver even for a fake tensor, are patched (``_install_patches``, each with its reason).

Not reproducible on CPU (see also ``notes`` in the output): which runner wins a profile; the
tactic lists that come from the kernel libraries (``valid_tactics`` null); ``type(moe_op)`` is
``_HeterogeneousAOTModule`` instead of ``Module`` only when a flashinfer-jit-cache install has
AOT providers that do not cover every target arch (then the trtllm-gen MoE keys differ).

The runner *set* depends on installed packages: the oracle venv needs nvidia-cutlass-dsl
(SGLang 0.5.23 pins nvidia-cutlass-dsl[cu13]==4.8.0) and nvidia-cudnn-frontend, as a serving
install has them; ``optional_stacks`` in the output records what was there.

Each call runs in a fresh interpreter (FlashInfer caches per process, e.g. cutlass
``MoERunner.refine_tuning_config`` is an lru_cache that sets a class attribute only on the first
call for a given ``tune_max_num_tokens``), so every call's keys are those of a fresh process
making that one call.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import subprocess
import sys
import traceback
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------------------------
# Worker: one call in this process
# ----------------------------------------------------------------------------------------------

class _Recorder:
    def __init__(self):
        self.choose_one_calls: list[dict] = []
        self.kernel_calls: list[str] = []
        self.notes: list[str] = []
        self.patches_hit: set[str] = set()

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


REC = _Recorder()
VERIFY = os.environ.get("FI_KEYS_VERIFY") == "1"


class _StubResult:
    """What a stubbed kernel/JIT function returns. Its repr is loud, so a stub value that leaked
    into a cache key would show up in the key string (the worker checks for it)."""

    def __init__(self, name: str):
        self._name = name

    def __repr__(self) -> str:
        return f"<STUB {self._name}>"

    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        return _StubFunction(f"{self._name}.{item}")

    def __call__(self, *args, **kwargs):
        REC.kernel_calls.append(self._name + "()")
        return _StubResult(self._name + "()")

    def __iter__(self):
        return iter(())

    def __getitem__(self, item):
        return _StubResult(f"{self._name}[{item!r}]")


class _StubFunction:
    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        REC.kernel_calls.append(self._name)
        return _StubResult(self._name + "()")

    def __repr__(self) -> str:
        return f"<STUB {self._name}>"


class Module:
    """Stand-in for a loaded FlashInfer JIT/AOT module. Named ``Module`` on purpose: that is
    ``type(tvm_ffi.load_module(path)).__name__`` (tvm_ffi.module.Module), and
    ``fused_moe/backends/trtllm/sm100_runner.py MoERunner.get_cache_key_extras`` puts
    ``type(self.moe_op).__name__`` into the key."""

    def __init__(self, spec_name: str):
        self._spec_name = spec_name

    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        return _StubFunction(f"{self._spec_name}.{item}")

    def __getitem__(self, item):
        return _StubFunction(f"{self._spec_name}[{item!r}]")

    def __repr__(self) -> str:
        return f"<STUB Module {self._spec_name}>"


def _install_patches(arch: str) -> None:
    sys.path.insert(0, HERE)
    import fakegpu

    facts = fakegpu.install(arch, count=1)
    REC.note(f"fake GPU: {facts['name']} capability {tuple(facts['capability'])} (tests/oracle/fakegpu.py)")

    import torch

    # torch.cuda.device(dev).__enter__/__exit__ swap the current device through the CUDA runtime,
    # which fails without a driver even for a fake cuda:0 tensor. cutlass_fused_moe wraps its
    # launch in `with torch.cuda.device(input.device)`. One fake device: nothing to swap.
    def _exchange_device(idx: int) -> int:
        REC.patches_hit.add("torch.cuda._exchange_device")
        return 0

    torch.cuda._exchange_device = _exchange_device
    torch.cuda._maybe_exchange_device = _exchange_device

    # Kernel launches read the current stream; without a driver torch.cuda.current_stream()
    # raises. Nothing is launched here, so a stand-in stream object is enough.
    class _FakeStream:
        cuda_stream = 0
        device = torch.device("cuda", 0)

        def synchronize(self):
            pass

        def wait_stream(self, other):
            pass

    def _current_stream(device=None):
        REC.patches_hit.add("torch.cuda.current_stream")
        return _FakeStream()

    torch.cuda.current_stream = _current_stream
    torch.cuda.default_stream = _current_stream

    import tvm_ffi

    assert Module.__name__ == tvm_ffi.Module.__name__, (Module.__name__, tvm_ffi.Module.__name__)

    from flashinfer.jit import core as jit_core

    # No kernel is compiled or loaded: every JIT spec (nvcc and CuTe-DSL) yields the stand-in.
    def _build_and_load(self):
        REC.patches_hit.add("JitSpec.build_and_load")
        return Module(getattr(self, "name", type(self).__name__))

    jit_core.JitSpec.build_and_load = _build_and_load
    # The trtllm-gen modules register their .so with the cubin loader (ctypes.CDLL) after
    # loading; there is no .so, so there are no library paths to register.
    jit_core.JitSpecNvcc.get_library_paths = lambda self: ()
    _stub_artifact_spec_generators()


class _StubSpec:
    """What a stubbed artifact-fetching ``gen_*_module()`` returns: loads to the stand-in."""

    def __init__(self, name: str):
        self.name = name

    def build_and_load(self):
        REC.patches_hit.add("JitSpec.build_and_load")
        return Module(self.name)

    def get_library_paths(self):
        return ()


_STUBBED_GENERATORS: list[tuple[Any, Any]] = []


def _stub_artifact_spec_generators() -> None:
    """The trtllm-gen spec generators (MoE, GEMM, FMHA/MLA, routing, moe_utils) download cubin
    checksums and headers from the NVIDIA artifactory *while building the JitSpec*, before any
    build or load. Without network or GPU they cannot run and nothing of theirs reaches a key
    (the key only sees the loaded module's class name), so every ``gen_*`` function in
    flashinfer/jit that calls ``get_artifact`` / ``get_cubin`` (found by reading its source) is
    replaced by one returning a stub spec. The same function objects already imported by name
    into other flashinfer modules are rebound in ``_rebind_stubbed_generators``."""
    import ast
    import inspect

    for modname in ("flashinfer.jit.fused_moe", "flashinfer.jit.gemm.core", "flashinfer.jit.attention.modules",
                    "flashinfer.jit.moe_utils"):
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        tree = ast.parse(inspect.getsource(mod))
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("gen_"):
                continue
            called = {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
            if not called & {"get_artifact", "get_cubin"}:
                continue
            orig = getattr(mod, node.name)

            def stub(*args, _name=node.name, **kwargs):
                REC.patches_hit.add(f"{_name} (artifact download)")
                return _StubSpec(_name + (f"{args}{kwargs}" if args or kwargs else ""))

            setattr(mod, node.name, stub)
            _STUBBED_GENERATORS.append((orig, stub))


def _rebind_stubbed_generators() -> None:
    for name, mod in list(sys.modules.items()):
        if not name.startswith("flashinfer") or mod is None:
            continue
        for attr, val in list(vars(mod).items()):
            for orig, stub in _STUBBED_GENERATORS:
                if val is orig:
                    setattr(mod, attr, stub)


def _decode(value: Any, torch) -> Any:
    if isinstance(value, list):
        return [_decode(v, torch) for v in value]
    if isinstance(value, dict):
        if "tensor" in value:
            t = value["tensor"]
            shape = [int(d) for d in t["shape"]]
            dtype = getattr(torch, t["dtype"])
            layout = t.get("layout", "row_major")
            if layout == "column_major":
                assert len(shape) >= 2, t
                swapped = shape[:-2] + [shape[-1], shape[-2]]
                return torch.empty(swapped, dtype=dtype, device="cuda").transpose(-1, -2)
            assert layout == "row_major", t
            return torch.empty(shape, dtype=dtype, device="cuda")
        if "dtype" in value:
            return getattr(torch, value["dtype"])
        if "enum" in value:
            enum_cls_path, member = value["enum"].rsplit(".", 1)
            enum_cls = _resolve(enum_cls_path)
            obj = getattr(enum_cls, member)
            if int(obj.value if hasattr(obj, "value") else obj) != int(value["value"]):
                raise ValueError(f"{value['enum']} is {obj!r}, not {value['value']}")
            return obj
        return {k: _decode(v, torch) for k, v in value.items()}
    return value


def _resolve(qualname: str):
    parts = qualname.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(qualname)


def _jsonable(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    return repr(x)


def _optional_stacks() -> dict:
    """Packages that decide which runners exist (not just how fast they are): without
    nvidia-cutlass-dsl every CuTe-DSL runner disappears (MLA decode "auto" then offers only
    trtllm-gen; mm_fp4/mm_mxfp8 backend="cute-dsl" fail), and without cudnn-frontend the cuDNN
    GEMM backends do. SGLang 0.5.23 pins nvidia-cutlass-dsl[cu13]==4.8.0; FlashInfer 0.7.2.post1
    requires nvidia-cudnn-frontend>=1.31."""
    from importlib import metadata

    res = {}
    for dist in ("nvidia-cutlass-dsl", "nvidia-cudnn-frontend"):
        try:
            res[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            res[dist] = None
    try:
        import cudnn

        res["cudnn_backend_version"] = cudnn.backend_version()
    except Exception:  # noqa: BLE001
        res["cudnn_backend_version"] = None
    return res


def _fake_choose_one_factory():
    """The tune-mode path of AutoTuner.choose_one (flashinfer/autotuner/autotuner.py), reduced to
    the steps that decide which keys get written; profiling is replaced by recording every
    runner's candidate key."""
    import torch
    from flashinfer.autotuner import AutoTuner

    real_choose_one = AutoTuner.choose_one

    def choose_one(self, custom_op, runners, tuning_config, inputs, **kwargs):
        record: dict[str, Any] = {"custom_op": custom_op, "runners": [type(r).__name__ for r in runners]}
        REC.choose_one_calls.append(record)
        if custom_op in self._effective_skip_ops:
            record["skipped"] = "custom_op in autotune(skip_ops=...)"
            return runners[0], -1
        with self._lock:
            original_config = tuning_config
            # What a serving process (no autotune context) looks up for the caller's own shapes.
            record["lookup_without_context"] = _lookup(self, custom_op, runners, tuning_config, inputs)
            if (
                self._override_tuning_buckets is not None
                or self._override_round_up
                or self._override_cuda_graph_profile_replays is not None
            ):
                tuning_config = self._apply_tuning_overrides(tuning_config)
            assert self._effective_measure_policy is None
            input_shapes = tuple(self._get_input_sizes(inputs))
            record["input_shapes"] = [list(s) for s in input_shapes]
            if not self.is_tuning_mode:
                record["skipped"] = "not in tuning mode"
                return real_choose_one(self, custom_op, runners, tuning_config, inputs, **kwargs)
            # The key a lookup with the caller's own shapes uses (search_cache after tuning).
            record["call_nearest_profile"] = _jsonable(self._find_nearest_profile(input_shapes, tuning_config))
            record["dynamic_specs"] = [
                {"input_idx": list(s.input_idx), "dim_idx": list(s.dim_idx),
                 "gen_tuning_buckets": (list(s.gen_tuning_buckets) if isinstance(s.gen_tuning_buckets, (list, tuple))
                                        else getattr(s.gen_tuning_buckets, "__name__", repr(s.gen_tuning_buckets))),
                 "map_to_tuning_buckets": getattr(s.map_to_tuning_buckets, "__name__", repr(s.map_to_tuning_buckets))}
                for s in tuning_config.dynamic_tensor_specs
            ]
            record["constraint_specs"] = [
                {"input_idx": c.input_idx, "dim_idx": c.dim_idx} for c in tuning_config.constraint_specs
            ]
            record["profiling_policy"] = _jsonable(self._profiling_policy(tuning_config))
            profiles = self._generate_optimization_profiles(tuning_config, inputs)
            seen: set[str] = set()
            keys = []
            for p in profiles:
                opt = p.get_opt_shapes()
                dyn = []
                for spec in tuning_config.dynamic_tensor_specs:
                    dyn.append(opt[spec.input_idx[0]][spec.dim_idx[0]])
                bucket = None if not dyn else (dyn[0] if len(dyn) == 1 else dyn)
                tensors = _profile_tensors(self, custom_op, p, inputs, tuning_config)
                cands = []
                for r in runners:
                    extras_profile = r.get_cache_key_extras(tensors)
                    extras_inputs = r.get_cache_key_extras(inputs)
                    if extras_profile != extras_inputs:
                        REC.note(f"{custom_op}/{type(r).__name__}: get_cache_key_extras differs between the "
                                 f"caller's inputs {extras_inputs!r} and the profile's synthesized tensors "
                                 f"{extras_profile!r}; the stored key uses the synthesized ones")
                    key = self._get_cache_key(custom_op, r, opt, tuning_config, extras_profile)
                    fk = key.file_key
                    if "<STUB" in fk:
                        REC.note(f"{custom_op}: a stubbed JIT value reached the key: {fk}")
                    cands.append({"runner": key.runner_class_name, "file_key": fk,
                                  "valid_tactics": _count_tactics(r, tensors, p)})
                sig = json.dumps(cands)
                if sig in seen:
                    continue
                seen.add(sig)
                keys.append({"custom_op": custom_op, "bucket": bucket, "candidates": cands})
            record["keys"] = keys
            if VERIFY:
                record["verify"] = _verify_with_real_choose_one(
                    self, real_choose_one, custom_op, runners, original_config, inputs, kwargs, keys)
        return runners[0], -1

    return choose_one


def _synthesize(tuner, custom_op, profile, inputs):
    """AutoTuner._prepare_input_tensors: the tensors the real loop profiles with and computes the
    stored key's extras from. Some initializers need a real device (torch.Generator(device="cuda")
    in the MoE top-k initializer); only for those inputs the same shape and dtype are made with
    torch.empty, which is all get_cache_key_extras may read (its documented contract:
    synthesis-invariant, i.e. dtype / None-ness / scalar arguments only)."""
    import torch
    from flashinfer.autotuner.autotuner import AutoTuner, DynamicDim, _get_opt

    try:
        return AutoTuner._prepare_input_tensors(tuner, profile, inputs)
    except Exception:  # noqa: BLE001
        pass
    tensors = []
    for i, dims in enumerate(profile.shapes):
        t = inputs[i]
        if t is None or not any(isinstance(d, DynamicDim) for d in dims):
            tensors.append(t)
            continue
        shape = tuple(_get_opt(d) for d in dims)
        init = profile.tensor_initializers[i]
        try:
            if init is None:
                from flashinfer.autotuner.initializers import autotuner_initializer_rand_scaled as init
            tensors.append(init(shape, t.dtype, t.device))
        except Exception as e:  # noqa: BLE001
            REC.note(f"{custom_op}: input {i}'s profile initializer "
                     f"{getattr(init, '__qualname__', init)} needs a real device "
                     f"({type(e).__name__}); made with torch.empty of the same shape and dtype")
            tensors.append(torch.empty(shape, dtype=t.dtype, device=t.device))
    return tensors


def _profile_tensors(tuner, custom_op, profile, inputs, tuning_config):
    tensors = _synthesize(tuner, custom_op, profile, inputs)
    if tuning_config.inputs_pre_hook is not None:
        try:
            tensors = list(tuning_config.inputs_pre_hook(tensors))
        except Exception as e:  # noqa: BLE001
            REC.note(f"{custom_op}: inputs_pre_hook raised {type(e).__name__} on fake tensors; extras "
                     "computed from the tensors before the hook")
    return tensors


def _verify_with_real_choose_one(tuner, real_choose_one, custom_op, runners, tuning_config, inputs, kwargs,
                                 expected: list[dict]) -> dict:
    """Cross-check (``--verify``): run FlashInfer's unmodified AutoTuner.choose_one once per runner,
    with that runner made the winner of every profile, and read the keys it stored in its
    in-memory cache. Replaced for this only: each runner's get_valid_tactics (one tactic, 0),
    its precompile/forward (no kernel), the tuner's _profile_single_kernel (the chosen runner
    measures 1.0, the others 2.0) and _prepare_input_tensors (``_synthesize`` above)."""
    import types

    got: set[tuple[str, str]] = set()
    saved = {}
    for r in runners:
        saved[id(r)] = {k: r.__dict__[k] for k in ("get_valid_tactics", "precompile_tactics", "forward")
                        if k in r.__dict__}

        def _fwd(inputs, tactic=-1, do_preparation=False, **kw):
            return None

        r.get_valid_tactics = lambda inputs, profile: [0]
        r.precompile_tactics = lambda inputs, tactics, profile, **kw: True
        r.forward = _fwd
    tuner._prepare_input_tensors = types.MethodType(lambda self, p, inp: _synthesize(self, custom_op, p, inp), tuner)
    try:
        for win in range(len(runners)):
            tuner.profiling_cache.clear()
            tuner._profiling_cache_policies.clear()
            tuner._profile_single_kernel = types.MethodType(
                lambda self, runner, *a, _w=runners[win], **kw: 1.0 if runner is _w else 2.0, tuner)
            real_choose_one(tuner, custom_op, runners, tuning_config, inputs, **kwargs)
            for key in tuner.profiling_cache:
                if key.custom_op == custom_op:
                    got.add((key.runner_class_name, key.file_key))
    finally:
        for attr in ("_profile_single_kernel", "_prepare_input_tensors"):
            tuner.__dict__.pop(attr, None)
        tuner.profiling_cache.clear()
        tuner._profiling_cache_policies.clear()
        for r in runners:
            for k in ("get_valid_tactics", "precompile_tactics", "forward"):
                r.__dict__.pop(k, None)
            r.__dict__.update(saved[id(r)])
    want = {(c["runner"], c["file_key"]) for k in expected for c in k["candidates"]}
    return {"real_choose_one_keys": len(got), "match": got == want,
            "only_in_real": sorted(fk for _, fk in got - want)[:5],
            "only_in_oracle": sorted(fk for _, fk in want - got)[:5]}


def _count_tactics(runner, tensors, profile):
    """How many tactics the runner offers for this profile, where its get_valid_tactics is plain
    Python (e.g. MLA cute-dsl's workspace check, mxfp8 warp split-K's M/K limits). 0 means the
    runner cannot win this profile, so a real tune never stores its key. None: the answer comes
    from the kernel library (a stubbed JIT call was made) or needs a device (it raised)."""
    before = len(REC.kernel_calls)
    try:
        tactics = runner.get_valid_tactics(tensors, profile)
        if len(REC.kernel_calls) != before or isinstance(tactics, _StubResult):
            return None
        return len(list(tactics))
    except Exception:  # noqa: BLE001
        return None
    finally:
        del REC.kernel_calls[before:]


def _lookup(tuner, custom_op, runners, tuning_config, inputs) -> dict:
    shapes = tuple(tuner._get_input_sizes(inputs))
    keys = [tuner._get_cache_key(custom_op, r, shapes, tuning_config, r.get_cache_key_extras(inputs)).file_key
            for r in runners]
    return {"nearest_profile": _jsonable(tuner._find_nearest_profile(shapes, tuning_config)), "file_keys": keys}


def run_one(call: dict) -> dict:
    arch = call.get("arch", "sm100")
    _install_patches(arch)
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import flashinfer
    from flashinfer.autotuner import AutoTuner, autotune

    AutoTuner.choose_one = _fake_choose_one_factory()
    out: dict[str, Any] = {"id": call.get("id"), "arch": arch, "api": call["api"],
                           "flashinfer": flashinfer.__version__, "torch": torch.__version__,
                           "optional_stacks": _optional_stacks()}
    fn = _resolve(call["api"])
    import flashinfer.fused_moe.core, flashinfer.gemm.gemm_base, flashinfer.mla._core  # noqa: E401,F401
    _rebind_stubbed_generators()
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    error = None
    with mode:
        kwargs = {k: _decode(v, torch) for k, v in call.get("kwargs", {}).items()}
        if call.get("tune_max") is not None:
            if "tune_max_num_tokens" in kwargs and kwargs["tune_max_num_tokens"] != call["tune_max"]:
                raise ValueError("tune_max and kwargs.tune_max_num_tokens disagree")
            kwargs["tune_max_num_tokens"] = int(call["tune_max"])
        buckets = call.get("buckets")
        ctx = autotune(True, tuning_buckets=tuple(buckets)) if buckets else autotune(True)
        try:
            with ctx:
                fn(**kwargs)
        except Exception as e:  # noqa: BLE001
            error = f"{type(e).__name__}: {e}"
            tb = traceback.format_exc()
    keys = []
    for rec in REC.choose_one_calls:
        keys.extend(rec.get("keys", []))
    out["keys"] = keys
    out["choose_one"] = [{k: v for k, v in r.items() if k != "keys"} for r in REC.choose_one_calls]
    notes = list(REC.notes)
    notes.append("tensors: meta-backed FakeTensors reporting device cuda:0 (no memory, no values)")
    notes.append("candidates: every runner passed to choose_one; a real tune stores only the winning "
                 "runner's key per profile, and none for a profile where no runner has a valid tactic")
    if REC.kernel_calls:
        uniq = sorted(set(REC.kernel_calls))
        notes.append("stubbed JIT/kernel calls: " + ", ".join(uniq))
    if REC.patches_hit:
        notes.append("patches used: " + ", ".join(sorted(REC.patches_hit)))
    if error is not None:
        if keys:
            notes.append(f"after choose_one the call raised (kernel side, keys unaffected): {error}")
        else:
            out["error"] = error
            out["traceback"] = tb
    out["notes"] = notes
    return out


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("calls", nargs="?")
    ap.add_argument("--out")
    ap.add_argument("--id", action="append", help="only these call ids")
    ap.add_argument("--verify", action="store_true",
                    help="also run FlashInfer's unmodified choose_one once per runner (forced winner, no "
                         "kernels) and check it stores exactly the keys listed")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        call = json.load(sys.stdin)
        try:
            res = run_one(call)
        except Exception as e:  # noqa: BLE001
            res = {"id": call.get("id"), "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(),
                   "keys": [], "notes": REC.notes}
        sys.stdout.write("\n@@RESULT@@" + json.dumps(res) + "\n")
        return 0
    with open(args.calls) as f:
        calls = json.load(f)
    results = []
    for call in calls:
        if args.id and call.get("id") not in args.id:
            continue
        env = dict(os.environ)
        env.setdefault("FLASHINFER_LOGGING_LEVEL", "WARNING")
        if args.verify:
            env["FI_KEYS_VERIFY"] = "1"
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker"], input=json.dumps(call),
                           capture_output=True, text=True, env=env)
        marker = p.stdout.rfind("@@RESULT@@")
        if marker < 0:
            results.append({"id": call.get("id"), "error": f"worker exited {p.returncode}",
                            "stderr": p.stderr[-4000:], "keys": [], "notes": []})
        else:
            results.append(json.loads(p.stdout[marker + len("@@RESULT@@"):]))
        sys.stderr.write(f"{call.get('id')}: {len(results[-1]['keys'])} key groups"
                         f"{' ERROR ' + results[-1]['error'] if results[-1].get('error') else ''}\n")
    text = json.dumps(results, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0 if all(not r.get("error") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
