"""SGLang 0.5.23's quantization rules: the server's --quantization against the checkpoint's method,
and against the MoE runner backend.

Why a module of its own: the cache key hashes the server argument (``--quantization`` as given,
or as an sm100 DeepSeek/Qwen3 override resolved it) while the layers run ``ModelConfig``'s
method, and the two part ways in ways a guess gets wrong. A ModelOpt checkpoint is detected
whatever the flag says (``--quantization awq`` on an FP8 ModelOpt Llama serves ``modelopt_fp8``
and hashes ``awq``); any other mismatch is refused unless the pair is one SGLang declares
compatible. The flag probes (tests/data/sglang-0.5.23/probes.json) pin each rule to SGLang's
own outcome; the rules themselves come from ``ModelConfig._verify_quantization``,
``QuantizationConfig._modelopt_override_quantization_method``,
``overrides._moe_runner_backend_quant_constraints`` and ``moe_hook.handle_moe_kernel_config``.
"""

from __future__ import annotations

from autotune_cache.errors import UsageError

#: ``compatible_quantization_methods``: a --quantization that may differ from the checkpoint's.
COMPATIBLE = {
    "modelopt_fp8": ("modelopt",),
    "modelopt_fp4": ("modelopt", "fp8"),
    "modelopt_mixed": ("modelopt",),
    "nvfp4_online": ("fp8", "modelopt_fp8"),
    "minimax_m3_nvfp4": ("mxfp8",),
    "petit_nvfp4": ("modelopt",),
    "w8a8_int8": ("compressed-tensors", "compressed_tensors"),
    "w8a8_fp8": ("compressed-tensors", "compressed_tensors"),
    "auto-round-int8": ("compressed-tensors", "compressed_tensors"),
}

#: Checkpoint methods a ModelOpt quantization config detects by itself (the override returns the
#: checkpoint's method for any flag but these).
MODELOPT_METHODS = ("modelopt_fp8", "modelopt_fp4", "modelopt_mixed")
#: Flags that ask for an online re-quantization and are never overridden back to the checkpoint's.
REQUANTIZE = ("nvfp4_online", "quark_mxfp4")

#: Compatible pairs that re-quantize the checkpoint's experts at load time (not modelled).
ONLINE_REQUANTIZATION = {("modelopt_fp4", "fp8"), ("nvfp4_online", "fp8"), ("nvfp4_online", "modelopt_fp8")}

#: --quantization values whose layers run FlashInfer code fi-autotune does not model.
NOT_MODELLED = {
    "mxfp8": "SGLang 0.5.23 serves it through FlashInfer's MXFP8 GEMMs and MoE, which fi-autotune does not model",
    "minimax_m3_nvfp4": "its MXFP8 dense GEMMs are not modelled",
}

#: moe_hook.handle_moe_kernel_config: what each FlashInfer MoE runner accepts as the server's
#: (resolved) --quantization. ``None`` is bf16.
BACKEND_QUANTIZATIONS = {
    "flashinfer_cutlass": ("modelopt_fp4", "modelopt_fp8", "modelopt_mixed", None),
    "flashinfer_trtllm": ("modelopt_fp4", "nvfp4_online", "fp8", "mxfp8", "modelopt_fp8", "modelopt_mixed",
                          "compressed-tensors", None),
    "experimental_sgl_trtllm": ("modelopt_fp4", "nvfp4_online", "fp8", "mxfp8", "modelopt_fp8", "modelopt_mixed",
                               "compressed-tensors", None),
    "flashinfer_cutedsl": ("modelopt_fp4", "modelopt_mixed", "nvfp4_online"),
    "flashinfer_trtllm_routed": ("fp8", "mxfp8", "modelopt_fp4", "modelopt_mixed", "nvfp4_online",
                                 "minimax_m3_nvfp4", None),
}


def layer_quantization(flag: str | None, checkpoint: str | None, *, flag_name: str = "--quantization") -> str | None:
    """``ModelConfig.quantization``: what the layers run, from the flag and the checkpoint's method.

    A mismatch SGLang refuses at startup is a UsageError naming the flag."""
    if checkpoint is None:
        if flag in MODELOPT_METHODS or flag in ("modelopt", "petit_nvfp4"):
            raise UsageError(f"{flag_name} {flag} on a checkpoint without a ModelOpt quantization config: not "
                             "modelled (the method reads its scales and exclusions from that config)")
        return flag
    if flag not in REQUANTIZE and checkpoint in MODELOPT_METHODS:
        return checkpoint  # detected from the checkpoint, whatever the flag says
    if flag is None or flag == checkpoint:
        return checkpoint
    if checkpoint in COMPATIBLE.get(flag, ()):
        if (flag, checkpoint) in ONLINE_REQUANTIZATION:
            raise UsageError(f"{flag_name} {flag} on a {checkpoint} checkpoint: SGLang 0.5.23 re-quantizes the experts "
                             "online at load time, which fi-autotune does not model")
        return flag
    raise UsageError(f"{flag_name} {flag}: the checkpoint is quantized with {checkpoint}, and SGLang 0.5.23 refuses "
                     f"the mismatch at startup (ModelConfig._verify_quantization)")


def refuse_unmodelled(quantization: str | None, flag_name: str = "--quantization") -> None:
    if quantization in NOT_MODELLED:
        raise UsageError(f"{flag_name} {quantization}: {NOT_MODELLED[quantization]}")


def moe_backend_for(quantization: str | None, backend: str, *, sm100: bool) -> str:
    """``_moe_runner_backend_quant_constraints``: the backend an online-NVFP4 command resolves to
    (sm100 only), or a UsageError where SGLang refuses the pair."""
    if quantization == "nvfp4_online":
        if not sm100:
            raise UsageError("--quantization nvfp4_online: SGLang 0.5.23 supports it only on Blackwell (sm100/sm103)")
        if backend == "auto":
            return "flashinfer_trtllm"
        if backend not in ("flashinfer_trtllm", "flashinfer_trtllm_routed", "flashinfer_cutedsl"):
            raise UsageError(f"--moe-runner-backend {backend}: with --quantization nvfp4_online SGLang 0.5.23 takes "
                             "flashinfer_trtllm, flashinfer_trtllm_routed or flashinfer_cutedsl")
    return backend


def check_backend_quantization(backend: str, quantization: str | None, *, from_checkpoint: bool = False) -> None:
    """The asserts SGLang runs on the resolved MoE backend and --quantization at startup
    (``from_checkpoint``: SGLang copied the checkpoint's method into --quantization)."""
    allowed = BACKEND_QUANTIZATIONS.get(backend)
    if allowed is not None and quantization not in allowed:
        names = ", ".join("bf16 (none)" if q is None else q for q in allowed)
        how = f"the checkpoint's {quantization}, which SGLang copies into --quantization" if from_checkpoint \
            else f"--quantization {quantization}"
        raise UsageError(f"--moe-runner-backend {backend} with {how}: SGLang 0.5.23 refuses it at startup "
                         f"(the runner takes {names})")
