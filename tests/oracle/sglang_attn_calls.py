"""SGLang 0.5.23's own attention code as the oracle for the FlashInfer attention calls of the
autotune dummy pass, run on a CPU with every FlashInfer attention entry point replaced by a recorder.

    record_attention_calls(sa, mr, batch, tokens_per_req, forward_mode) -> [{"api", "kwargs", ...}]

``sa`` is a resolved and published ``ServerArgs`` (``sglang_env.resolve`` + ``sglang_env.publish``),
``mr`` a ``sglang_env.ModelRunnerView`` (for its ``model_config`` and ``spec_algorithm``). What runs
is SGLang's, in the order the server runs it:

1. a ``ModelRunner`` shell (``object.__new__(ModelRunner)``, no ``__init__``: no weights, no
   distributed init) carrying exactly the attributes the attention backends read, with SGLang's own
   ``ReqToTokenPool`` / ``MLATokenToKVPool`` / ``DSATokenToKVPool`` (one layer, a few pages, CPU),
   ``KVIndexTranslator``, ``configure_kv_cache_dtype`` and ``maybe_disable_chunked_prefix_cache``;
2. the attention backend SGLang would build: ``ModelRunner.init_attention_backends`` minus the aux
   hidden-state capture (``resolve_attention_backend_strs`` + ``build_attention_backends``: the
   attention registry, ``HybridAttnBackend`` for split prefill/decode, model wrappers);
3. the autotune dummy pass: the warmup that runs the autotune is the ``EagerRunner``'s
   (model_runner_components/cuda_graph_setup.py ``capture_cuda_graphs`` builds it with
   ``run_warmup=True`` before any CUDA-graph runner; eager_runner.py ``_autotune_buffers``), so
   the buffers are ``BaseRunner._alloc_dummy_decode_buffers`` (``seq_lens`` = the backend's
   ``get_cuda_graph_seq_len_fill_value()``) and the pass is ``BaseRunner._dummy_run`` itself
   (ForwardBatch, ``prepare_dummy_forward_batch``, ``attn_backend.init_forward_metadata``,
   ``forward_context``); no ``init_cuda_graph_state`` has run at that point;
4. the model forward of ``_dummy_run`` is one real ``DeepseekV2AttentionMLA`` layer built on CPU
   (its own ``RadixAttention``, scaling with the YaRN mscale, rotary cache, DSA indexer), whose
   ``dispatch_attn_forward_method`` and ``forward_absorb_core`` run with q/k shaped as
   ``forward_absorb_prepare`` produces them (the projections are FP8 GEMMs that cannot run here);
   the forward stops when ``attn_mqa`` returns.

Every tensor SGLang allocates on "cuda" is allocated on the CPU instead (``_CpuDevice``); the
kernels SGLang launches on the way run nothing (JIT modules from ``load_jit``, Triton launches:
SGLang's Python allocates their outputs first, so shapes stay SGLang's), DeepGEMM's two host
queries are answered, and the few Python paths that refuse CPU tensors are replaced in
``_PATCHES``; ``trace["patches"]`` lists every stand-in used and every kernel skipped. FlashInfer attention functions and wrapper classes are recorders;
the tunable one (``trtllm_batch_decode_with_kv_cache_mla``, AutoTuner custom_op
"trtllm_batch_decode_mla") returns an output of FlashInfer's shape and dtype.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import importlib
import inspect
import sys
import traceback
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

#: FlashInfer attention entry points that reach ``AutoTuner.choose_one`` (grep of
#: flashinfer 0.7.2.post1: only mla/_core.py ``_trtllm_batch_decode_with_kv_cache_mla_impl``).
TUNABLE = {"flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla": "trtllm_batch_decode_mla"}

#: FlashInfer modules whose public functions and classes are replaced by recorders. Utility
#: modules (flashinfer.utils, autotuner, jit) stay real: SGLang sizes buffers with them.
RECORDED_MODULES = (
    "flashinfer.decode", "flashinfer.prefill", "flashinfer.mla", "flashinfer.mla._core",
    "flashinfer.rope", "flashinfer.page", "flashinfer.cascade", "flashinfer.sparse",
    "flashinfer.attention", "flashinfer.xqa", "flashinfer.dsa_sparse_attention",
    "flashinfer.sparse_mqa", "flashinfer.dense_mqa", "flashinfer.paged_mqa", "flashinfer.dsa_indexer",
    "flashinfer.topk",
)


class _Stop(Exception):
    """Raised once the layer's attention call has returned: nothing after it is attention."""


# --------------------------------------------------------------------------------------------
# encoding (autotune_cache/recipes.py ``encode``'s JSON forms)


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def encode(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        layout = "row_major"
        if value.dim() == 2 and value.shape[0] > 1 and value.shape[1] > 1 and value.stride(0) == 1:
            layout = "column_major"
        return {"tensor": {"shape": list(value.shape), "dtype": _dtype_name(value.dtype), "layout": layout}}
    if isinstance(value, torch.dtype):
        return {"dtype": _dtype_name(value)}
    if isinstance(value, enum.Enum):
        return {"enum": f"{type(value).__module__}.{type(value).__qualname__}.{value.name}", "value": int(value.value)}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.device):
        return str(value)
    return {"repr": repr(value)}


