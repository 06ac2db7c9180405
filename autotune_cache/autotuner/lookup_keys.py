"""FlashInfer 0.7.2.post1's lookup keys (``ProfilingCacheKey.file_key``), both ways, without
importing FlashInfer or torch: built from a recipe (what a cache file must hold for a call), and
parsed back from their string form (what FlashInfer's v2 store records as ``key_fields``).

A key is ``ProfilingCacheKey.file_key`` = ``str((custom_op, runner class, nearest_profile,
extras))`` (flashinfer/autotuner/autotuner.py): the profile is every tuned input's shape with
the dynamic dimension set to the bucket (``-1`` where a constraint fixes it, ``(0,)`` for an
absent input), the extras what the runner's ``get_cache_key_extras`` returns. Where an op has
several candidate runners the file holds the *winner's* key, which only a GPU decides; so each
builder returns, per custom op, the candidate keys - one per runner.

Each builder restates the FlashInfer function it names. tests/oracle/flashinfer_keys.py runs
FlashInfer's own code (kernels stubbed, on CPU) on SGLang's recorded calls, and
tests/engines/test_sglang_oracle.py compares every key here with the ones it recorded
(tests/data/sglang-0.5.23/matrix.json), for the Blackwell ops no GPU here can run.

Parsing: ``extras`` may hold torch dtypes, whose repr (``torch.bfloat16``) is not literal syntax, so ``ast.literal_eval`` refuses
it. FlashInfer's v2 store wants the structure (``key_fields``, encoded ``{"__tuple__": ...}``,
``{"__dtype__": "bfloat16"}``) to preload entries, and checks ``str(decoded) == key``. This
parses the one shape keys take - tuples and lists of literals and ``torch.<name>`` - and
returns nothing for anything else (the entry is then written without ``key_fields``, as
FlashInfer itself does for keys it cannot encode: served lazily, never lost).
"""

from __future__ import annotations

import ast
from typing import Any, Protocol

#: The FlashInfer releases whose key rules this module restates: recorded from 0.7.2.post1's code,
#: and 0.7.2's key code, bucket functions and every planned op's key extras are the same byte for
#: byte (docs/results/flashinfer_versions_2026-11-28/). 0.7.4 changes MLA decode's runner names and
#: bf16_gemm's extras, so keys planned for a release not named here are not checked.
RECORDED_RELEASES = ("0.7.2", "0.7.2.post1")


def unrecorded_release_note(version: str) -> str | None:
    """What a plan for ``version`` says when its keys restate another release's rules; None for a
    recorded release (a local suffix, ``+cu130``, is the same release)."""
    if version.split("+", 1)[0] in RECORDED_RELEASES:
        return None
    return (f"FlashInfer {version}: the keys planned here restate FlashInfer {RECORDED_RELEASES[-1]}'s code "
            f"(also {', '.join(RECORDED_RELEASES[:-1])}); for {version} they are not checked (0.7.4 renamed MLA "
            "decode's runners and changed bf16_gemm's keys: docs/cache-layout.md, \"FlashInfer versions\")")


class Call(Protocol):
    """What a key builder reads of a recipe (``autotuner.recipe.OpRecipe``): the call's API, its
    custom ops and its keyword arguments - nothing else, so this module needs no recipe type."""

    api: str
    custom_ops: tuple[str, ...]
    kwargs: dict


