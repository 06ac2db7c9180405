"""Which MoE runner SGLang 0.5.23 gives a model's experts, as SGLang's own code answered.

An explicit ``--moe-runner-backend`` is no promise that the experts run it: the layer's quant
method decides. bf16 experts with ``flashinfer_mxfp4`` get ``UnquantizedFusedMoEMethod``, which
knows only trtllm, cutlass, DeepGEMM and triton_kernels and otherwise runs Triton - so the server
enters its autotune pass (the gate reads the flag) and tunes nothing. The table
``data/sglang-0.5.23-moe-dispatch.json`` holds, per (arch, kind of expert weights, backend), the
quant method and runner SGLang's own model construction picked, the FlashInfer functions the
layer's forward then called (or SGLang's refusal), recorded on CPU
by ``tests/oracle/record.py dispatch`` (``tests/oracle/sglang_moe_dispatch.py``); nothing here is a
hand-written list.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from autotune_cache.plan.resolution import arch_major
from autotune_cache.plan.spec import ModelSpec

TABLE = Path(__file__).resolve().parent / "data" / "sglang-0.5.23-moe-dispatch.json"
#: MoeRunnerBackend members that are FlashInfer kernels (their calls are what the autotune pass tunes).
FLASHINFER_RUNNERS = ("FLASHINFER_TRTLLM", "FLASHINFER_TRTLLM_ROUTED", "FLASHINFER_CUTLASS", "FLASHINFER_MXFP4",
                      "FLASHINFER_CUTEDSL", "FLASHINFER_MEGAMOE")


def is_tunable_moe_api(api: str) -> bool:
    """A FlashInfer fused-MoE entry point that goes through its autotuner (``cutlass_fused_moe``,
    ``trtllm_*_moe``), as opposed to the quantize / layout helpers around it."""
    return api.startswith("flashinfer.fused_moe.") and api.endswith("_moe")


@dataclass(frozen=True)
class Dispatch:
    kind: str  # the expert weights: bf16, fp8_block, mxfp4, modelopt_fp4
    backend: str  # --moe-runner-backend as given
    quant_method: str | None  # the FusedMoE layer's quant method class
    runner: str | None  # MoeRunnerBackend member its create_moe_runner picked
    error: str | None = None  # SGLang's own refusal: at resolution, building the layer, or in its forward
    apis: tuple[str, ...] | None = None  # the FlashInfer functions the layer's forward called
    flag: str = "--moe-runner-backend"  # the flag that chose ``backend`` (a draft's: --speculative-...)

    @property
    def runs_flashinfer(self) -> bool:
        """The experts make a tunable FlashInfer MoE call (the recorded forward's, else the runner's)."""
        if self.apis is not None:
            return any(is_tunable_moe_api(a) for a in self.apis)
        return self.runner in FLASHINFER_RUNNERS

    def refusal(self, arch: str) -> str:
        first = self.error.splitlines()[0]
        return (f"{self.flag} {self.backend} with {self.kind} experts on {arch}: SGLang 0.5.23 fails at "
                f"startup ({first})")

    def why(self) -> str:
        return (f"{self.flag} {self.backend} with {self.kind} experts: SGLang 0.5.23 gives the MoE layer "
                f"{self.quant_method}, which runs them on {_RUNNER_NAMES.get(self.runner, self.runner)} "
                f"(MoeRunnerBackend.{self.runner}), not FlashInfer: nothing is tuned for the experts (SGLang's own "
                "model construction, recorded in engines/sglang/data/sglang-0.5.23-moe-dispatch.json)")


_RUNNER_NAMES = {"TRITON": "SGLang's Triton MoE kernels", "TRITON_KERNELS": "triton_kernels",
                 "DEEP_GEMM": "DeepGEMM"}


@functools.cache
def _table() -> dict[tuple[str, str, str], dict]:
    if not TABLE.is_file():
        return {}
    return {(p["arch"], p["kind"], p["backend"]): p for p in json.loads(TABLE.read_text())["probes"]}


def checkpoint_kind(spec: ModelSpec, model_quant: str | None) -> str | None:
    """The kind of expert weights the table is keyed by; None for a kind no probe covers."""
    if model_quant is None:
        return "bf16"
    if model_quant == "fp8" and spec.quant is not None and spec.quant.is_block_fp8:
        return "fp8_block"
    if model_quant in ("mxfp4", "modelopt_fp4"):
        return model_quant
    return None


def moe_dispatch(spec: ModelSpec, arch: str, backend: str, model_quant: str | None, *,
                 worker: str = "target", flag: str = "--moe-runner-backend") -> Dispatch | None:
    """What SGLang's own dispatch gave this kind of experts under ``backend`` on ``arch``'s family
    (sm90 or sm100), or its refusal; None where no probe covers it. A draft worker's backend
    (``--speculative-moe-runner-backend``) is not checked by the server-argument asserts that
    refuse some probes before any layer is built, so those probes say nothing about a draft."""
    if spec.moe is None:
        return None
    family = {9: "sm90", 10: "sm100"}.get(arch_major(arch))
    kind = checkpoint_kind(spec, model_quant)
    probe = _table().get((family, kind, backend)) if family and kind else None
    if probe is None or "oracle_error" in probe or not ("runner" in probe or "error" in probe):
        return None  # no probe, or the oracle's own environment failed it: not SGLang's answer
    if worker == "draft" and "resolved_backend" not in probe:
        return None  # refused while resolving the target's --moe-runner-backend
    apis = tuple(probe["apis"]) if "apis" in probe else None
    return Dispatch(kind, backend, probe.get("quant_method"), probe.get("runner"), probe.get("error"), apis, flag)