# --------------------------------------------------------------------------------------------
# CPU instead of CUDA


def _is_cuda_device(d) -> bool:
    if d is None:
        return False
    if isinstance(d, int):
        return True  # a bare index means a CUDA device in torch's factories
    return str(d).startswith("cuda")


class _CpuDevice(TorchFunctionMode):
    """Tensors SGLang allocates on "cuda" (the fake GPU's device) are allocated on the CPU: there
    is no driver. Only the device changes; shapes and dtypes are SGLang's. ``pin_memory`` is
    dropped for the same reason (pinning needs the driver)."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_cuda_device(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        name = getattr(func, "__name__", "")
        if name in ("to", "cuda") and args and isinstance(args[0], torch.Tensor):
            if name == "cuda":
                return args[0]
            rest = list(args[1:])
            if rest and (_is_cuda_device(rest[0]) and not isinstance(rest[0], torch.dtype)):
                rest[0] = "cpu"
            args = (args[0], *rest)
        return func(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# FlashInfer recorders


class Recorder:
    """Collects the calls; the wrappers (installed once per process) append to the active one."""

    active: "Recorder | None" = None

    def __init__(self):
        self.calls: list[dict] = []
        self._originals: dict[str, Any] = {}
        Recorder.active = self

    # functions -------------------------------------------------------------------------------
    def wrap_function(self, api: str, fn):
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None

        @functools.wraps(fn)
        def recorder(*args, **kwargs):
            bound = None
            if sig is not None:
                try:
                    b = sig.bind(*args, **kwargs)
                    b.apply_defaults()
                    bound = dict(b.arguments)
                except TypeError:
                    bound = None
            if bound is None:
                bound = {"*args": list(args), **kwargs}
            entry = {"api": api, "kwargs": {k: encode(v) for k, v in bound.items()},
                     "tunable": api in TUNABLE, "custom_op": TUNABLE.get(api), "_raw": bound}
            Recorder.active.calls.append(entry)
            return _fake_result(api, bound)

        recorder.__fi_recorder__ = api
        return recorder

    # classes (wrappers: plan/run objects) ----------------------------------------------------
    def wrap_class(self, api: str, cls):
        class ClassRecorder:
            __fi_recorder__ = api

            def __init__(self, *args, **kwargs):
                self._api = api
                _record_method(cls, "__init__", api, (self, *args), kwargs)

            def __getattr__(self, item):
                if item.startswith("__"):
                    raise AttributeError(item)
                real = getattr(cls, item, None)

                def method(*args, **kwargs):
                    bound = _record_method(cls, item, f"{api}.{item}", (self, *args), kwargs)
                    return _fake_result(f"{api}.{item}", bound)

                if real is not None and not callable(real):
                    raise AttributeError(item)
                return method

        ClassRecorder.__name__ = cls.__name__
        ClassRecorder.__qualname__ = cls.__qualname__
        return ClassRecorder


def _record_method(cls, name: str, api: str, args, kwargs) -> dict:
    fn = getattr(cls, name, None)
    bound = None
    if fn is not None:
        try:
            b = inspect.signature(fn).bind(*args, **kwargs)
            b.apply_defaults()
            bound = dict(b.arguments)
            bound.pop("self", None)
        except (TypeError, ValueError):
            bound = None
    if bound is None:
        bound = {"*args": list(args[1:]), **kwargs}
    Recorder.active.calls.append({"api": api, "kwargs": {k: encode(v) for k, v in bound.items()},
                                  "tunable": False, "custom_op": None, "_raw": bound})
    return bound


def _fake_result(api: str, bound: dict):
    """What the FlashInfer entry point returns, shaped as FlashInfer shapes it (the caller only
    reshapes it; nothing reads its values)."""
    if api == "flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla":
        q = bound["query"]
        out = bound.get("out")
        if out is None:
            out = torch.empty((*q.shape[:-1], bound["kv_lora_rank"]), dtype=torch.bfloat16)
        if bound.get("return_lse"):
            lse = torch.empty((q.shape[0] * (q.shape[1] if q.dim() == 4 else 1), q.shape[-2]), dtype=torch.float32)
            return out, lse
        return out
    if api.endswith(".run") or api.endswith(".forward"):
        out = bound.get("out")
        if isinstance(out, torch.Tensor):
            return out
        q = next((v for v in bound.values() if isinstance(v, torch.Tensor)), None)
        return torch.empty_like(q) if q is not None else None
    return None


def _canonical_api(obj, module_name: str, attr: str) -> str:
    mod = getattr(obj, "__module__", module_name) or module_name
    # flashinfer.mla._core.X is exported as flashinfer.mla.X (and flashinfer.decode.X aliases it)
    if mod.startswith("flashinfer.mla"):
        mod = "flashinfer.mla"
    return f"{mod}.{getattr(obj, '__qualname__', attr)}"


_REPLACED: dict[int, Any] = {}  # id(original) -> recorder; _ORIGINALS keeps the ids valid
_ORIGINALS: list[Any] = []


def install_flashinfer_recorders(rec: Recorder) -> dict:
    """Replace FlashInfer's attention functions/classes everywhere SGLang can reach them: as
    attributes of the FlashInfer modules (``flashinfer.decode.X(...)``) and as names SGLang
    modules imported (``from flashinfer import X``). Returns {id(original): recorder}."""
    import flashinfer  # noqa: F401

    replaced = _REPLACED
    for mname in RECORDED_MODULES:
        try:
            mod = importlib.import_module(mname)
        except Exception:
            continue
        for attr, obj in list(vars(mod).items()):
            if attr.startswith("_") or getattr(obj, "__fi_recorder__", None):
                continue
            omod = getattr(obj, "__module__", "") or ""
            if not omod.startswith("flashinfer") or omod.startswith(("flashinfer.utils", "flashinfer.jit",
                                                                      "flashinfer.autotuner", "flashinfer.api_logging")):
                continue
            if id(obj) not in replaced:
                api = _canonical_api(obj, mname, attr)
                if inspect.isclass(obj):
                    replaced[id(obj)] = rec.wrap_class(api, obj)
                elif callable(obj):
                    replaced[id(obj)] = rec.wrap_function(api, obj)
                else:
                    continue
                rec._originals[api] = obj
                _ORIGINALS.append(obj)
            setattr(mod, attr, replaced[id(obj)])
    # `from flashinfer import X` / `from flashinfer.decode import X` bindings in flashinfer's
    # top-level package and in every imported SGLang module.
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "flashinfer" or name.startswith("sglang")):
            continue
        for attr, obj in list(vars(mod).items()):
            if id(obj) in replaced and not getattr(obj, "__fi_recorder__", None):
                setattr(mod, attr, replaced[id(obj)])
    return replaced


# --------------------------------------------------------------------------------------------
# narrow stand-ins for CUDA / Triton / JIT kernels SGLang calls on the way to FlashInfer


PATCH_LOG: list[str] = []


def _seqlens_expand(extend_seq_lens, seq_lens, total_len, max_q_len):
    # sglang.kernels.ops.attention.pad.seqlens_expand_triton (asserts CUDA tensors, then a Triton
    # kernel): per request, kv_len - qo_len + 1 .. kv_len clamped at 0, concatenated -> [total_len]
    out = torch.empty(total_len, dtype=torch.int32)
    pos = 0
    for qo, kv in zip(extend_seq_lens.tolist(), seq_lens.tolist()):
        out[pos:pos + qo] = torch.clamp(torch.arange(kv - qo + 1, kv + 1, dtype=torch.int32), min=0)
        pos += qo
    return out


#: (module, attribute, replacement, why)
_PATCHES = [
    ("sglang.srt.layers.attention.dsa_backend", "seqlens_expand_triton", _seqlens_expand,
     "asserts CUDA tensors then runs a Triton kernel; the same expansion in torch"),
]


class _JitModule:
    """What sglang.kernels.jit's ``load_jit`` returns, without compiling: no CUDA toolchain, no
    GPU. Its kernels (KV-row writes, fused concat/quantize tails) run nothing; SGLang's Python
    around them allocates every output, so shapes are unchanged."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)

        def kernel(*args, **kwargs):
            PATCH_LOG.append(f"jit {self._name}.{item} not run (values only)")
            if item == "get_max_active_clusters":
                # occupancy probe: only sets compile flags of a JIT module that is never built
                return 1

        return kernel