class _Repr:
    """Renders like a torch dtype inside ``str(tuple)``, without importing torch."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def td(name: str) -> _Repr:
    return _Repr(f"torch.{name}")


# flashinfer/tllm_enums.py DtypeTrtllmGen: (block_format << 24) | (signed << 20) | (integer << 16)
# | (bits << 8) | uid
DTYPE_TRTLLM_GEN = {"Bfloat16": 1052672, "E4m3": 1050629, "E2m1": 17826818, "MxE2m1": 17826828,
                    "MxE4m3": 17827853}


def _shape(t) -> tuple:
    return tuple(t.shape) if t is not None else (0,)


def cutlass_moe(r: Call, bucket: int) -> list[list[tuple]]:
    """fused_moe/core.py cutlass_fused_moe: choose_one over [input, fc1_w, fc1_b, fc2_w, fc2_b],
    dim 0 of input bucketed; extras = MoERunner.get_cache_key_extras; one runner for gemm1/gemm2."""
    kw = r.kwargs
    x, w1, w2 = kw["input"], kw["fc1_expert_weights"], kw["fc2_expert_weights"]
    b1, b2 = kw.get("fc1_expert_biases"), kw.get("fc2_expert_biases")
    profile = (x.concrete(bucket), w1.shape, _shape(b1), w2.shape, _shape(b2))
    extras = (
        td(x.dtype), td(w1.dtype), td(kw["output_dtype"].name), kw["token_selected_experts"].shape[1],
        kw["tp_size"], kw["ep_size"], 1, kw["enable_alltoall"], False,
        kw.get("use_w4_group_scaling", False), False, False, False,
        True,  # enable_pdl: device_support_pdl() on sm90+
        kw["activation_type"].value, False, kw["use_fused_finalize"],
    )
    return [[(op, "MoERunner", profile, extras)] for op in r.custom_ops]


def bmm_fp8(r: Call, bucket: int) -> list[list[tuple]]:
    """gemm/gemm_base.py fp8_gemm_sm100 -> choose_one("fp8_gemm", [a, b, sa, sb, out, workspace]):
    a's dim -2 bucketed; out dim -2 and workspace dim 0 constrained (-1); extras = dtypes."""
    kw = r.kwargs
    a, b = kw["A"], kw["B"]
    profile = (a.concrete(bucket), b.shape, (1,), (1,), (1, -1, b.shape[2]), (-1,))
    runner = {"cublas": "CublasFp8GemmRunner", "cudnn": "CudnnFp8GemmRunner"}[kw["backend"]]
    return [[("fp8_gemm", runner, profile, (td(a.dtype), td(b.dtype), td(kw["dtype"].name)))]]


