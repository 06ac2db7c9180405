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
from autotune_cache.plan.weights import expert_weights_kind

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
    a2a: str = "none"  # --moe-a2a-backend of the probe
    #: The tunable calls the forward made, with the arguments that reach FlashInfer's keys.
    tunable_calls: tuple[dict, ...] = ()

    @property
    def tunable_apis(self) -> set[str]:
        return {a for a in self.apis or () if is_tunable_moe_api(a)}

    @property
    def runs_flashinfer(self) -> bool:
        """The experts make a tunable FlashInfer MoE call (the recorded forward's, else the runner's)."""
        if self.apis is not None:
            return any(is_tunable_moe_api(a) for a in self.apis)
        return self.runner in FLASHINFER_RUNNERS

    @property
    def source(self) -> str:
        """The recording this dispatch comes from, as a plan names it (``from: ...``)."""
        a2a = f", --moe-a2a-backend {self.a2a}" if self.a2a != "none" else ""
        return (f"sglang-0.5.23 dispatch probe ({self.kind} experts, {self.flag} {self.backend}{a2a}): "
                f"{self.quant_method} -> MoeRunnerBackend.{self.runner}")

    def refusal(self, arch: str) -> str:
        first = self.error.splitlines()[0]
        a2a = f" and --moe-a2a-backend {self.a2a}" if self.a2a != "none" else ""
        return (f"{self.flag} {self.backend}{a2a} with {self.kind} experts on {arch}: SGLang 0.5.23 fails at "
                f"startup ({first})")

    def not_modelled(self, api: str | None) -> str:
        """Why a plan whose MoE call is ``api`` (None: none) is not the one this dispatch recorded."""
        theirs = ", ".join(sorted(self.tunable_apis)) or "no FlashInfer MoE call"
        return (f"{self.flag} {self.backend}" + (f" with --moe-a2a-backend {self.a2a}" if self.a2a != "none" else "")
                + f" and {self.kind} experts: SGLang 0.5.23's own dispatch calls {theirs}, which fi-autotune does not "
                  f"model" + (f" (it would plan {api})" if api else ""))

    def why(self) -> str:
        return (f"{self.flag} {self.backend} with {self.kind} experts: SGLang 0.5.23 gives the MoE layer "
                f"{self.quant_method}, which runs them on {_RUNNER_NAMES.get(self.runner, self.runner)} "
                f"(MoeRunnerBackend.{self.runner}), not FlashInfer: nothing is tuned for the experts (SGLang's own "
                "model construction, recorded in engines/sglang/data/sglang-0.5.23-moe-dispatch.json)")


_RUNNER_NAMES = {"TRITON": "SGLang's Triton MoE kernels", "TRITON_KERNELS": "triton_kernels",
                 "DEEP_GEMM": "DeepGEMM"}


@functools.cache
def _table() -> dict[tuple[str, str, str, str], dict]:
    """(arch, kind, backend, a2a) -> the probe; the commands of another shape (``variant``: the
    ``--ep`` startup check) are read by the tests, not here."""
    if not TABLE.is_file():
        return {}
    return {(p["arch"], p["kind"], p["backend"], p.get("a2a", "none")): p
            for p in json.loads(TABLE.read_text())["probes"] if "variant" not in p}


def moe_dispatch(spec: ModelSpec, arch: str, backend: str, model_quant: str | None, *,
                 worker: str = "target", flag: str = "--moe-runner-backend", a2a: str = "none") -> Dispatch | None:
    """What SGLang's own dispatch gave this kind of experts under ``backend`` (and ``a2a``) on
    ``arch``'s family (sm90 or sm100), or its refusal; None where no probe covers it. A draft
    worker's backend (``--speculative-moe-runner-backend``) is not checked by the server-argument
    asserts that refuse some probes before any layer is built, so those probes say nothing about a draft."""
    if spec.moe is None:
        return None
    family = {9: "sm90", 10: "sm100"}.get(arch_major(arch))
    kind = expert_weights_kind(spec, model_quant)
    probe = _table().get((family, kind, backend, a2a or "none")) if family and kind else None
    if probe is None or "oracle_error" in probe or not ("runner" in probe or "error" in probe):
        return None  # no probe, or the oracle's own environment failed it: not SGLang's answer
    if worker == "draft" and "resolved_backend" not in probe:
        return None  # refused while resolving the target's --moe-runner-backend
    apis = tuple(probe["apis"]) if "apis" in probe else None
    return Dispatch(kind, backend, probe.get("quant_method"), probe.get("runner"), probe.get("error"), apis, flag,
                    a2a or "none", tuple(probe.get("tunable_calls") or ()))


def not_recorded(spec: ModelSpec, arch: str, backend: str, model_quant: str | None, flag: str, a2a: str) -> str:
    """The refusal for a combination no probe covers: never a guessed recipe."""
    kind = expert_weights_kind(spec, model_quant) or f"{model_quant or 'bf16'} (a kind no probe covers)"
    return (f"{flag} {backend}" + (f" with --moe-a2a-backend {a2a}" if a2a not in (None, "none") else "")
            + f" and {kind} experts on {arch}: not modelled - no recording of SGLang 0.5.23's own MoE dispatch covers "
              "it (engines/sglang/data/sglang-0.5.23-moe-dispatch.json)")