def _load_jit(*args, **kwargs):
    return _JitModule("_".join(str(a) for a in args))


def _patch_load_jit() -> str:
    import sglang.kernels.jit.utils as ju
    import sglang.kernels.jit.utils.compile as jc
    import sglang.kernels.jit.utils.compile.loader as jl

    original = jl.load_jit
    for mod in (ju, jc, jl):
        mod.load_jit = _load_jit
    for name, mod in list(sys.modules.items()):
        if name.startswith("sglang") and mod is not None and getattr(mod, "load_jit", None) is original:
            mod.load_jit = _load_jit
    return ("sglang.kernels.jit load_jit: returns an uncompiled module whose kernels run nothing "
            "(JIT CUDA needs nvcc + libcudart + a GPU; outputs are allocated by SGLang's Python)")


def _patch_deep_gemm() -> str | None:
    """DeepGEMM is installed with the server but its extension needs libnvrtc (CUDA): the DSA
    indexer asks it for the SM count and the paged-MQA-logits schedule (an indexer-kernel
    schedule, not an attention input). Stand-in: the fake GPU's SM count, and a schedule tensor
    of DeepGEMM's shape ([num_sms + 1, 2] int32)."""
    try:
        import deep_gemm  # noqa: F401
        return None
    except Exception:
        pass
    stub = types.ModuleType("deep_gemm")
    stub.__oracle_stub__ = True
    stub.get_num_sms = lambda: torch.cuda.get_device_properties(0).multi_processor_count

    def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms):
        PATCH_LOG.append("deep_gemm.get_paged_mqa_logits_metadata not run (indexer schedule)")
        return torch.zeros((num_sms + 1, 2), dtype=torch.int32)

    stub.get_paged_mqa_logits_metadata = get_paged_mqa_logits_metadata
    sys.modules["deep_gemm"] = stub
    return ("deep_gemm: import fails without libnvrtc; stub with get_num_sms (fake GPU's SM count) "
            "and get_paged_mqa_logits_metadata (zeros [num_sms + 1, 2] int32: DSA indexer schedule)")


