"""SGLang 0.5.23's autotune gate (``should_run_flashinfer_autotune``): does the server enter
its FlashInfer autotune pass at all, and why (or why not) - said in the plan's words."""

from __future__ import annotations

from dataclasses import dataclass

from autotune_cache.engines.sglang.startup import MOE_BACKENDS_THAT_AUTOTUNE
from autotune_cache.errors import UsageError
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.spec import ModelSpec

#: fp4_utils.py initialize_fp4_gemm_config: --fp4-gemm-backend -> mm_fp4's backend string.
FP4_GEMM_BACKENDS = {"flashinfer_cutedsl": "cute-dsl", "flashinfer_cutlass": "cutlass", "flashinfer_cudnn": "cudnn",
                     "flashinfer_trtllm": "trtllm"}
#: should_run_flashinfer_autotune counts NVFP4 GEMMs only for these two.
FP4_BACKENDS_THAT_AUTOTUNE = ("cute-dsl", "cutlass")


def fp4_backend(flag: str, sm100: bool) -> str | None:
    if flag == "auto":
        return "cute-dsl" if sm100 else None  # Hopper: marlin, no FlashInfer GEMM
    if flag not in FP4_GEMM_BACKENDS:
        raise UsageError(f"--fp4-gemm-backend {flag!r}: fi-autotune models auto and {', '.join(FP4_GEMM_BACKENDS)}")
    return FP4_GEMM_BACKENDS[flag]



@dataclass(frozen=True)
class Gate:
    autotunes: bool
    reasons: tuple[str, ...]
    notes: tuple[str, ...]


def autotune_gate(spec: ModelSpec, flags: ServerFlags, *, backend: str, model_quant: str | None,
                  fp4: str | None, dtype: str, sm100: bool, worker: str) -> Gate:
    """should_run_flashinfer_autotune for the running model (the draft's, for a draft worker)."""
    moe_needs = backend in MOE_BACKENDS_THAT_AUTOTUNE
    # per-tensor FP8 linears: flashinfer_per_tensor_fp8_supported() (sm90 / sm100 / sm120); block
    # FP8 as MXFP8 on FlashInfer is not modelled (Blackwell MXFP8 only).
    fp8_gemm_needs = model_quant in ("modelopt", "modelopt_fp8", "modelopt_mixed")
    fp4_gemm_needs = fp4 in FP4_BACKENDS_THAT_AUTOTUNE
    reasons: list[str] = []
    notes: list[str] = []
    if moe_needs:
        reasons.append(f"MoE runner backend {backend!r} is one SGLang autotunes")
    if fp8_gemm_needs:
        reasons.append(f"{model_quant} checkpoint: per-tensor FP8 linear layers run flashinfer.bmm_fp8")
    if fp4_gemm_needs:
        reasons.append(f"{model_quant} checkpoint: NVFP4 linear layers run flashinfer.mm_fp4 ({fp4})")
    autotunes = moe_needs or fp8_gemm_needs or fp4_gemm_needs
    if flags.autotune_disabled_by and autotunes:
        autotunes = False
        reasons.append(f"should_run_flashinfer_autotune() is False: the server runs with {flags.autotune_disabled_by}; "
                       "nothing to cache")
    elif not autotunes:
        reasons.append(_why_not(spec, flags, backend=backend, model_quant=model_quant, fp4=fp4, dtype=dtype,
                                sm100=sm100, worker=worker))
    # A MoE backend that autotunes with a model without MoE layers (an EAGLE3 draft) still makes
    # SGLang enter the autotune context: the file it writes holds no tactics.
    if autotunes and moe_needs and spec.moe is None and not (fp8_gemm_needs or fp4_gemm_needs):
        notes.append(f"SGLang enters its autotune pass ({backend!r}) but the {'draft ' if worker == 'draft' else ''}"
                     "model has no MoE layer: nothing is tuned")
    return Gate(autotunes, tuple(reasons), tuple(notes))


def _why_not(spec: ModelSpec, flags: ServerFlags, *, backend: str, model_quant: str | None, fp4: str | None,
             dtype: str, sm100: bool, worker: str) -> str:
    why = [f"moe_runner_backend resolves to {backend!r}"]
    if spec.moe is None and not fp4:
        why = [f"the {'draft' if worker == 'draft' else 'model'} has no MoE layers"
               + ("" if backend in MOE_BACKENDS_THAT_AUTOTUNE else f" and its MoE backend is {backend!r}")]
    elif not sm100 and flags.moe_runner_backend == "auto":
        why.append("(the flashinfer_trtllm / flashinfer_mxfp4 defaults apply to sm100 only)")
    if fp4 and fp4 not in FP4_BACKENDS_THAT_AUTOTUNE:
        why.append(f"and its NVFP4 linear layers run mm_fp4 on {fp4}, which SGLang does not count")
    if model_quant == "fp8" and spec.quant and spec.quant.is_block_fp8:
        why.append("and its 128x128 block-FP8 linear layers do not go through FlashInfer's tunable GEMMs "
                   "(DeepGEMM / triton on Hopper)")
    elif model_quant is None:
        why.append(f"and the {dtype} linear layers are not FlashInfer GEMMs")
    return ("should_run_flashinfer_autotune() is False: " + " ".join(why)
            + "; the server would not autotune, so there is nothing to cache")
