"""SGLang 0.5.23's own dense linear layers on a fake GPU: which FlashInfer GEMMs they call.

    import sglang_env as E, sglang_linear_calls as L
    L.boot("sm100", 8)                      # E.boot + the recorders; before any sglang import
    E.materialize_models({...}); sa = E.resolve(argv); E.publish(sa, tp_rank=0)
    calls = L.record_linear_calls(sa, E.ModelRunnerView(sa), 512)

``record_linear_calls`` builds the model class SGLang's loader would build (``_initialize_model``'s
class, quantization config from ``model_loader.loader._get_quantization_config``, shared-expert
fusion from ``resolve_shared_experts_config``) with the config cut to its first dense layers and
first MoE layer, runs every linear layer's ``process_weights_after_loading`` and forward for
``m_tokens`` tokens on CPU, and returns every FlashInfer GEMM call those layers made, bound to
FlashInfer's signature with defaults applied and encoded as autotune_cache/recipes.py ``encode``
does (tensors without ``fill``)::

    [{"layer": "model.layers.0.self_attn.qkv_proj", "api": "flashinfer.bmm_fp8", "tunable": True,
      "kwargs": {"A": {"tensor": {"shape": [1, 512, 8192], "dtype": "float8_e4m3fn",
                                  "layout": "row_major"}}, ...}}]

``LAST_RUN`` then holds what else the run saw: the GEMM backends SGLang resolved
(``initialize_fp8/fp4/bf16_gemm_config``, as the scheduler runs them), each linear layer's quant
method and the non-FlashInfer GEMM path it took (``other``), FlashInfer quantizers called
(``aux``), and errors.

Why each stand-in (a kernel stand-in only ever returns SGLang's / FlashInfer's documented output
shapes and dtypes; no FlashInfer GEMM runs):

- FlashInfer GEMM entry points (``RECORDED``): replaced in ``flashinfer``, ``flashinfer.gemm`` and
  their defining modules before SGLang imports them, so ``from flashinfer import bmm_fp8`` and
  ``LazyImport`` bind the recorder; the recorder keeps the original's attributes
  (``is_backend_supported``, ``suitable_auto_backends``) because SGLang queries them.
- ``direct_register_custom_op`` also registers the op for the CPU dispatch key: SGLang registers
  its custom ops (``flashinfer_bmm_fp8``, ``fp4_gemm``, ``flashinfer_fp4_quantize``, ...) for
  CUDA only, and tensors here are CPU tensors. The op body is SGLang's own.
- quantizers that run before the GEMM and are GPU kernels: ``scaled_fp8_quant`` (sgl_kernel),
  ``static_quant_fp8`` (Triton), ``per_token_group_quant_fp8`` / ``sglang_per_token_group_quant_fp8``
  (Triton / sgl_kernel), FlashInfer's ``fp4_quantize`` / ``mxfp8_quantize`` (CUDA / CuTe DSL):
  torch reference or shape-only stand-ins with the real output shapes.
- SGLang's non-FlashInfer GEMMs (DeepGEMM, Triton, CUTLASS block-FP8 linears, the CuTe-DSL
  NVFP4 GEMM+SwiGLU kernel, torch/cuBLAS bf16): recorded in ``LAST_RUN["other"]`` and answered
  with an empty output of the right shape.
- ``deep_gemm`` made importable (a stub module, as sgl_kernel): the wheel here fails to load
  (libnvrtc.so.12), while a serving image imports it, and ``deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM``
  decides the block-FP8 backend.
- process groups: ``FakeGroup`` widths/ranks from the published parallel config; collectives
  return their input's shape. ``Tensor.cuda`` returns the tensor (weights stay on CPU).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import importlib.abc
import importlib.machinery
import inspect
import sys
import traceback
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sglang_env as E  # noqa: E402

#: FlashInfer GEMM entry points recorded: name -> (tunable, where the name is defined).
#: Tunable = the call reaches ``AutoTuner.choose_one`` in FlashInfer 0.7.2.post1
#: (gemm_base.py: bf16_gemm_sm100 <- mm_bf16/bmm_bf16, fp8_gemm_sm100 <- bmm_fp8/mm_fp8,
#: tgv_gemm_sm100, mm_mxfp8, mm_fp4, mxfp8_gemm_sm100 <- bmm_mxfp8; gemm_bf16_fp4_*: mm_bf16_fp4;
#: gemm_svdquant.py). gemm_fp8_nt_groupwise / fp8_blockscale_gemm_sm90 never tune.
RECORDED = {
    "bmm_fp8": True, "mm_fp8": True, "mm_fp4": True, "mm_mxfp8": True, "bmm_mxfp8": True,
    "mm_bf16": True, "bmm_bf16": True, "tgv_gemm_sm100": True, "mm_bf16_fp4": True,
    "mm_nvfp4_svdquant": True, "svdquant_linear": True,
    "gemm_fp8_nt_groupwise": False, "gemm_fp8_nt_blockscaled": False,
    "fp8_blockscale_gemm_sm90": False,
}
#: FlashInfer quantizers that precede a GEMM (shape-only stand-ins, logged in LAST_RUN["aux"]).
QUANTIZERS = ("fp4_quantize", "mxfp8_quantize")

CALLS: list[dict] = []
LAST_RUN: dict = {}
_CURRENT: list[str] = ["<none>"]
_ORIGINALS: dict[str, Any] = {}
_installed = [False]


# ----------------------------------------------------------------------------------------------
# encoding (autotune_cache/recipes.py ``encode``, tensors without ``fill``)

def _dtype_name(dt) -> str:
    return str(dt).removeprefix("torch.")


def encode(value: Any) -> Any:
    import enum

    import torch

    if isinstance(value, torch.Tensor):
        layout = "row_major"
        if value.dim() >= 2 and value.stride(-2) == 1 and value.stride(-1) != 1:
            layout = "column_major"
        return {"tensor": {"shape": list(value.shape), "dtype": _dtype_name(value.dtype), "layout": layout}}
    if isinstance(value, torch.dtype):
        return {"dtype": _dtype_name(value)}
    if isinstance(value, enum.Enum):
        return {"enum": f"{type(value).__module__}.{type(value).__qualname__}.{value.name}", "value": value.value}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


# ----------------------------------------------------------------------------------------------
# recorders

def _gemm_out(name: str, b: inspect.BoundArguments):
    """An empty output with the shape and dtype the FlashInfer function documents."""
    import torch

    a = b.arguments
    if a.get("out") is not None:
        return a["out"]
    if name in ("bmm_fp8", "bmm_bf16", "bmm_mxfp8"):
        A, B = a.get("A", a.get("a")), a.get("B", a.get("b"))
        dt = a.get("dtype", a.get("out_dtype")) or torch.bfloat16
        return torch.empty((A.shape[0], A.shape[1], B.shape[2]), dtype=dt)
    if name in ("gemm_fp8_nt_groupwise", "gemm_fp8_nt_blockscaled"):
        return torch.empty((a["a"].shape[0], a["b"].shape[0]), dtype=a.get("out_dtype") or torch.bfloat16)
    if name == "fp8_blockscale_gemm_sm90":
        return torch.empty((a["input"].shape[0], a["weight"].shape[0]), dtype=a.get("out_dtype") or torch.bfloat16)
    first = list(a.values())
    A, B = first[0], first[1]
    dt = a.get("out_dtype", a.get("dtype")) or torch.bfloat16
    return torch.empty((A.shape[0], B.shape[-1]), dtype=dt)


def _make_recorder(name: str, orig):
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def recorder(*args, **kwargs):
        # keyword FlashInfer's @backend_requirement wrapper adds to every API (not in the signature)
        extra = {k: kwargs.pop(k) for k in ("skip_check",) if k in kwargs}
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        passed = set(sig.bind(*args, **kwargs).arguments)
        CALLS.append({"layer": _CURRENT[0], "api": f"flashinfer.{name}", "tunable": RECORDED[name],
                      "kwargs": {k: encode(v) for k, v in bound.arguments.items()},
                      "defaulted": sorted(k for k in bound.arguments if k not in passed),
                      **({"wrapper_kwargs": extra} if extra else {})})
        return _gemm_out(name, bound)

    recorder.__fi_recorder__ = name
    return recorder


def _fp4_quantize_shapes(input, global_scale=None, sf_vec_size=16, sf_use_ue8m0=False,
                         is_sf_swizzled_layout=True, is_sf_8x4_layout=False, *rest, **kw):
    """flashinfer.fp4_quantize's output shapes (its registered fake, fp4_quantization.py)."""
    import torch

    def rnd(x, y):
        return (x + y - 1) // y * y

    col = input.dim() >= 2 and input.stride(-2) == 1 and input.stride(-1) != 1
    m, k = (input.shape[-1], input.shape[-2]) if col else (input.numel() // input.shape[-1], input.shape[-1])
    x_q = torch.empty((*input.shape[:-1], k // 2), dtype=torch.uint8)
    if is_sf_swizzled_layout:
        sf = torch.empty((rnd(m, 8 if is_sf_8x4_layout else 128), rnd(k // sf_vec_size, 4)), dtype=torch.uint8)
    else:
        sf = torch.empty((m, k // sf_vec_size), dtype=torch.uint8)
    return x_q, sf


def _mxfp8_quantize_shapes(input, is_sf_swizzled_layout=True, alignment=32, *rest, **kw):
    import torch

    m = input.numel() // input.shape[-1]
    k = (input.shape[-1] + alignment - 1) // alignment * alignment
    cols = k // 32
    n = ((m + 127) // 128 * 128) * ((cols + 3) // 4 * 4) if is_sf_swizzled_layout else m * cols
    return torch.empty((m, k), dtype=torch.float8_e4m3fn), torch.empty((n,), dtype=torch.uint8)


def _same_shape(input_tensor, *a, **k):
    """flashinfer.shuffle_matrix_a / shuffle_matrix_sf_a permute rows: same shape and dtype."""
    return input_tensor.clone()


def _block_scale_interleave_shape(unswizzled_sf, *, out=None):
    """flashinfer.block_scale_interleave: a flat buffer of the 128x4-padded size (per expert)."""
    import torch

    experts = unswizzled_sf.shape[0] if unswizzled_sf.dim() == 3 else 1
    rows, cols = unswizzled_sf.shape[-2], unswizzled_sf.shape[-1]
    size = experts * ((rows + 127) // 128 * 128) * ((cols + 3) // 4 * 4)
    return out if out is not None else torch.empty((size,), dtype=unswizzled_sf.dtype)


def _make_quantizer(name: str, orig, impl):
    @functools.wraps(orig)
    def quantizer(*args, **kwargs):
        x = args[0] if args else kwargs.get("input")
        LAST_RUN.setdefault("aux", []).append({"layer": _CURRENT[0], "api": f"flashinfer.{name}",
                                               "input": encode(x)})
        return impl(*args, **kwargs)

    quantizer.__fi_recorder__ = name
    return quantizer


def _patch_flashinfer() -> None:
    import flashinfer
    import flashinfer.gemm as fg

    modules = [flashinfer, fg] + [m for n, m in list(sys.modules.items())
                                  if n.startswith("flashinfer.gemm.") or n.startswith("flashinfer.quantization")
                                  or n == "flashinfer.fp4_quantization" or n == "flashinfer.fp8_quantization"]
    for name in RECORDED:
        orig = getattr(fg, name, None) or getattr(flashinfer, name, None)
        if orig is None:
            continue
        _ORIGINALS[name] = orig
        rec = _make_recorder(name, orig)
        for mod in modules:
            if getattr(mod, name, None) is orig:
                setattr(mod, name, rec)
    for name, impl in (("fp4_quantize", _fp4_quantize_shapes), ("mxfp8_quantize", _mxfp8_quantize_shapes),
                       ("shuffle_matrix_a", _same_shape), ("shuffle_matrix_sf_a", _same_shape),
                       ("block_scale_interleave", _block_scale_interleave_shape)):
        orig = getattr(flashinfer, name, None)
        if orig is None:
            continue
        _ORIGINALS[name] = orig
        q = _make_quantizer(name, orig, impl)
        for mod in modules:
            if getattr(mod, name, None) is orig:
                setattr(mod, name, q)


def _rebind_everywhere() -> None:
    """Replace leftover bindings of original FlashInfer functions in sglang modules."""
    import flashinfer

    repl = {id(o): getattr(flashinfer, n, None) for n, o in _ORIGINALS.items()}
    for modname, mod in list(sys.modules.items()):
        if not modname.startswith("sglang") or mod is None:
            continue
        for attr, val in list(vars(mod).items()):
            new = repl.get(id(val))
            if new is not None and getattr(new, "__fi_recorder__", None):
                setattr(mod, attr, new)


def _replace_function(module_name: str, func_name: str, new) -> None:
    """Point every sglang module's binding of ``module_name.func_name`` at ``new``."""
    import importlib

    mod = importlib.import_module(module_name)
    orig = getattr(mod, func_name)
    for modname, m in list(sys.modules.items()):
        if (modname.startswith("sglang") or modname == module_name) and m is not None:
            for attr, val in list(vars(m).items()):
                if val is orig:
                    setattr(m, attr, new)


# ----------------------------------------------------------------------------------------------
# kernel stand-ins for what runs before / instead of a FlashInfer GEMM

def _other(kind: str, **info):
    LAST_RUN.setdefault("other", []).append({"layer": _CURRENT[0], "kernel": kind,
                                             **{k: encode(v) for k, v in info.items()}})


def _install_kernel_standins() -> None:
    import torch

    fp8 = torch.float8_e4m3fn
    fmax = torch.finfo(fp8).max

    def scaled_fp8_quant(input, scale=None, num_token_padding=None, use_per_token_if_dynamic=False):
        shape = input.shape
        if num_token_padding:
            shape = (max(num_token_padding, input.shape[0]), shape[1])
        if scale is None:
            scale = (torch.ones((shape[0], 1), dtype=torch.float32) if use_per_token_if_dynamic
                     else torch.ones(1, dtype=torch.float32))
        out = torch.empty(shape, dtype=fp8)
        out[: input.shape[0]] = (input.float() / scale.float()).clamp(-fmax, fmax).to(fp8)
        return out, scale

    def static_quant_fp8(x, x_s, repeat_scale=False):
        x_q = (x.float() / x_s.float()).clamp(-fmax, fmax).to(fp8)
        if repeat_scale:
            return x_q, x_s.float().reshape(1, 1).expand(x_q.numel() // x.shape[-1], 1).contiguous()
        return x_q, x_s

    def per_token_group_quant_fp8(x, group_size, *args, column_major_scales=False, scale_ue8m0=False,
                                  scale_tma_aligned=False, **kwargs):
        m, k = x.numel() // x.shape[-1], x.shape[-1]
        q = torch.empty(x.shape, dtype=fp8)
        if scale_ue8m0 and column_major_scales:
            # packed UE8M0, MN-major (DeepGEMM on sm100): int32 [M, ceil(K/group/4)] column-major
            s = torch.empty((-(-k // group_size // 4) * 1, m), dtype=torch.int32).t()
        elif column_major_scales:
            s = torch.empty((k // group_size, m), dtype=torch.float32).t()
        else:
            s = torch.empty((*x.shape[:-1], k // group_size), dtype=torch.float32)
        return q, s

    from sglang.kernels.ops.quantization import fp8_kernel as K

    def mxfp8_group_quantize(x):
        n, k = x.shape
        return torch.empty((n, k), dtype=fp8), torch.empty((n, k // 32), dtype=torch.uint8)

    from sglang.srt.layers.quantization import fp8_utils as U

    _replace_function(U.__name__, "mxfp8_group_quantize", mxfp8_group_quantize)
    _replace_function(K.__name__, "scaled_fp8_quant", scaled_fp8_quant)
    _replace_function(K.__name__, "static_quant_fp8", static_quant_fp8)
    for name in ("per_token_group_quant_fp8", "sglang_per_token_group_quant_fp8"):
        if hasattr(K, name):
            _replace_function(K.__name__, name, per_token_group_quant_fp8)

    # activations (JIT-built CUDA kernels): torch's own formula (forward_native)
    from sglang.srt.layers import activation as act

    for cls in list(vars(act).values()):
        if isinstance(cls, type) and "forward_native" in vars(cls) and "forward_cuda" in vars(cls):
            cls.forward_cuda = cls.forward_native

    # SGLang's block-FP8 GEMM kernels that are not FlashInfer (the dispatching wrappers around
    # them, deepgemm_/triton_w8a8_block_fp8_linear*, run as they are): record, answer the shape.
    from sglang.kernels.ops.gemm import fp8_kernel as G

    def block_matmul(name):
        def run(A, B, As, Bs, block_size, *a, output_dtype=torch.bfloat16, **k):
            _other(f"sglang.kernels.ops.gemm.fp8_kernel.{name}", A=A, B=B, As=As, Bs=Bs,
                   block_size=list(block_size) if block_size is not None else None)
            return torch.empty((*A.shape[:-1], B.shape[0]), dtype=output_dtype)
        run.__name__ = name
        return run

    for name in ("w8a8_block_fp8_matmul_deepgemm", "w8a8_block_fp8_matmul_triton"):
        if hasattr(G, name) and not getattr(getattr(G, name), "__standin__", False):
            new = block_matmul(name)
            new.__standin__ = True
            _replace_function(G.__name__, name, new)


def _install_swiglu_standin() -> None:
    """sglang.kernels.ops.gemm.nvfp4_gemm_swiglu_nvfp4_quant imports the CuTe DSL (``cutlass``),
    absent here: a module with SGLang's own weight-layout helpers (copied from its source) and a
    recording stand-in for the fused NVFP4 GEMM+SwiGLU+quant kernel."""
    import torch

    name = "sglang.kernels.ops.gemm.nvfp4_gemm_swiglu_nvfp4_quant"
    if name in sys.modules:
        return
    try:
        import sglang

        src_path = Path(sglang.__file__).parent / "kernels/ops/gemm/nvfp4_gemm_swiglu_nvfp4_quant.py"
        tree = ast.parse(src_path.read_text())
    except Exception:  # pragma: no cover
        return
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef)
            and n.name in ("_round_up", "interleave_linear_and_gate", "swizzle_blockscale_2d")]
    mod = types.ModuleType(name)
    mod.__dict__["torch"] = torch
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(src_path), "exec"), mod.__dict__)

    def nvfp4_gemm_swiglu_nvfp4_quant(a, a_scale, b, b_scale, alpha, output_global_scale, **kw):
        m, n_out = a.shape[0], b.shape[0] // 2
        _other("sglang.kernels.ops.gemm.nvfp4_gemm_swiglu_nvfp4_quant (CuTe DSL)",
               a=a, a_scale=a_scale, b=b, b_scale=b_scale)
        rnd = mod._round_up
        return (torch.empty((m, n_out // 2), dtype=torch.uint8),
                torch.empty((rnd(m, 128), rnd(n_out // 16, 4)), dtype=torch.uint8))

    mod.nvfp4_gemm_swiglu_nvfp4_quant = nvfp4_gemm_swiglu_nvfp4_quant
    sys.modules[name] = mod


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``deep_gemm`` as cudastubs stubs sgl_kernel: importable, any call raises."""

    NAMES = ("deep_gemm",)

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.NAMES:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        import cudastubs

        m = cudastubs._StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        # DeepGEMM's pure layout helpers, which SGLang's weight post-processing calls
        # (fp8_utils.transform_scale_ue8m0 on sm100): its own torch formulas.
        if module.__name__ == "deep_gemm":
            # A host query the DSA indexer makes while the model is built: the fake GPU's SMs.
            import torch

            module.get_num_sms = lambda: torch.cuda.get_device_properties(0).multi_processor_count
        if module.__name__ == "deep_gemm.utils":
            module.align = lambda x, y: (x + y - 1) // y * y
            module.get_tma_aligned_size = lambda x, element_size: module.align(x, 16 // element_size)
        elif module.__name__ == "deep_gemm.utils.layout":
            def get_mn_major_tma_aligned_packed_ue8m0_tensor(x):
                from sglang.srt.layers.quantization import fp8_utils  # SGLang's copy of DeepGEMM's

                return fp8_utils._get_mn_major_tma_aligned_packed_ue8m0_tensor_torch_impl(x)

            module.get_mn_major_tma_aligned_packed_ue8m0_tensor = get_mn_major_tma_aligned_packed_ue8m0_tensor


def _patch_custom_op_registration() -> None:
    import sglang.srt.utils as su
    import sglang.srt.utils.common as C

    orig = C.direct_register_custom_op
    if getattr(orig, "__cpu_too__", False):
        return

    def direct_register_custom_op(op_name, op_func, mutates_args, fake_impl=None, target_lib=None):
        orig(op_name, op_func, mutates_args, fake_impl=fake_impl, target_lib=target_lib)
        lib = target_lib or C.sglang_lib
        try:
            lib.impl(op_name, op_func, "CPU")
        except RuntimeError:
            pass  # already has a CPU kernel

    direct_register_custom_op.__cpu_too__ = True
    C.direct_register_custom_op = direct_register_custom_op
    if getattr(su, "direct_register_custom_op", None) is orig:
        su.direct_register_custom_op = direct_register_custom_op


class _FakeStream:
    """torch.cuda.Stream/Event without a driver (DeepSeek builds an alt stream at construction)."""

    def __init__(self, *a, **k):
        pass

    def __getattr__(self, name):
        return lambda *a, **k: None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _cuda_to_cpu_mode():
    """A TorchFunctionMode that turns every ``device="cuda..."`` (keyword or positional, as in
    ``tensor.to("cuda")``) into the CPU: SGLang's modules allocate buffers on the current device."""
    import torch
    from torch.overrides import TorchFunctionMode

    def is_cuda(d):
        return (isinstance(d, str) and d.startswith("cuda")) or (isinstance(d, torch.device) and d.type == "cuda")

    class CudaToCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if is_cuda(kwargs.get("device")):
                kwargs["device"] = "cpu"
            args = tuple("cpu" if is_cuda(a) else a for a in args)
            return func(*args, **kwargs)

    return CudaToCpu()


def _fake_streams() -> None:
    import torch

    torch.cuda.Stream = _FakeStream
    torch.cuda.Event = _FakeStream
    torch.cuda.current_stream = lambda *a, **k: _FakeStream()
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()


def _no_jit_builds() -> None:
    """SGLang JIT-compiles some CUDA kernels on first call (nvcc may even be on PATH here): fail at
    once instead, as a stubbed kernel call does."""
    import cudastubs
    from sglang.kernels.jit.utils.compile import ninja

    def build(*, spec, build_dir, build_file):
        raise cudastubs.KernelCalled(f"JIT build of {getattr(spec, 'module_name', spec)} in the CPU oracle")

    ninja.build = build


def install() -> None:
    """Everything that must precede SGLang's quantization imports (call right after E.boot)."""
    if _installed[0]:
        return
    import os

    import torch

    # JIT kernels SGLang tries to build (and _no_jit_builds refuses) stage under the work dir
    os.environ.setdefault("SGLANG_JIT_CACHE_DIR", str(Path(os.environ.get("SGLANG_CACHE_DIR", ".")).parent / "jit"))
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())
    torch.Tensor.cuda = lambda self, *a, **k: self  # weights stay on CPU
    _fake_streams()
    _patch_custom_op_registration()
    _no_jit_builds()
    _patch_flashinfer()
    _install_swiglu_standin()
    _installed[0] = True


def boot(arch: str, gpus: int = 8, workdir: str | None = None) -> Path:
    work = E.boot(arch, gpus, workdir)
    install()
    return work


# ----------------------------------------------------------------------------------------------
# process groups

class FakeGroup:
    """A GroupCoordinator's widths and ranks; collectives return their input's shape."""

    def __init__(self, name: str, world_size: int, rank: int):
        self.unique_name = name
        self.world_size = world_size
        self.rank_in_group = rank
        self.rank = rank
        self.local_rank = rank
        self.ranks = list(range(world_size))
        self.first_rank, self.last_rank = 0, world_size - 1
        self.is_first_rank, self.is_last_rank = rank == 0, rank == world_size - 1
        self.device_group = self.cpu_group = self.device_communicator = None
        self.pynccl_comm = self.ca_comm = None
        self.use_pynccl = False

    def all_reduce(self, x, *a, **k):
        return x

    def all_gather(self, x, dim=-1, *a, **k):
        import torch

        return torch.cat([x] * self.world_size, dim=dim)

    def reduce_scatter_tensor(self, out, x):
        return out

    def barrier(self):
        pass


def _install_groups() -> None:
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    vals = {}
    for size, group, rank in (("tp_size", "tp_group", "tp_rank"), ("pp_size", "pp_group", "pp_rank"),
                              ("attn_tp_size", "attn_tp_group", "attn_tp_rank"),
                              ("attn_cp_size", "attn_cp_group", "attn_cp_rank"),
                              ("moe_ep_size", "moe_ep_group", "moe_ep_rank"),
                              ("moe_tp_size", "moe_tp_group", "moe_tp_rank"),
                              ("moe_dp_size", "moe_dp_group", "moe_dp_rank")):
        try:
            vals[group] = FakeGroup(group, getattr(p, size), getattr(p, rank))
        except Exception:
            continue
    vals["world_group"] = FakeGroup("world", p.tp_size * p.pp_size, p.tp_rank)
    try:
        vals["shared_experts_tp_group"] = vals["tp_group"]
    except KeyError:
        pass
    p.override_permanently(**vals)


# ----------------------------------------------------------------------------------------------
# the run

def _layers_to_build(hf) -> int:
    """Enough decoder layers for one of each kind: the first dense layers plus one MoE layer."""
    n = hf.num_hidden_layers
    first_dense = getattr(hf, "first_k_dense_replace", None)
    if first_dense is not None:
        return min(n, first_dense + 1)
    only = getattr(hf, "mlp_only_layers", None) or []
    return min(n, (max(only) + 2) if only else 1)


def _fill_checkpoint_scales(module) -> None:
    """What loading a checkpoint writes into a linear layer's scale parameters (1.0: shapes only)."""
    import torch

    for pname, param in module.named_parameters(recurse=False):
        if "scale" in pname and param.dtype in (torch.float32, torch.bfloat16, torch.float16):
            param.data.fill_(1.0)


def _is_mlp(module) -> bool:
    from sglang.srt.layers.linear import LinearBase

    gu, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return isinstance(gu, LinearBase) and isinstance(down, LinearBase)


@contextlib.contextmanager
def _at(name: str):
    prev = _CURRENT[0]
    _CURRENT[0] = name
    try:
        yield
    finally:
        _CURRENT[0] = prev


def _resolved_backends() -> dict:
    from sglang.srt.layers.quantization import fp4_utils, fp8_utils, unquant

    out = {"fp8_gemm_runner_backend": fp8_utils.get_fp8_gemm_runner_backend().value,
           "fp4_gemm_runner_backend": fp4_utils.get_fp4_gemm_runner_backend().value,
           "fp4_flashinfer_backend": fp4_utils.get_fp4_gemm_runner_backend().get_flashinfer_backend(),
           "bf16_gemm_backend": unquant.get_bf16_gemm_backend().value}
    try:
        out["mxfp8_dense_backend"] = fp8_utils.resolve_mxfp8_dense_gemm_backend().value
    except Exception as e:
        out["mxfp8_dense_backend"] = f"error: {e}"
    from sglang.srt.layers import deep_gemm_wrapper

    out["deep_gemm_enabled"] = deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM
    return out


def record_linear_calls(sa, mr, m_tokens: int) -> list[dict]:
    """Every FlashInfer GEMM call SGLang's linear layers make for ``m_tokens`` tokens (see module doc).

    Needs ``install()`` (``boot`` here) before SGLang's quantization modules were imported, and
    ``E.publish(sa, ...)`` for the rank to build."""
    assert _installed[0], "call sglang_linear_calls.boot (or install) right after sglang_env.boot"
    import torch

    CALLS.clear()
    LAST_RUN.clear()
    LAST_RUN.update({"errors": [], "layers": [], "other": [], "aux": []})
    _install_groups()

    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.layers.moe.utils import resolve_shared_experts_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    from sglang.srt.layers.quantization.unquant import initialize_bf16_gemm_config
    from sglang.srt.model_loader.loader import _get_quantization_config
    from sglang.srt.model_loader.utils import get_model_architecture, set_default_torch_dtype
    from sglang.srt.runtime_context import get_model

    _rebind_everywhere()
    _install_kernel_standins()

    # managers/scheduler.py init_moe_gemm_config, in its order
    hf_text = mr.model_config.hf_text_config
    if any(hasattr(hf_text, a) for a in ("num_experts_per_tok", "num_experts_per_token", "top_k_experts",
                                          "moe_top_k", "moe_topk")):
        from sglang.srt.layers.moe import initialize_moe_config

        initialize_moe_config()
    initialize_fp8_gemm_config()
    initialize_fp4_gemm_config()
    try:
        initialize_bf16_gemm_config()
    except Exception as e:  # sm100 'cutedsl' imports the CuTe DSL, absent here
        LAST_RUN["errors"].append(f"initialize_bf16_gemm_config: {type(e).__name__}: {e}")
        from sglang.srt.layers.quantization import unquant

        unquant._BF16_GEMM_BACKEND = unquant.Bf16GemmBackend(
            "cutedsl" if "cutedsl" in str(e) or "cutlass" in str(e) else "auto")
    LAST_RUN["backends"] = _resolved_backends()

    model_config = mr.model_config
    quant_config = _get_quantization_config(model_config, LoadConfig())
    LAST_RUN["quant_config"] = type(quant_config).__name__ if quant_config is not None else None
    model_class, _ = get_model_architecture(model_config)
    hf = copy.deepcopy(model_config.hf_config)
    hf.num_hidden_layers = _layers_to_build(hf)
    shared = resolve_shared_experts_config(model_class, hf, quant_config)
    LAST_RUN["num_fused_shared_experts"] = shared.num_fused_shared_experts
    _rebind_everywhere()
    with _cuda_to_cpu_mode():
        return _build_and_run(model_class, hf, quant_config, shared, model_config, m_tokens)


def _build_and_run(model_class, hf, quant_config, shared, model_config, m_tokens):
    import torch

    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    from sglang.srt.runtime_context import get_model

    with set_default_torch_dtype(model_config.dtype), get_model().override(shared_experts=shared):
        model = model_class(config=hf, quant_config=quant_config)
    _rebind_everywhere()
    _install_kernel_standins()  # modules imported by the model build

    decoder = getattr(getattr(model, "model", model), "layers")
    linears = [(n, m) for n, m in model.named_modules()
               if isinstance(m, LinearBase) and ".layers." in f".{n}" and not n.startswith("lm_head")]
    # loader.py: process_weights_after_loading for every module with a quant method
    for name, mod in linears:
        _fill_checkpoint_scales(mod)
        with _at(name):
            try:
                mod.quant_method.process_weights_after_loading(mod)
            except Exception as e:
                LAST_RUN["errors"].append(f"{name}: process_weights_after_loading: {type(e).__name__}: {e}")
                LAST_RUN.setdefault("tracebacks", []).append(traceback.format_exc().splitlines()[-8:])

    dtype = model_config.dtype
    done = set()
    with torch.no_grad():
        for name, mod in model.named_modules():
            if name in done or not name or ".layers." not in f".{name}":
                continue
            if _is_mlp(mod) and not any(name.startswith(d + ".") for d in done):
                x = torch.zeros((m_tokens, mod.gate_up_proj.input_size), dtype=dtype)
                _run(name, lambda: mod(x), mod)
                done.add(name)
                done.update(f"{name}.{c}" for c, _ in mod.named_modules() if c)
            elif isinstance(mod, LinearBase) and not any(name.startswith(d + ".") for d in done):
                k = mod.input_size_per_partition if getattr(mod, "input_is_parallel", False) else mod.input_size
                x = torch.zeros((m_tokens, k), dtype=dtype)
                _run(name, lambda: mod(x), mod)
                done.add(name)
    LAST_RUN["layers_built"] = len(decoder)
    return list(CALLS)


def _run(name: str, fn, mod) -> None:
    from sglang.srt.layers.linear import LinearBase

    before = len(CALLS)
    info = {"layer": name, "module": type(mod).__name__}
    subs = [(n, m) for n, m in mod.named_modules() if isinstance(m, LinearBase)] or [("", mod)]
    info["quant_methods"] = {(f"{name}.{n}" if n else name): type(m.quant_method).__name__ for n, m in subs}
    # tag calls with the innermost linear layer that makes them
    originals = []
    for n, m in subs:
        f = m.forward

        def tagged(*a, _f=f, _n=(f"{name}.{n}" if n else name), **k):
            with _at(_n):
                return _f(*a, **k)

        originals.append((m, f))
        m.forward = tagged
    try:
        with _at(name):
            fn()
    except Exception as e:
        info["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        LAST_RUN["errors"].append(f"{name}: forward: {info['error']}")
        LAST_RUN.setdefault("tracebacks", []).append(traceback.format_exc().splitlines()[-10:])
    finally:
        for m, f in originals:
            m.__dict__.pop("forward", None)
    info["flashinfer_calls"] = len(CALLS) - before
    from sglang.srt.layers.quantization import unquant

    for n, m in subs:
        if isinstance(m.quant_method, unquant.UnquantizedLinearMethod):
            # x.is_cuda is False here, so apply() takes F.linear; on the GPU it takes
            # _bf16_gemm_dispatch_impl (SGLang's CuTe-DSL TGV GEMM / Split-K / Hopper GEMV) or F.linear
            LAST_RUN["other"].append({"layer": f"{name}.{n}" if n else name, "kernel":
                                      "bf16 UnquantizedLinearMethod: F.linear (cuBLAS) or SGLang's "
                                      f"bf16_gemm_backend={unquant.get_bf16_gemm_backend().value} kernels"})
    LAST_RUN["layers"].append(info)