def _patch_triton_launch() -> str:
    """Triton kernels (``kernel[grid](...)``: index tables, KV writes, padding) are not launched:
    there is no GPU. Every one SGLang launches on this path writes into tensors SGLang's Python
    allocated first, so no shape changes; each skipped launch is logged."""
    from triton.runtime.jit import KernelInterface

    if getattr(KernelInterface, "__oracle_no_launch__", False):
        return "triton: launches skipped (already installed)"

    def getitem(self, grid):
        name = getattr(self, "__name__", None) or getattr(getattr(self, "fn", None), "__name__", "?")

        def launch(*args, **kwargs):
            PATCH_LOG.append(f"triton {name} not launched (values only)")

        return launch

    KernelInterface.__getitem__ = getitem
    KernelInterface.__oracle_no_launch__ = True
    return ("triton KernelInterface.__getitem__: kernel[grid](...) launches nothing (no GPU); the "
            "kernels on these paths fill tensors SGLang allocated, shapes unchanged")


def _patch_sgl_kernel_host_queries() -> list[str]:
    """sgl_kernel is stubbed (cudastubs): its kernels raise if called. Its host-side query
    ``sgl_kernel.utils.is_arch_support_pdl`` is not a kernel; answer it with SGLang's own
    same-named query (sglang.kernels.jit.utils.is_arch_support_pdl: sm90+ -> True)."""
    import cudastubs
    from sglang.kernels.jit.utils import is_arch_support_pdl

    done = []
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith("sglang"):
            continue
        obj = vars(mod).get("is_arch_support_pdl")
        if isinstance(obj, cudastubs._Kernel):
            mod.is_arch_support_pdl = is_arch_support_pdl
            done.append(name)
    return [f"{n}.is_arch_support_pdl: sgl_kernel host query -> sglang.kernels.jit.utils.is_arch_support_pdl"
            for n in done]


#: attention backend modules the registry imports lazily; imported up front so the patches and
#: recorders below reach the names they bind at import (``from flashinfer import X``).
BACKEND_MODULES = (
    "sglang.srt.layers.attention.trtllm_mla_backend", "sglang.srt.layers.attention.flashinfer_mla_backend",
    "sglang.srt.layers.attention.flashinfer_backend", "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.attention.flashmla_backend", "sglang.srt.layers.attention.cutedsl_mla_backend",
    "sglang.srt.layers.attention.flashattention_backend", "sglang.srt.layers.attention.dsa_backend",
    "sglang.srt.layers.attention.hybrid_attn_backend", "sglang.srt.layers.attention.trtllm_mha_backend",
)


def _apply_patches() -> list[str]:
    applied = [_patch_load_jit(), _patch_triton_launch()]
    for m in BACKEND_MODULES:
        try:
            importlib.import_module(m)
        except Exception as e:
            applied.append(f"(import {m} failed: {type(e).__name__}: {e})")
    applied += _patch_sgl_kernel_host_queries()
    dg = _patch_deep_gemm()
    if dg:
        applied.append(dg)
    for modname, attr, repl, why in _PATCHES:
        try:
            mod = importlib.import_module(modname)
        except Exception as e:  # module absent in this SGLang: nothing to patch
            applied.append(f"SKIP {modname}.{attr}: {e}")
            continue
        if hasattr(mod, attr):
            setattr(mod, attr, repl)
            applied.append(f"{modname}.{attr}: {why}")
    return applied


# --------------------------------------------------------------------------------------------
# the ModelRunner shell


KV_POOL_PAGES = 16  # a small KV pool: its page count only sizes kv_cache.shape[0]