def _trtllm_dtype(x, scale) -> int:
    """tllm_enums.py deduce_trtllm_gen_tensor_dtype: bf16; fp8 (E4m3, MxE4m3 with a scale);
    packed fp4 (E2m1 with one scale per 16 values, else MxE2m1)."""
    if x.dtype == "bfloat16":
        return DTYPE_TRTLLM_GEN["Bfloat16"]
    if x.dtype == "float8_e4m3fn":
        return DTYPE_TRTLLM_GEN["E4m3" if scale is None else "MxE4m3"]
    numel = 2
    for d in x.shape[1:]:
        numel *= d
    scale_numel = 1
    for d in scale.shape[1:]:
        scale_numel *= d
    return DTYPE_TRTLLM_GEN["E2m1" if scale_numel == numel // 16 else "MxE2m1"]


def trtllm_moe(r: Call, bucket: int) -> list[list[tuple]]:
    """fused_moe/core.py trtllm_*_moe -> backends/trtllm/sm100_runner.py MoERunner: the profile is
    the eight MoeRunnerInputs (output, routing_logits, topk_ids, expert_weights, hidden_states,
    hidden_states_scale, lora_delta, per_token_scale), dim 0 bucketed (dim 1 of the DeepSeek-FP8
    ``[H/128, M]`` scale); absent inputs are ``(0,)``, the routed placeholders ``(m,)``. The
    extras start with the JIT module's class name, then core.py's per-op settings."""
    kw = r.kwargs
    m = bucket
    api = r.api.rsplit(".", 1)[1]
    hs, scale = kw["hidden_states"], kw.get("hidden_states_scale")
    hidden = hs.shape[1] * (2 if hs.dtype == "uint8" else 1)
    out = kw.get("output")
    out_cols = out.shape[1] if out is not None else hidden
    if api == "trtllm_fp8_block_scale_moe":
        dtypes, quant, topk = (DTYPE_TRTLLM_GEN["E4m3"],) * 2, 1, (m,)  # Fp8QuantizationType.DeepSeekFp8
        shuffled, layout = bool(kw.get("use_shuffled_weight", False)), int(getattr(kw.get("weight_layout", 0), "value", kw.get("weight_layout", 0)))
    elif api == "trtllm_fp8_per_tensor_scale_moe":
        dtypes, quant, topk, shuffled, layout = (DTYPE_TRTLLM_GEN["E4m3"],) * 2, 0, (m, kw["top_k"]), True, 0
    elif api == "trtllm_bf16_moe":
        dtypes, quant, topk = (DTYPE_TRTLLM_GEN["Bfloat16"],) * 2, 0, (m,)
        shuffled, layout = bool(kw.get("use_shuffled_weight", True)), int(getattr(kw.get("weight_layout", 2), "value", kw.get("weight_layout", 2)))
    else:  # trtllm_fp4_block_scale_moe: dtypes deduced from the tensors and their scales
        dtypes = (_trtllm_dtype(hs, scale), _trtllm_dtype(kw["gemm1_weights"], kw["gemm1_weights_scale"]))
        quant, topk, shuffled, layout = 0, (m, kw["top_k"]), True, 0
    if scale is None:
        scale_shape = (0,)
    elif scale.shape[0] == "M":
        scale_shape = (m, *scale.shape[1:])
    else:
        scale_shape = (scale.shape[0], m)
    profile = ((m, out_cols), (m, kw["num_experts"]), topk, topk, (m, hs.shape[1]), scale_shape, (0,), (0,))
    activation = kw.get("activation_type", 3)
    extras = ("Module", kw["top_k"], kw["local_num_experts"], kw["num_experts"], 0, dtypes[0], dtypes[1], quant,
              hidden, hidden, kw["intermediate_size"], int(getattr(activation, "value", activation)), shuffled, layout,
              False, False)
    return [[(op, "MoERunner", profile, extras)] for op in r.custom_ops]


#: gemm/gemm_base.py mm_fp4: runner class and get_cache_key_extras per backend.
_FP4_RUNNERS = {"cutlass": "CutlassFp4GemmRunner", "cudnn": "CudnnFp4GemmRunner", "trtllm": "TrtllmGemmRunner",
                "cute-dsl": "CuteDSLFp4GemmRunner"}


def mm_fp4(r: Call, bucket: int) -> list[list[tuple]]:
    """gemm/gemm_base.py mm_fp4 -> choose_one("fp4_gemm", [a, b, a_descale, b_descale, alpha,
    <absent>, out, <absent>, <absent>, workspace]): a's dim 0 bucketed; a_descale's rows, out's
    rows and the workspace constrained (-1)."""
    kw = r.kwargs
    a, b, bd = kw["a"], kw["b"], kw["b_descale"]
    n = b.shape[1]
    alpha = kw.get("alpha")
    profile = ((bucket, a.shape[1]), b.shape, (-1, kw["a_descale"].shape[1]), bd.shape,
               tuple(alpha.shape) if alpha is not None else (0,), (0,), (-1, n), (0,), (0,), (-1,))
    backend = kw["backend"]
    if backend == "cudnn":
        extras: tuple = (td(kw["out_dtype"].name), kw["block_size"], True, alpha is not None)
    elif backend == "trtllm":
        extras = (kw["use_8x4_sf_layout"], DTYPE_TRTLLM_GEN["E2m1"], DTYPE_TRTLLM_GEN["Bfloat16"])
    else:
        extras = ()
    return [[("fp4_gemm", _FP4_RUNNERS[backend], profile, extras)]]


def _seq_len_bucket(x: int) -> int:
    """mla/_core.py _round_to_seq_len_bucket: the power of two at or above max_seq_len."""
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def mla_decode(r: Call, bucket: int) -> list[list[tuple]]:
    """mla/_core.py trtllm_batch_decode_with_kv_cache_mla -> choose_one("trtllm_batch_decode_mla",
    [TrtllmGenMlaDecodeRunner, CuteDslMlaDecodeRunner (backend auto, dense only)],
    [query, block_tables, seq_lens, out]): dim 0 of each bucketed (the batch)."""
    kw = r.kwargs
    q, bt, kv, ws = kw["query"], kw["block_tables"], kw["kv_cache"], kw["workspace_buffer"]
    _, q_len, heads, _ = q.shape
    lora = kw["kv_lora_rank"]
    profile = ((bucket, q_len, heads, q.shape[3]), (bucket, *bt.shape[1:]), (bucket,), (bucket, q_len, heads, lora))
    qd, kvd, out = td(q.dtype), td(kv.dtype), td("bfloat16")
    page = kv.shape[-2]
    max_seq = kw["max_seq_len"]
    top_k = kw["sparse_mla_top_k"]
    pdl = True if kw.get("enable_pdl") is None else kw["enable_pdl"]  # device_support_pdl on sm100
    candidates = [("trtllm_batch_decode_mla", "TrtllmGenMlaDecodeRunner", profile,
                   (qd, kvd, out, kw["qk_nope_head_dim"], lora, kw["qk_rope_head_dim"], page, _seq_len_bucket(max_seq),
                    top_k, True, True, pdl, "bmm1_float", "bmm2_float", None, None, False, False))]
    if kw.get("backend", "auto") == "auto" and not top_k:
        workspace_bytes = ws.shape[0] * (1 if ws.dtype in ("int8", "uint8") else 4)
        candidates.append(("trtllm_batch_decode_mla", "CuteDslMlaDecodeRunner", profile,
                           (qd, kvd, out, kw["qk_nope_head_dim"], lora, kw["qk_rope_head_dim"], page,
                            (max_seq + 127) // 128, workspace_bytes, True, True, pdl, None, "auto", False, 1)))
    return [candidates]


BUILDERS: dict[str, Any] = {
    "flashinfer.fused_moe.cutlass_fused_moe": cutlass_moe,
    "flashinfer.bmm_fp8": bmm_fp8,
    "flashinfer.fused_moe.trtllm_fp8_block_scale_moe": trtllm_moe,
    "flashinfer.fused_moe.trtllm_fp8_per_tensor_scale_moe": trtllm_moe,
    "flashinfer.fused_moe.trtllm_bf16_moe": trtllm_moe,
    "flashinfer.fused_moe.trtllm_fp4_block_scale_moe": trtllm_moe,
    "flashinfer.mm_fp4": mm_fp4,
    "flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla": mla_decode,
}


# --- parsing a key's string form back to structure ----------------------------------------

#: Longest key we parse (real ones are < 1 KB).
MAX_KEY_CHARS = 8192


class TorchDtype:
    """Stands for ``torch.<name>`` so that ``str()`` of a parsed key reproduces it exactly."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TorchDtype) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("torch", self.name))


class _Unparsable(Exception):
    pass


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (bool, int, float, str))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and isinstance(node.operand.value, (int, float)) and not isinstance(node.operand.value, bool):
        return -node.operand.value
    if isinstance(node, ast.Tuple):
        return tuple(_value(e) for e in node.elts)
    if isinstance(node, ast.List):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
        return TorchDtype(node.attr)
    raise _Unparsable(type(node).__name__)


def parse_key(key: str) -> tuple | None:
    """The structure of a key string, or None when it is not one we can reproduce exactly."""
    if len(key) > MAX_KEY_CHARS:
        return None
    try:
        value = _value(ast.parse(key, mode="eval").body)
    except (_Unparsable, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not (isinstance(value, tuple) and len(value) == 4 and isinstance(value[0], str)) or str(value) != key:
        return None
    return value


def encode_key_fields(fields: Any) -> Any:
    """FlashInfer's ``_encode_key_fields`` encoding of a parsed key."""
    if fields is None or isinstance(fields, (bool, int, float, str)):
        return fields
    if isinstance(fields, TorchDtype):
        return {"__dtype__": fields.name}
    if isinstance(fields, tuple):
        return {"__tuple__": [encode_key_fields(f) for f in fields]}
    if isinstance(fields, list):
        return [encode_key_fields(f) for f in fields]
    raise TypeError(f"not a key component: {fields!r}")
