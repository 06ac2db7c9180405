"""The kind of expert weights a checkpoint holds: the key both engines' recorded MoE dispatch
tables are read by (``engines/sglang/data/...-moe-dispatch.json``, ``engines/vllm/data/...``).

Each kind is one recorded checkpoint format (``tests/oracle/record.py`` and ``record_vllm.py``
``DISPATCH_MODELS`` name one checkpoint per kind); a checkpoint whose format no probe covers has
no kind (None), and the planners then refuse it as not modelled rather than guess.
"""

from __future__ import annotations

from autotune_cache.plan.spec import ModelSpec

#: compressed-tensors schemes (``QuantSpec.fmt``, from the config's first config group) -> kind.
_COMPRESSED_TENSORS = {"float8-w8a8": "compressed_tensors_fp8", "int4-w4a16": "compressed_tensors_w4a16"}


def expert_weights_kind(spec: ModelSpec, model_quant: str | None) -> str | None:
    """``bf16``, ``fp8_block``, ``fp8_tensor`` (static activation scales), ``fp8_tensor_dynamic``,
    ``modelopt_fp8``, ``modelopt_fp4``, ``mxfp4``, ``w4afp8``, ``awq``, ``gptq``,
    ``compressed_tensors_fp8``, ``compressed_tensors_w4a16``; None for any other."""
    q = spec.quant
    if model_quant is None:
        return "bf16"
    if model_quant == "fp8":
        if q is None or q.method != "fp8":
            return None  # fp8 asked of another checkpoint (online quantization): no probe
        if q.is_block_fp8:
            return "fp8_block"
        return "fp8_tensor" if q.activation_scheme == "static" else "fp8_tensor_dynamic"
    if model_quant in ("modelopt_fp8", "modelopt_fp4", "mxfp4", "w4afp8", "awq", "gptq"):
        return model_quant if q is not None and q.method == model_quant else None
    if model_quant == "compressed-tensors" and q is not None:
        return _COMPRESSED_TENSORS.get(q.fmt or "")
    return None