def build_runner(sa, mr, *, batch: int, layer_id: int = 0, kv_pool_pages: int = KV_POOL_PAGES):
    """A ``ModelRunner`` without ``__init__`` (no weights, no NCCL, no memory profiling), carrying
    what ModelRunner.__init__/initialize set and the attention backends read, built by SGLang's
    own functions and pool classes on the CPU."""
    from sglang.srt.configs.model_config import AttentionArch, is_deepseek_dsa
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.model_runner import ModelRunner, resolve_draft_attention_backend
    from sglang.srt.model_executor.model_runner_components import misc_utils
    from sglang.srt.runtime_context import get_schedule, get_spec

    r = object.__new__(ModelRunner)
    r.server_args = sa
    r.model_config = mr.model_config
    r.gpu_id = mr.gpu_id
    r.is_draft_worker = mr.is_draft_worker
    r.device = "cpu"  # the fake GPU has no driver: every runner-owned tensor lives on the CPU
    r.dtype = mr.dtype
    r.spec_algorithm = mr.spec_algorithm
    r.draft_attention_backend = resolve_draft_attention_backend(
        draft_attention_backend=None, is_draft_worker=mr.is_draft_worker)
    r.is_generation = mr.model_config.is_generation
    r.page_size = get_schedule().page_size
    r.use_mla_backend = mr.model_config.attention_arch == AttentionArch.MLA
    r.attention_chunk_size = mr.model_config.attention_chunk_size
    r.init_new_workspace = False
    r.lora_manager = None
    r.hisparse_coordinator = None
    r.enable_hisparse = False
    r.canary_manager = None
    r.sliding_window_size = None
    r.mtp_draft_device_pools = ()
    r.mtp_draft_mamba_pools = ()
    r.is_hybrid_swa = mr.model_config.is_hybrid_swa
    r.is_hybrid_swa_compress = mr.model_config.is_hybrid_swa_compress
    r.ngram_embedding_manager = types.SimpleNamespace(enabled=False, table=None)
    r.max_running_requests = mr.max_running_requests
    r.layer_info = types.SimpleNamespace(start_layer=0, end_layer=mr.model_config.num_hidden_layers,
                                         num_effective_layers=1)
    # ModelRunner.__init__: the chunked-prefix-cache gate (FlashInfer MLA reads it)
    misc_utils.maybe_disable_chunked_prefix_cache(use_mla_backend=r.use_mla_backend,
                                                  is_draft_worker=r.is_draft_worker)
    # ModelRunner.configure_kv_cache_dtype with the model's quant config (no weights needed)
    r.model = _ModelStub(quant_config=_quant_config(mr.model_config))
    ModelRunner.configure_kv_cache_dtype(r)

    # kv_cache_configurator.py: ReqToTokenPool(max_context_len = context_len + 4 [+ draft tokens])
    extra = 4 + (get_spec().speculative_num_draft_tokens or 0)
    r.req_to_token_pool = ReqToTokenPool(size=batch, max_context_len=mr.model_config.context_len + extra,
                                         device="cpu", enable_memory_saver=False)
    r.token_to_kv_pool_allocator = None
    size = kv_pool_pages * r.page_size
    hf = mr.model_config.hf_config
    if is_deepseek_dsa(hf):
        from sglang.srt.configs.model_config import (get_dsa_index_head_dim, get_dsa_index_kpool,
                                                     get_dsa_index_kpool_compress)
        from sglang.srt.mem_cache.kv_cache_configurator import calculate_mla_kv_cache_dim
        from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
        from sglang.srt.runtime_context import max_speculative_num_draft_tokens

        # kv_cache_configurator.py _build_dsa_kv_pool
        r.token_to_kv_pool = DSATokenToKVPool(
            size, page_size=r.page_size, dtype=r.kv_cache_dtype, kv_lora_rank=mr.model_config.kv_lora_rank,
            qk_rope_head_dim=mr.model_config.qk_rope_head_dim, layer_num=1, device="cpu",
            kv_cache_dim=calculate_mla_kv_cache_dim(model_config=mr.model_config, kv_cache_dtype=r.kv_cache_dtype),
            enable_memory_saver=False, start_layer=layer_id, end_layer=layer_id + 1,
            index_head_dim=get_dsa_index_head_dim(hf), index_kpool=get_dsa_index_kpool(hf),
            index_kpool_compress=get_dsa_index_kpool_compress(hf),
            tail_extra_slots=(max_speculative_num_draft_tokens() or 0), max_running_requests=batch)
    else:
        # kv_cache_configurator.py _build_mla_kv_pool
        r.token_to_kv_pool = MLATokenToKVPool(
            size, page_size=r.page_size, dtype=r.kv_cache_dtype, kv_lora_rank=mr.model_config.kv_lora_rank,
            qk_rope_head_dim=mr.model_config.qk_rope_head_dim, layer_num=1, device="cpu",
            enable_memory_saver=False, start_layer=layer_id, end_layer=layer_id + 1)
    r.kv_index_translator = KVIndexTranslator(
        req_to_token=r.req_to_token_pool.req_to_token, token_to_kv_pool_allocator=None,
        token_to_kv_pool=r.token_to_kv_pool, page_size=r.page_size or 1, device="cpu",
        is_draft_worker=r.is_draft_worker)
    return r


