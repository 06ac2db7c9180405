"""SGLang 0.5.23's own MoE layer, run on CPU, with every FlashInfer entry point it reaches recorded.

    record_moe_calls(sa, mr, m_tokens) -> [{"api": "flashinfer.fused_moe.trtllm_fp8_block_scale_moe",
                                            "kwargs": {...every parameter, defaults applied...}}]

``sa`` is a resolved ServerArgs, ``mr`` a ``sglang_env.ModelRunnerView`` (target or draft worker),
and the runtime context is published for the rank of interest (``sglang_env.publish``). Nothing
here re-implements SGLang's MoE logic; it runs it:

1. **Process setup** as a scheduler does it between publish and model load:
   ``initialize_dp_attention`` (distributed/bootstrap.py), then ``initialize_moe_config`` and the
   FP8/FP4/BF16 GEMM backend initializers (managers/scheduler.py init_moe_gemm_config). Without
   ``initialize_moe_config`` every FusedMoE silently falls back to the Triton runner.
2. **The model's own construction.** The loader's ``_initialize_model`` builds the class the
   checkpoint names, with SGLang's quantization config (``_get_quantization_config``) and
   shared-expert fusion decision (``resolve_shared_experts_config``). So the MoE block gets
   exactly the arguments its decoder layer gives it (quant config incl. the NextN overrides,
   prefix, layer id, fused shared experts, routing method, swiglu limits, padding). Two narrow
   changes: attention classes (``_ATTENTION_CLASSES``) are an empty module (the real ones
   allocate RoPE caches on ``cuda``; none is on the MoE path), and the target's
   ``num_hidden_layers`` is cut to end at the first MoE layer (layer ids and prefixes stay the
   real ones; the draft's NextN model is built whole). The draft is built and run inside the
   scopes EAGLEWorkerV2 uses: ``draft_tp_context``, ``draft_pp_context``,
   ``speculative_moe_backend_context`` (so ``--speculative-moe-runner-backend`` applies),
   ``speculative_moe_a2a_backend_context`` and, for the build, ``draft_model_build_scope``.
3. **Weights.** ``quant_method.create_weights`` allocates them (CPU ``torch.empty``: untouched
   pages cost no memory); ``quant_method.process_weights_after_loading`` then runs on the routed
   experts as the loader runs it, so the runner sees the post-processed (padded, shuffled,
   interleaved) layout. FlashInfer's weight-layout helpers run for real where they are torch
   code; the ones that need a GPU get a CPU stand-in that allocates the result FlashInfer
   documents (``_weight_fakes``: ``block_scale_interleave`` -> its flat swizzled buffer of
   ``_compute_swizzled_layout_sf_size`` elements, ``interleave_moe_weights_for_sm90_mixed_gemm``
   -> a tensor like its input); SGLang's own code then reshapes and views them.
4. **The forward.** The MoE block's own ``forward`` runs for ``m_tokens`` rows under the runner's
   ``model_context()`` (shared-expert layout) and, for a draft worker that captures decode CUDA
   graphs, ``model_capture_mode()`` (``_draft_graph_capture`` says why the target's pass is
   eager). Every function exported by ``flashinfer`` / ``flashinfer.fused_moe`` / its
   quantization and GEMM namespaces is swapped, in every module that imported it, for a recorder
   that binds the call to the function's signature (defaults applied), records it, and returns
   an output of the shape and dtype FlashInfer returns (``_fakes``); it never runs.

What is not SGLang's code (each is a patch in this file, undone when the call returns):

- process groups: ``FakeGroup`` objects with the configured widths and this rank; collectives
  are identities (the FlashInfer call precedes any reduction and does not depend on one);
- CUDA streams/events are no-ops; ``Tensor.cuda()`` returns the tensor; ``torch.compile``d
  helpers run eagerly; Triton launches are no-ops (Triton kernels only write into outputs their
  Python wrapper allocated, so those keep SGLang's shapes, dtypes and strides);
- SGLang custom ops (registered for CUDA only) get a CPU kernel that runs SGLang's own fake
  (meta) implementation and materializes its outputs on CPU, except the ops whose body is
  Python that calls FlashInfer (``_RUN_BODY_MODULES``: the trtllm MoE wrappers), which run
  their body so the FlashInfer call inside is recorded. Ops that ran through their fake are
  listed in ``info["sglang_ops_faked_on_cpu"]`` (e.g. ``per_token_group_quant``,
  ``flashinfer_fp4_quantize``, ``tiny_gemm_bf16``);
- the shared expert's MLP (``DeepseekV2MoE._forward_shared_experts``) returns zeros of its output
  shape: it is SGLang's dense FP8/NVFP4 linear path, not the MoE runner, and its output is only
  added to the routed result.

Values are encoded as autotune_cache/recipes.py ``encode`` spells them: tensors as shape, dtype
and layout (column-major when ``stride(-2) == 1 and stride(-1) != 1``), torch dtypes as
``{"dtype": ...}``, enums as ``{"enum": "<defining module>.<class>.<member>", "value": int}``
(SGLang passes some routing/activation types as plain ints through its custom-op schemas; those
stay ints, as FlashInfer receives them).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import sys
from pathlib import Path
from typing import Any, Callable

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


# ---------------------------------------------------------------------------------------------
# Value encoding (autotune_cache/recipes.py ``encode`` conventions)
# ---------------------------------------------------------------------------------------------

def _layout(t: torch.Tensor) -> str:
    if t.dim() >= 2 and t.stride(-2) == 1 and t.stride(-1) != 1:
        return "column_major"
    return "row_major"


def encode(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {"tensor": {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch."),
                           "layout": _layout(value)}}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, enum.Enum):
        cls = type(value)
        return {"enum": f"{cls.__module__}.{cls.__qualname__}.{value.name}", "value": int(value.value)}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


# ---------------------------------------------------------------------------------------------
# Patches: every change to SGLang / torch / FlashInfer state goes through one of these, and is
# undone when record_moe_calls returns.
# ---------------------------------------------------------------------------------------------

class _Patches:
    def __init__(self):
        self._undo: list[Callable[[], None]] = []

    def setattr(self, obj, name: str, value) -> None:
        """``setattr`` undone on exit: the previous own attribute comes back, or none if the
        value was inherited (``torch.Tensor.cuda``, a method of the instance's class)."""
        missing = object()
        own = vars(obj) if hasattr(obj, "__dict__") else {}
        old = own.get(name, missing)
        setattr(obj, name, value)
        self._undo.append(lambda: delattr(obj, name) if old is missing else setattr(obj, name, old))

    def replace_everywhere(self, original, replacement, prefixes=("sglang", "flashinfer")) -> int:
        """Swap ``original`` for ``replacement`` in every loaded module that bound it by name
        (``from flashinfer import X`` copies the function into the importer's namespace)."""
        n = 0
        for modname, mod in list(sys.modules.items()):
            if mod is None or not modname.startswith(prefixes):
                continue
            d = getattr(mod, "__dict__", None)
            if not d:
                continue
            for k, v in list(d.items()):
                if v is original:
                    self.setattr(mod, k, replacement)
                    n += 1
        return n

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


# ---------------------------------------------------------------------------------------------
# Process groups and streams
# ---------------------------------------------------------------------------------------------

class FakeGroup:
    """A GroupCoordinator as model construction and the MoE forward read it: widths and this
    rank's place. Collectives are identities (see module docstring)."""

    def __init__(self, name: str, world_size: int, rank_in_group: int):
        self.unique_name = name
        self.world_size = world_size
        self.rank_in_group = rank_in_group
        self.ranks = list(range(world_size))
        self.rank = rank_in_group
        self.local_rank = 0
        self.device_group = None
        self.cpu_group = None
        self.device = torch.device("cpu")
        # communicators SGLang probes for optional fast paths: none exist here
        for attr in ("pynccl_comm", "ca_comm", "qr_comm", "pcie_ipc_comm", "symm_mem_comm",
                     "torch_symm_mem_comm", "mq_broadcaster", "pymscclpp_comm", "npu_communicator",
                     "hpu_communicator", "xpu_communicator"):
            setattr(self, attr, None)
        self.use_pynccl = False
        self.use_custom_allreduce = False

    first_rank = property(lambda self: 0)
    last_rank = property(lambda self: self.world_size - 1)
    is_first_rank = property(lambda self: self.rank_in_group == 0)
    is_last_rank = property(lambda self: self.rank_in_group == self.world_size - 1)

    def all_reduce(self, x):
        return x

    def __repr__(self):
        return f"FakeGroup({self.unique_name}, rank {self.rank_in_group} of {self.world_size})"


_GROUPS = [  # (group, width, rank) names of the parallel context
    ("tp_group", "tp_size", "tp_rank"), ("pp_group", "pp_size", "pp_rank"),
    ("moe_ep_group", "moe_ep_size", "moe_ep_rank"), ("moe_tp_group", "moe_tp_size", "moe_tp_rank"),
    ("moe_dp_group", "moe_dp_size", "moe_dp_rank"), ("attn_tp_group", "attn_tp_size", "attn_tp_rank"),
    ("attn_cp_group", "attn_cp_size", "attn_cp_rank"), ("dcp_group", "dcp_size", "dcp_rank"),
    ("shared_experts_tp_group", "tp_size", "tp_rank"),
    ("world_group", "launch_world_size", "launch_world_rank"),
]


def _install_groups(P: _Patches) -> None:
    """The group handles ``initialize_model_parallel`` would stamp into the parallel context."""
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.runtime_context import get_parallel

    par = get_parallel()

    def read(name, default):
        try:
            return getattr(par, name)
        except Exception:
            return default

    values = {g: FakeGroup(g, read(w, 1), read(r, 0)) for g, w, r in _GROUPS}
    saved = dict(par._stamp)
    par.override_permanently(**values)
    P._undo.append(lambda: (par._stamp.clear(), par._stamp.update(saved)))
    # draft_pp_context() swaps in the single-member pipeline group the launcher builds
    P.setattr(ps, "_SELF_PP", FakeGroup("self_pp", 1, 0))


class _Stream:
    def __init__(self, *a, **k):
        pass

    def wait_stream(self, *a, **k):
        pass

    def wait_event(self, *a, **k):
        pass

    def record_event(self, *a, **k):
        return _Event()

    def synchronize(self):
        pass

    def query(self):
        return True


class _Event(_Stream):
    def record(self, *a, **k):
        pass

    def wait(self, *a, **k):
        pass


def _install_streams(P: _Patches) -> None:
    """CUDA streams/events do not exist without a driver; the MoE code only orders work on them."""
    cur = _Stream()
    P.setattr(torch.cuda, "Stream", _Stream)
    P.setattr(torch.cuda, "Event", _Event)
    P.setattr(torch.cuda, "current_stream", lambda *a, **k: cur)
    P.setattr(torch.cuda, "default_stream", lambda *a, **k: cur)
    P.setattr(torch.cuda, "stream", lambda s=None: contextlib.nullcontext(s))
    P.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    P.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    # Tensor.record_stream ties a tensor's memory to a CUDA stream (the A2A forward of DeepseekV2MoE
    # does it for the shared expert's output); there is no stream allocator here.
    P.setattr(torch.Tensor, "record_stream", lambda self, *a, **k: None)


class _FakeProcessGroup:
    """The torch ``ProcessGroup`` FlashInfer's A2A dispatcher reads from ``tp_group.device_group``:
    its width and this rank (it sizes the A2A workspace and FlashInfer's ``Mapping`` from them)."""

    def __init__(self, size: int, rank: int):
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


class _CpuMoeAlltoAll:
    """``flashinfer.comm.MoeAlltoAll`` without its MNNVL workspace (a CUDA fabric allocation) for
    ``--moe-a2a-backend flashinfer``. Returns what FlashInfer 0.7.2.post1 documents
    (comm/trtllm_moe_alltoall.py): ``dispatch`` one tensor per payload, each
    ``[ep_size, runtime_max_tokens_per_rank, *payload.shape[1:]]`` of the payload's dtype;
    ``get_combine_payload_tensor_in_workspace`` ``[ep_size, runtime_max_tokens_per_rank, hidden]``;
    ``combine`` ``[local_num_tokens, elements_per_token]``. It moves no data: the FlashInfer MoE
    call between dispatch and combine sees SGLang's own shapes, dtypes and flags."""

    def __init__(self, mapping, max_num_tokens: int, top_k: int, num_experts: int, *args, **kwargs):
        self.ep_size, self.ep_rank = mapping.moe_ep_size, mapping.moe_ep_rank
        self.max_num_tokens, self.top_k, self.num_experts = max_num_tokens, top_k, num_experts
        self._local_num_tokens = 0

    def dispatch(self, token_selected_experts, input_payloads, runtime_max_tokens_per_rank, *args, **kwargs):
        self._local_num_tokens = token_selected_experts.shape[0]
        return [torch.empty(self.ep_size, runtime_max_tokens_per_rank, *t.shape[1:], dtype=t.dtype)
                for t in input_payloads]

    def get_combine_payload_tensor_in_workspace(self, runtime_max_tokens_per_rank, hidden_size, dtype):
        return torch.empty(self.ep_size, runtime_max_tokens_per_rank, hidden_size, dtype=dtype)

    def combine(self, payload, runtime_max_tokens_per_rank, payload_in_workspace=False, output_dtype=None,
                *args, output=None, **kwargs):
        if output is not None:
            return output
        return torch.empty(self._local_num_tokens, payload.shape[-1], dtype=output_dtype or payload.dtype)


def _install_flashinfer_a2a(P: _Patches, m_tokens: int) -> None:
    """``--moe-a2a-backend flashinfer``: SGLang's FlashinferDispatcher (token_dispatcher/flashinfer.py)
    runs as written, on a ``_FakeProcessGroup`` and ``_CpuMoeAlltoAll`` (its workspace-size helper
    JIT-builds a CUDA module, so it answers 0: the workspace is never allocated here). The autotune
    pass is a decode-shaped batch (``is_extend_in_batch`` False: the A2A path, not the prefill
    all-gather); every attention-DP rank contributes ``m_tokens`` rows, as the scheduler's
    ``global_num_tokens`` would state (dp_attention.py ``_DpGatheredBufferWrapper``)."""
    from sglang.srt.layers import dp_attention
    from sglang.srt.layers.moe.token_dispatcher import flashinfer as fi_dispatcher
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend
    from sglang.srt.runtime_context import get_parallel

    if not get_moe_a2a_backend().is_flashinfer():
        return
    par = get_parallel()
    P.setattr(par.tp_group, "device_group", _FakeProcessGroup(par.tp_size, par.tp_rank))
    P.setattr(fi_dispatcher, "MoeAlltoAll", _CpuMoeAlltoAll)
    P.setattr(fi_dispatcher, "moe_a2a_get_workspace_size_per_rank", lambda *a, **k: 0)
    if par.attn_dp_size > 1:
        P.setattr(dp_attention._DpGatheredBufferWrapper, "_global_num_tokens", [m_tokens] * par.attn_dp_size)


def _install_device_shims(P: _Patches) -> None:
    """Tensors stay on CPU, and GPU kernel launches that only write into buffers their Python
    caller allocated do nothing (the buffers keep the shapes, dtypes and strides SGLang gave
    them; their contents are never read by the recorder):

    - ``Tensor.cuda()`` returns the tensor (process_weights_after_loading moves small per-expert
      scalars with it);
    - ``torch.compile``d helpers run eagerly (Dynamo probes the CUDA RNG state);
    - a Triton kernel launch (``JITFunction.run``; ``Autotuner.run``, which would benchmark) is a
      no-op: Triton kernels write into outputs allocated by their Python wrapper."""
    P.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    # Triton launch-grid helpers (kernels/ops/moe/ep_moe_kernels.py) size grids from the SM's thread
    # limit, which fakegpu's properties leave out: 2048 on sm90 and sm100 alike.
    props = torch.cuda.get_device_properties(0)
    if not hasattr(props, "max_threads_per_multi_processor"):
        P.setattr(props, "max_threads_per_multi_processor", 2048)
    # torch.compile'd helpers (top-k post-processing) run eagerly: Dynamo probes the CUDA RNG
    import torch._dynamo as dynamo

    P.setattr(dynamo.config, "disable", True)
    try:
        import triton.runtime.autotuner as ta
        import triton.runtime.jit as tj
    except ImportError:
        return
    P.setattr(tj.JITFunction, "run", lambda self, *a, **k: None)
    P.setattr(ta.Autotuner, "run", lambda self, *a, **k: None)
    if hasattr(ta, "Heuristics"):
        P.setattr(ta.Heuristics, "run", lambda self, *a, **k: None)


# ---------------------------------------------------------------------------------------------
# Building the model the way SGLang's loader does
# ---------------------------------------------------------------------------------------------

class _NoAttention(torch.nn.Module):
    """Stands in for an attention module: allocates nothing (the real ones build RoPE caches on
    ``cuda``) and answers any method the decoder layer binds at construction with a function
    that must never run (the MoE block is run on its own)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("__"):
                raise

            def never(*a, **k):
                raise RuntimeError(f"attention stub: {name} called")

            return never


#: Attention classes as the decoder layers of the supported families name them.
_ATTENTION_CLASSES = {
    "sglang.srt.models.deepseek_v2": ("DeepseekV2AttentionMLA",),
    "sglang.srt.models.qwen3_moe": ("Qwen3MoeAttention",),
    "sglang.srt.models.gpt_oss": ("GptOssAttention",),
}


def _stub_attention(P: _Patches) -> None:
    import importlib

    for modname, names in _ATTENTION_CLASSES.items():
        mod = importlib.import_module(modname)
        for name in names:
            assert isinstance(getattr(mod, name), type), (modname, name)
            P.setattr(mod, name, _NoAttention)


def _draft_contexts(mr, *, build: bool):
    """eagle_worker_v2.py EAGLEWorkerV2.__init__ (build) / init_cuda_graphs (run): the scopes the
    draft worker's model is built and run in."""
    from sglang.srt.layers.moe.utils import (
        draft_model_build_scope,
        speculative_moe_a2a_backend_context,
        speculative_moe_backend_context,
    )
    from sglang.srt.speculative.draft_parallel import model_draft_parallel_spec, resolve_draft_parallel_layout
    from sglang.srt.speculative.spec_utils import draft_pp_context, draft_tp_context

    layout = resolve_draft_parallel_layout(
        model_draft_parallel_spec(mr.model_config, spec_algorithm=mr.spec_algorithm))
    stack = contextlib.ExitStack()
    stack.enter_context(draft_tp_context(layout))
    stack.enter_context(draft_pp_context())
    stack.enter_context(speculative_moe_backend_context())
    stack.enter_context(speculative_moe_a2a_backend_context())
    if build:
        stack.enter_context(draft_model_build_scope())
    return stack


def _fused_moe_layers(model) -> list[tuple[str, torch.nn.Module, torch.nn.Module]]:
    """(name, block, experts) for every MoE block: the module whose ``experts`` is a FusedMoE."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    out = []
    for name, module in model.named_modules():
        experts = getattr(module, "experts", None)
        if isinstance(experts, FusedMoE) and experts in list(module.children()):
            out.append((name, module, experts))
    return out


def build_moe_block(mr):
    """SGLang's model for ``mr`` (loader.py _initialize_model), cut after its first MoE layer;
    returns (model, block name, block, experts)."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import _get_quantization_config, _initialize_model
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    mc = mr.model_config
    load_config = LoadConfig()
    quant_config = _get_quantization_config(mc, load_config)
    hf = mc.hf_config
    total = hf.num_hidden_layers
    # The draft (NextN/MTP) model builds its own single decoder layer from the checkpoint's layer
    # count (the MTP layer's index and quantization exclusions derive from it): never cut it.
    candidates = [total] if mr.is_draft_worker else range(1, total + 1)
    for n in candidates:
        hf.num_hidden_layers = n
        try:
            with set_default_torch_dtype(mc.dtype):
                model = _initialize_model(mc, load_config, quant_config)
        finally:
            hf.num_hidden_layers = total
        layers = _fused_moe_layers(model)
        if layers:
            name, block, experts = layers[0]
            return model, quant_config, name, block, experts
        del model
    raise RuntimeError(f"{type(hf).__name__}: no FusedMoE layer in {total} layers")


# ---------------------------------------------------------------------------------------------
# Recording FlashInfer
# ---------------------------------------------------------------------------------------------

#: Namespaces whose public functions are FlashInfer entry points, in the order that names them
#: (the first namespace exporting a function gives its ``api``, as recipes.py spells them).
_FI_NAMESPACES = ("flashinfer.fused_moe", "flashinfer", "flashinfer.fp4_quantization",
                  "flashinfer.fp8_quantization", "flashinfer.quantization", "flashinfer.gemm")


def _fi_entry_points() -> dict[Callable, str]:
    import importlib

    found: dict[Callable, str] = {}
    for ns in _FI_NAMESPACES:
        try:
            mod = importlib.import_module(ns)
        except Exception:
            continue
        for name, fn in vars(mod).items():
            if name.startswith("_") or not inspect.isfunction(fn):
                continue
            if not getattr(fn, "__module__", "").startswith("flashinfer"):
                continue
            found.setdefault(fn, f"{ns}.{name}")
    return found


class Recorder:
    """Stands in for FlashInfer's entry points. Outside ``phase`` nothing changes: the real
    function runs (inner calls between wrapped functions always reach the real one). In the
    ``"weights"`` phase (process_weights_after_loading) the real function runs, except those in
    ``weight_fakes`` that need a GPU, which get a CPU stand-in; the call is listed in
    ``weight_calls``. In the ``"forward"`` phase every call is bound to the function's signature
    (defaults applied), recorded in ``calls`` and answered by its fake, never run."""

    def __init__(self):
        self.calls: list[dict] = []
        self.weight_calls: list[str] = []
        self.phase: str | None = None
        self._depth = 0

    def wrap(self, fn: Callable, api: str, fake: Callable | None, weight_fake: Callable | None):
        sig = inspect.signature(fn)
        rec = self

        @functools.wraps(fn)
        def recorder(*args, **kwargs):
            if rec.phase == "weights" and weight_fake is not None:  # at any depth: it needs a GPU
                if not rec._depth:
                    rec.weight_calls.append(api + " (CPU stand-in)")
                return weight_fake(*args, **kwargs)
            if rec.phase is None or rec._depth:
                return fn(*args, **kwargs)
            rec._depth += 1
            try:
                if rec.phase == "weights":
                    rec.weight_calls.append(api)
                    return fn(*args, **kwargs)
                bound = sig.bind(*args, **kwargs)
                bound.apply_defaults()
                kw = dict(bound.arguments)
                for p in sig.parameters.values():  # a **kwargs parameter: flatten it
                    if p.kind is inspect.Parameter.VAR_KEYWORD and p.name in kw:
                        kw.update(kw.pop(p.name))
                rec.calls.append({"api": api, "kwargs": {k: encode(v) for k, v in kw.items()}})
                if fake is None:
                    raise NotImplementedError(f"FlashInfer {api} reached with no CPU stand-in")
                return fake(**kw)
            finally:
                rec._depth -= 1

        recorder.__wrapped_fi__ = fn
        return recorder


def _moe_out(kw: dict, *, as_list: bool):
    """What a trtllm-gen / CUTLASS MoE returns: the finalized [M, hidden] output (into ``output``
    when given), or with ``do_finalize=False`` the (gemm2 output, expert weights, expanded->permuted
    index) triple SGLang's deferred finalize validates. The hidden width is the activation's
    (two e2m1 values per byte when packed), or ``valid_hidden_size``."""
    hs = kw.get("hidden_states", kw.get("input"))
    m = hs.shape[0]
    hidden = kw.get("valid_hidden_size") or hs.shape[-1] * (2 if hs.dtype == torch.uint8 else 1)
    if kw.get("do_finalize", True) is False:
        top_k = kw["top_k"]
        return [torch.empty(m * top_k, hidden, dtype=torch.bfloat16),
                torch.empty(m, top_k, dtype=torch.bfloat16),
                torch.empty(m, top_k, dtype=torch.int32)]
    out = kw.get("output")
    if out is None:
        out = torch.empty(m, hidden, dtype=kw.get("output_dtype") or torch.bfloat16)
    return [out] if as_list else out


def _fp4_quantize(input, global_scale=None, sf_vec_size=16, sf_use_ue8m0=False, is_sf_swizzled_layout=True,
                  is_sf_8x4_layout=False, **_):
    """flashinfer.fp4_quantize: packed e2m1 [M, K/2] uint8 + e4m3 scales, [M, K/sf_vec] (linear)
    or padded to 128x4 tiles (swizzled), as uint8."""
    m, k = input.shape[-2], input.shape[-1]
    cols = k // sf_vec_size
    if is_sf_swizzled_layout:
        rows = -(-m // (8 if is_sf_8x4_layout else 128)) * (8 if is_sf_8x4_layout else 128)
        sf = torch.empty(rows * (-(-cols // 4) * 4), dtype=torch.uint8)
    else:
        sf = torch.empty(m, cols, dtype=torch.uint8)
    return torch.empty(*input.shape[:-1], k // 2, dtype=torch.uint8), sf


def _fakes() -> dict[str, Callable]:
    tensor_ret = lambda kw: _moe_out(kw, as_list=False)  # noqa: E731
    list_ret = lambda kw: _moe_out(kw, as_list=True)  # noqa: E731
    # Return conventions read from flashinfer/fused_moe/core.py (0.7.2.post1): the fp8 / bf16
    # trtllm ops return ``result[0]`` when finalizing, the fp4 ones and cutlass_fused_moe a list.
    table = {
        "trtllm_fp8_block_scale_moe": tensor_ret, "trtllm_fp8_block_scale_routed_moe": tensor_ret,
        "trtllm_fp8_per_tensor_scale_moe": tensor_ret, "trtllm_fp8_per_tensor_scale_routed_moe": tensor_ret,
        "trtllm_bf16_moe": tensor_ret, "trtllm_bf16_routed_moe": tensor_ret,
        "trtllm_fp4_block_scale_moe": list_ret, "trtllm_fp4_block_scale_routed_moe": list_ret,
        "cutlass_fused_moe": list_ret,
    }
    out = {name: (lambda f: lambda **kw: f(kw))(f) for name, f in table.items()}
    out["fp4_quantize"] = _fp4_quantize
    # --moe-a2a-backend flashinfer with NVFP4 dispatch swizzles the received scales in the forward
    # (token_dispatcher/flashinfer.py): the same stand-in as for the weights.
    interleave = _weight_fakes()["block_scale_interleave"]
    out["block_scale_interleave"] = out["nvfp4_block_scale_interleave"] = interleave
    return out


def _weight_fakes() -> dict[str, Callable]:
    """FlashInfer weight-layout helpers that refuse CPU tensors (a CUDA kernel does the
    permutation), as SGLang's process_weights_after_loading calls them: the result has the
    input's shape and dtype (their docstrings: "a new uint8 tensor with the same shape")."""
    from flashinfer.quantization.fp4_quantization import _compute_swizzled_layout_sf_size

    def block_scale_interleave(unswizzled_sf, *, out=None):
        # fp4_quantization.py block_scale_interleave_sm100: a flat buffer of
        # num_experts * _compute_swizzled_layout_sf_size(rows, cols, 128) in the input's dtype
        experts = unswizzled_sf.shape[0] if unswizzled_sf.dim() == 3 else 1
        size = experts * _compute_swizzled_layout_sf_size(unswizzled_sf.shape[-2], unswizzled_sf.shape[-1], 128)
        return out if out is not None else torch.empty(size, dtype=unswizzled_sf.dtype)

    return {
        "interleave_moe_weights_for_sm90_mixed_gemm": lambda weight, quant_type="fp4", **_: torch.empty_like(weight),
        "block_scale_interleave": block_scale_interleave,
        "nvfp4_block_scale_interleave": block_scale_interleave,
    }


def _install_recorder(P: _Patches, rec: Recorder) -> None:
    fakes, wfakes = _fakes(), _weight_fakes()
    for fn, api in _fi_entry_points().items():
        name = api.rsplit(".", 1)[1]
        P.replace_everywhere(fn, rec.wrap(fn, api, fakes.get(name), wfakes.get(name)))


# ---------------------------------------------------------------------------------------------
# Process initialization SGLang does between publish and model construction
# ---------------------------------------------------------------------------------------------

def _init_process(P: _Patches, sa, mr, m_tokens: int = 1) -> None:
    """distributed/bootstrap.py _init_parallel_groups (groups, then initialize_dp_attention) and
    managers/scheduler.py init_moe_gemm_config (MoE runner flags, then the GEMM backends)."""
    from sglang.srt.layers.dp_attention import initialize_dp_attention
    from sglang.srt.layers.moe.utils import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    from sglang.srt.layers.quantization.unquant import initialize_bf16_gemm_config

    _install_groups(P)
    _install_streams(P)
    _install_device_shims(P)
    initialize_dp_attention(sa)
    initialize_moe_config()
    _install_flashinfer_a2a(P, m_tokens)
    initialize_fp8_gemm_config()
    initialize_fp4_gemm_config()
    initialize_bf16_gemm_config()


# ---------------------------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------------------------

def _draft_graph_capture(mr) -> bool:
    """Whether ``mr``'s autotune dummy pass runs in capture mode.

    The target's pass runs in ``EagerRunner.__init__`` -> ``warmup()``
    (model_runner_components/cuda_graph_setup.py capture_cuda_graphs builds the EagerRunner before
    any graph runner; base_runner.py _warmup is run-once per model runner): not in capture mode,
    whatever graphs are captured afterwards. A draft worker tunes in its draft CUDA-graph runners
    (eagle_draft_cuda_graph_runner.py / eagle_draft_extend_cuda_graph_runner.py call
    maybe_flashinfer_autotune_speculative_draft from capture(), inside model_capture_mode()),
    so only when decode graphs are captured."""
    from sglang.srt.runtime_context import get_exec

    if not mr.is_draft_worker:
        return False
    graph = get_exec().graph.cuda_graph_config
    return graph is not None and str(graph.decode.backend) not in ("disabled", "Backend.DISABLED")


def record_moe_calls(sa, mr, m_tokens: int, *, capture_mode: bool | None = None,
                     info: dict | None = None) -> list[dict]:
    """The FlashInfer calls SGLang's MoE block for ``mr``'s model makes on ``m_tokens`` rows.

    ``capture_mode``: run inside ``model_capture_mode()``; default: as SGLang's autotune pass for
    this worker runs (``_draft_graph_capture``: the target tunes eagerly, a draft in capture).
    ``info``: filled with what was built (block, quant method, runner backend, ...).
    """
    from sglang.srt.model_executor.runner_utils.capture_mode import model_capture_mode
    from sglang.srt.runtime_context import get_model

    P = _Patches()
    rec = Recorder()
    FAKED_OPS.clear()
    try:
        _init_process(P, sa, mr, m_tokens)
        _stub_attention(P)
        _install_custom_op_cpu_kernels(P)
        if capture_mode is None:
            capture_mode = _draft_graph_capture(mr)
        with (_draft_contexts(mr, build=True) if mr.is_draft_worker else contextlib.nullcontext()):
            model, quant_config, name, block, experts = build_moe_block(mr)
        with (_draft_contexts(mr, build=False) if mr.is_draft_worker else contextlib.nullcontext()):
            _install_recorder(P, rec)
            # loader.py: process_weights_after_loading on every module with a quant_method; the
            # routed experts are the one the MoE call reads.
            if info is not None:  # the quant method and runner are fixed at construction
                info.update(_describe(mr, model, quant_config, name, block, experts, capture_mode))
            rec.phase = "weights"
            experts.quant_method.process_weights_after_loading(experts)
            rec.phase = None
            _skip_shared_experts(P, block)
            hidden = torch.randn(m_tokens, mr.model_config.hidden_size, dtype=mr.dtype)
            if info is not None:
                info.update(_describe(mr, model, quant_config, name, block, experts, capture_mode))
            rec.phase = "forward"
            with (torch.no_grad(),
                  get_model().override(shared_experts=model.shared_experts_config),  # BaseRunner.model_context
                  model_capture_mode() if capture_mode else contextlib.nullcontext()):
                block(hidden)
            rec.phase = None
            if info is not None:
                info["m_tokens"] = m_tokens
                info["sglang_ops_faked_on_cpu"] = list(FAKED_OPS)
                info["flashinfer_weight_prep_calls"] = sorted(set(rec.weight_calls))
        return rec.calls
    finally:
        rec.phase = None
        P.undo()


def _describe(mr, model, quant_config, name, block, experts, capture_mode) -> dict:
    cfg = experts.moe_runner_config
    return {
        "model_class": type(model).__name__,
        "quant_config": quant_config.get_name() if quant_config is not None else None,
        "block": f"{name} ({type(block).__name__})",
        "quant_method": type(experts.quant_method).__name__,
        # the compressed-tensors MoE scheme (CompressedTensorsFusedMoEMethod delegates to it)
        "moe_scheme": type(experts.scheme).__name__ if getattr(experts, "scheme", None) is not None else None,
        "runner_backend": str(experts.runner_backend),
        "num_experts": experts.num_experts,
        "num_local_experts": experts.num_local_experts,
        "num_fused_shared_experts": experts.num_fused_shared_experts,
        "intermediate_size_per_partition": experts.intermediate_size_per_partition,
        "top_k": experts.top_k,
        "topk_output_format": getattr(getattr(getattr(getattr(block, "topk", None), "topk_config", None),
                                              "output_format", None), "name", None),
        "supports_deferred_finalize": getattr(experts, "supports_deferred_finalize", None),
        "activation": cfg.activation,
        "capture_mode": capture_mode,
        "m_tokens": None,
    }


def _skip_shared_experts(P: _Patches, block) -> None:
    """DeepseekV2MoE._forward_shared_experts runs the shared expert's dense MLP (SGLang's FP8 /
    NVFP4 linear path, not the MoE runner); its output is only added to the MoE result. It
    returns zeros of the MLP's output shape here, and None where SGLang returns None (no
    separate shared expert)."""
    if getattr(block, "shared_experts", None) is None or not hasattr(block, "_forward_shared_experts"):
        return

    def shared_zeros(hidden_states, *args, **kwargs):
        if hidden_states.shape[0] == 0 or block.num_fused_shared_experts != 0:
            return None
        return torch.zeros_like(hidden_states)

    P.setattr(block, "_forward_shared_experts", shared_zeros)


# ---------------------------------------------------------------------------------------------
# SGLang custom ops on CPU
# ---------------------------------------------------------------------------------------------
#
# SGLang registers its custom ops (utils/common.py direct_register_custom_op) for the CUDA key
# only, with a fake (Meta) implementation for tracing; a CPU tensor reaching one fails in the
# dispatcher. Each such op gets a CPU kernel here, removed again on undo:
#
# - the ops whose body is Python that calls FlashInfer (the trtllm MoE wrappers, SGLang's
#   fp4_quantize wrapper) run that body, so the FlashInfer call inside is reached and recorded;
# - every other op is a GPU kernel: its CPU kernel runs SGLang's own fake implementation (the
#   op on meta tensors) and returns CPU tensors of the shapes, dtypes and strides the fake
#   gives; ops that only write into their arguments leave those buffers as allocated (their
#   layout is the caller's).

_RUN_BODY_MODULES = ("sglang.srt.layers.moe.flashinfer_trtllm_moe",)
#: (SGLang's fp4 / mxfp8 quantize wrappers are registered with ``register_custom_op_from_extern``,
#: which keeps no Python body: they run their fake, whose shapes are SGLang's own.)
_RUN_BODY_OPS: tuple[str, ...] = ()


def _custom_op_bodies() -> dict[str, Callable]:
    """op name -> Python body, for the ops whose body is to run on CPU. ``register_custom_op``
    leaves in the module either a CustomOpWrapper (lazy) or, registered at import (eager), a
    function wrapping the body (``functools.wraps``: the body is its ``__wrapped__``)."""
    from sglang.srt.utils.custom_op import CustomOpWrapper

    bodies: dict[str, Callable] = {}
    for modname, mod in list(sys.modules.items()):
        if not modname.startswith("sglang") or mod is None:
            continue
        for v in list(getattr(mod, "__dict__", {}).values()):
            if isinstance(v, CustomOpWrapper):
                name, body = v.op_name, v.op_func
            elif inspect.isfunction(v) and inspect.isfunction(getattr(v, "__wrapped__", None)):
                name, body = v.__wrapped__.__name__, v.__wrapped__
            else:
                continue
            if name in _RUN_BODY_OPS or getattr(body, "__module__", "") in _RUN_BODY_MODULES:
                bodies[name] = body
    return bodies


#: sglang ops that ran through their fake on CPU during the recorded forward (reported in info)
FAKED_OPS: list[str] = []


def _meta_fake_kernel(op_name: str) -> Callable:
    from torch.utils._pytree import tree_map

    def to_meta(x):
        return x.to("meta") if isinstance(x, torch.Tensor) else x

    def to_cpu(x):
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)
        return x

    def kernel(*args, **kwargs):
        if op_name not in FAKED_OPS:
            FAKED_OPS.append(op_name)
        op = getattr(torch.ops.sglang, op_name)
        return tree_map(to_cpu, op(*tree_map(to_meta, args), **tree_map(to_meta, kwargs)))

    return kernel


def _install_custom_op_cpu_kernels(P: _Patches) -> None:
    from sglang.srt.utils import common

    lib = torch.library.Library("sglang", "IMPL")
    P._undo.append(lib._destroy)
    done: set[str] = set()
    bodies: dict[str, Callable] = {}

    def add_cpu(op_name: str) -> None:
        qual = f"sglang::{op_name}"
        if op_name in done or torch._C._dispatch_has_kernel_for_dispatch_key(qual, "CPU"):
            return
        if not bodies:
            bodies.update(_custom_op_bodies())
        lib.impl(op_name, bodies.get(op_name) or _meta_fake_kernel(op_name), "CPU")
        done.add(op_name)

    for qual in torch._C._dispatch_get_all_op_names():
        if qual.startswith("sglang::"):
            add_cpu(qual.split("::", 1)[1].split(".", 1)[0])

    original = common.direct_register_custom_op

    def register_then_add_cpu(op_name, op_func, mutates_args, fake_impl=None, target_lib=None):
        original(op_name, op_func, mutates_args, fake_impl=fake_impl, target_lib=target_lib)
        if target_lib is None:
            if op_name in _RUN_BODY_OPS or getattr(op_func, "__module__", "") in _RUN_BODY_MODULES:
                bodies[op_name] = op_func
            add_cpu(op_name)

    P.setattr(common, "direct_register_custom_op", register_then_add_cpu)