class _ModelStub(torch.nn.Module):
    """``ModelRunner.model`` before weights: what configure_kv_cache_dtype and _dummy_run read.
    ``forward`` is set per run to the one-layer attention forward."""

    def __init__(self, quant_config=None):
        super().__init__()
        self.quant_config = quant_config
        self.shared_experts_config = None
        self.layer_forward = None

    def forward(self, input_ids, positions, forward_batch, **kwargs):
        return self.layer_forward(input_ids, positions, forward_batch)


def _quant_config(model_config):
    """The checkpoint's QuantizationConfig, as the loader builds it (model_loader/loader.py
    _get_quantization_config); it decides kv_cache_dtype=auto (kv_cache_quant_algo) and the
    attention layer's k/v scales."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import _get_quantization_config

    return _get_quantization_config(model_config, LoadConfig())


def build_attention_backend(runner):
    """ModelRunner.init_attention_backends (model_runner.py), without the aux hidden-state capture
    (EAGLE3/DFLASH only) and the q-proj replication (DCP only)."""
    from sglang.srt.model_executor.model_runner_components.attention_backend_setup import (
        build_attention_backends, resolve_attention_backend_strs)

    resolved = resolve_attention_backend_strs(model_runner=runner)
    runner.prefill_attention_backend_str = resolved.prefill
    runner.decode_attention_backend_str = resolved.decode
    backends = build_attention_backends(model_runner=runner)
    runner.attn_backend = backends.attn_backend
    runner.decode_attn_backend = backends.decode_attn_backend
    runner.decode_attn_backend_group = backends.decode_attn_backend_group
    runner.kv_index_translator.bind_and_verify_backends([runner.attn_backend, runner.decode_attn_backend])
    return runner.attn_backend


def build_attention_layer(runner, *, layer_id: int):
    """The model's attention module, built by SGLang on the CPU (weights uninitialized)."""
    from sglang.srt.models.deepseek_v2 import DeepseekV2AttentionMLA

    hf = runner.model_config.hf_config
    rope_scaling = getattr(hf, "rope_scaling", None)
    with torch.device("cpu"):
        return DeepseekV2AttentionMLA(
            config=hf, hidden_size=hf.hidden_size, num_heads=hf.num_attention_heads,
            qk_nope_head_dim=hf.qk_nope_head_dim, qk_rope_head_dim=hf.qk_rope_head_dim,
            v_head_dim=hf.v_head_dim, q_lora_rank=getattr(hf, "q_lora_rank", None),
            kv_lora_rank=hf.kv_lora_rank, rope_theta=getattr(hf, "rope_theta", 10000),
            rope_scaling=dict(rope_scaling) if rope_scaling else None,
            max_position_embeddings=getattr(hf, "max_position_embeddings", 8192),
            quant_config=runner.model.quant_config, layer_id=layer_id,
            prefix=f"model.layers.{layer_id}.self_attn", alt_stream=None)


# --------------------------------------------------------------------------------------------
# the dummy pass


class _StopAfterAttention(torch.nn.Module):
    """Wraps the layer's ``attn_mqa`` (a real RadixAttention): runs it, then ends the forward."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        raise _Stop(out)

    def __getattr__(self, item):
        try:
            return super().__getattr__(item)
        except AttributeError:
            return getattr(super().__getattr__("inner"), item)


def _layer_forward(attn, info: dict):
    """What DeepseekV2AttentionMLA.forward does for one layer in the dummy pass, from its own
    dispatch: forward_absorb_prepare's outputs (shaped as it shapes them; the FP8 projections
    cannot run on a CPU) handed to its own forward_absorb_core."""
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    def forward(input_ids, positions, forward_batch):
        method = attn.dispatch_attn_forward_method(forward_batch)
        info["attn_forward_method"] = method.name
        info["current_attention_backend"] = attn.current_attention_backend
        if method != AttnForwardMethod.MLA:
            info["note"] = f"forward method {method.name}: not the absorbed-MLA path; not run"
            return None
        T = input_ids.shape[0]
        H = attn.num_local_heads
        dt = attn.kv_b_proj.weight.dtype if attn.kv_b_proj.weight.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        # forward_absorb_prepare: q = q_b_proj(q_a) -> [T, H, qk_nope + qk_rope]; latent = [T, kv_lora + rope]
        q = torch.empty((T, H, attn.qk_nope_head_dim + attn.qk_rope_head_dim), dtype=dt)
        latent = torch.empty((T, attn.kv_lora_rank + attn.qk_rope_head_dim), dtype=dt)
        k_nope = latent[..., : attn.kv_lora_rank].unsqueeze(1)
        k_pe = latent[..., attn.kv_lora_rank:].unsqueeze(1)
        q_nope, q_pe = q.split([attn.qk_nope_head_dim, attn.qk_rope_head_dim], dim=-1)
        # q_nope_out = bmm(q_nope^T, w_kc)^T: [H, T, kv_lora] viewed [T, H, kv_lora]
        q_nope_out = torch.empty((H, T, attn.kv_lora_rank), dtype=dt).transpose(0, 1)
        topk_indices = None
        if attn.use_dsa:
            from sglang.srt.configs.model_config import get_dsa_index_topk

            # the indexer's output: one row of index_topk KV positions per query token (int32)
            topk_indices = torch.zeros((T, get_dsa_index_topk(attn_config(attn))), dtype=torch.int32)
        info["model_inputs"] = {"q_nope_out": encode(q_nope_out), "q_pe": encode(q_pe), "k_nope": encode(k_nope),
                                "k_pe": encode(k_pe), "topk_indices": encode(topk_indices),
                                "scaling": attn.scaling, "fuse_rope_for_trtllm_mla": attn._fuse_rope_for_trtllm_mla(forward_batch)}
        return attn.forward_absorb_core(q_pe, k_pe, q_nope_out, k_nope, forward_batch, None, positions,
                                        topk_indices, None)

    return forward


def attn_config(attn):
    return attn._oracle_hf_config


def _alloc_buffers(runner, batch: int, tokens_per_req: int):
    """EagerRunner._autotune_buffers -> BaseRunner._alloc_dummy_decode_buffers; the logits buffer
    (max_bs * tokens x vocab fp32) is left out: the autotune forward never touches logits
    (run_lm_head=False) and it would only cost CPU memory here."""
    from sglang.srt.model_executor.runner.base_runner import _allocate_decode_buffers
    from sglang.srt.utils.common import require_mlp_tp_gather

    mr = runner
    return _allocate_decode_buffers(
        device=mr.device, max_bs=batch, max_num_token=batch * tokens_per_req,
        hidden_size=mr.model_config.hidden_size, vocab_size=mr.model_config.vocab_size,
        dtype=mr.model_config.dtype, is_encoder_decoder=mr.model_config.is_encoder_decoder,
        require_mlp_tp_gather=require_mlp_tp_gather(),
        seq_len_fill_value=mr.attn_backend.get_cuda_graph_seq_len_fill_value(),
        encoder_len_fill_value=0, num_tokens_per_req=tokens_per_req, cache_loc_dtype=torch.int64,
        enable_mamba_track=False, ne_token_table=None,
        hc_hidden_size=getattr(mr.model_config, "hc_hidden_size", None),
        pp_proxy_topk_size=mr.get_pp_proxy_topk_size(),
        pp_proxy_residual_num_blocks=mr.get_pp_proxy_residual_num_blocks(),
        allocate_logits_buffer=False)


def _backend_description(backend) -> dict:
    d = {"class": f"{type(backend).__module__}.{type(backend).__qualname__}"}
    for name in ("decode_backend", "prefill_backend", "primary"):
        child = getattr(backend, name, None)
        if child is not None and hasattr(child, "init_forward_metadata"):
            d[name] = f"{type(child).__module__}.{type(child).__qualname__}"
    for attr in ("prefill_attention_backend_str", "decode_attention_backend_str", "dsa_prefill_impl",
                 "dsa_decode_impl", "backend", "data_type", "kv_cache_dtype", "page_size", "physical_page_size",
                 "max_context_len", "workspace_size", "use_fused_topk"):
        if hasattr(backend, attr):
            d[attr] = encode(getattr(backend, attr))
    return d


@contextlib.contextmanager
def _single_process_tp_group():
    """_dummy_run barriers the TP group before the forward. One process here and no groups built
    (no torch.distributed): state a group whose barrier returns at once, through SGLang's own
    ``get_parallel().override`` (restored on exit), only if none is written."""
    from sglang.srt.runtime_context import get_parallel

    par = get_parallel()
    try:
        par.tp_group
        have = True
    except RuntimeError:
        have = False
    if have:
        yield
        return
    with par.override(tp_group=types.SimpleNamespace(barrier=lambda *a, **k: None)):
        yield


def record_attention_trace(sa, mr, batch: int, tokens_per_req: int, forward_mode: str, *,
                           layer_id: int = 0, kv_pool_pages: int = KV_POOL_PAGES, path: str = "dummy") -> dict:
    """Everything: backend, every FlashInfer attention call (tunable or not), patches, stop point.

    ``path="dummy"``: the autotune dummy pass (``BaseRunner._dummy_run``: eager
    ``init_forward_metadata``). ``path="capture"``: the same batch as the decode CUDA-graph
    capture sets it up (``init_cuda_graph_state(max_bs=batch, max_num_tokens=batch*tokens)`` as
    DecodeCudaGraphRunner.__init__ does, then ``init_forward_metadata_out_graph(in_capture=True)``
    as capture_one_shape does): the shapes the captured graphs, hence serving, look up."""
    from sglang.srt.model_executor.runner.base_runner import BaseRunner

    assert forward_mode in ("decode", "target_verify"), forward_mode
    assert path in ("dummy", "capture"), path
    if forward_mode == "target_verify":
        assert mr.spec_algorithm.is_speculative(), "target_verify needs a speculative algorithm"
    else:
        assert not mr.spec_algorithm.is_speculative(), "a speculative target runs TARGET_VERIFY"
    out: dict = {"batch": batch, "tokens_per_req": tokens_per_req, "forward_mode": forward_mode,
                 "layer_id": layer_id, "path": path}
    PATCH_LOG.clear()
    rec = Recorder()
    with _CpuDevice():
        patches = _apply_patches()
        runner = build_runner(sa, mr, batch=batch, layer_id=layer_id, kv_pool_pages=kv_pool_pages)
        out["runner"] = {"device": "cpu (cuda on the server)", "page_size": runner.page_size,
                         "kv_cache_dtype": encode(runner.kv_cache_dtype),
                         "kv_cache_dtype_str": runner.kv_cache_dtype_str, "dtype": encode(runner.dtype),
                         "context_len": runner.model_config.context_len,
                         "max_running_requests": runner.max_running_requests,
                         "req_to_token": encode(runner.req_to_token_pool.req_to_token),
                         "kv_pool": f"{type(runner.token_to_kv_pool).__name__}",
                         "kv_buffer": encode(runner.token_to_kv_pool.kv_buffer[0])}
        # the backend modules are imported (by _apply_patches): replace their FlashInfer names
        install_flashinfer_recorders(rec)
        backend = build_attention_backend(runner)
        install_flashinfer_recorders(rec)  # modules imported while building
        out["backend"] = _backend_description(backend)
        init_calls = len(rec.calls)
        attn = build_attention_layer(runner, layer_id=layer_id)
        attn._oracle_hf_config = runner.model_config.hf_config
        qm = getattr(attn.attn_mqa, "quant_method", None)
        if qm is not None and hasattr(qm, "process_weights_after_loading"):
            # the loader's post-load step for the layer's KV-cache scales; with no k/v_scale in the
            # checkpoint (these presets have none) it sets k_scale_float = v_scale_float = 1.0
            qm.process_weights_after_loading(attn.attn_mqa)
        attn.attn_mqa = _StopAfterAttention(attn.attn_mqa)
        info: dict = {}
        runner.model.layer_forward = _layer_forward(attn, info)
        buffers = _alloc_buffers(runner, batch, tokens_per_req)
        if path == "capture":
            backend.init_cuda_graph_state(batch, batch * tokens_per_req)
            # capture_one_shape: init_forward_metadata_out_graph(in_capture=True) on the graph
            # runner's buffers (seq_lens filled with the same fill value) instead of the eager init
            backend.init_forward_metadata = lambda fb: backend.init_forward_metadata_out_graph(fb, in_capture=True)
        shell = types.SimpleNamespace(model_runner=runner)
        stopped = None
        try:
            with _single_process_tp_group():
                BaseRunner._dummy_run(shell, batch_size=batch, buffers=buffers, run_ctx=None)
            stopped = "forward returned without reaching attn_mqa"
        except _Stop:
            stopped = "after attn_mqa"
        except Exception as e:  # a non-FlashInfer kernel (e.g. sgl_kernel) ended the pass
            stopped = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            out["stop_traceback"] = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}"
                                     for f in traceback.extract_tb(e.__traceback__)]
        out["stopped"] = stopped
        out["layer"] = info
        fm = getattr(backend, "forward_decode_metadata", None) or getattr(backend, "forward_metadata", None)
        out["metadata_class"] = type(fm).__name__ if fm is not None else None
    out["patches"] = patches + sorted(set(PATCH_LOG))
    out["init_calls"] = [{k: v for k, v in c.items() if k != "_raw"} for c in rec.calls[:init_calls]]
    out["forward_calls"] = [{k: v for k, v in c.items() if k != "_raw"} for c in rec.calls[init_calls:]]
    out["tunable_calls"] = [dict(api=c["api"], kwargs=c["kwargs"], custom_op=c["custom_op"],
                                 backend=out["backend"]["class"])
                            for c in rec.calls if c["tunable"]]
    # the values behind seq_lens (the dummy pass fills seq_lens with the backend's fill value)
    out["tunable_values"] = [{k: {"min": int(v.min()), "max": int(v.max())}
                              for k, v in c["_raw"].items()
                              if isinstance(v, torch.Tensor) and k in ("seq_lens", "sparse_mla_top_k_lens") and v.numel()}
                             for c in rec.calls if c["tunable"]]
    return out


def record_attention_calls(sa, mr, batch: int, tokens_per_req: int, forward_mode: str, *,
                           path: str = "dummy") -> list[dict]:
    """The tunable FlashInfer attention calls of one MLA layer in the autotune dummy pass:
    [{"api", "kwargs" (bound to FlashInfer's signature, defaults applied, recipes.encode form),
    "custom_op", "backend" (the attention backend class that made the call)}]."""
    return record_attention_trace(sa, mr, batch, tokens_per_req, forward_mode, path=path)["tunable_calls"]
