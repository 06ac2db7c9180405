"""Which experts kernel vLLM 0.33 gives a model's MoE layers, as vLLM's own code answered.

``--moe-backend`` is a request, not the kernel: each quant method's oracle (vLLM's
``model_executor/layers/fused_moe/oracle/``) picks an experts class from the backends the
weights, the GPU and the parallel layout support - ``auto`` on Hopper puts Triton before
FlashInfer for bf16 experts, and an explicit backend the weights cannot run is refused at
startup. The table ``data/vllm-0.33.0-moe-dispatch.json`` holds, per (arch, kind of expert
weights, backend, parallel layout), the quant method, backend and experts class vLLM's own
model construction gave the first MoE layer (on the meta device, no weights), or vLLM's
refusal, recorded on CPU by ``tests/oracle/record_vllm.py dispatch``. A combination no probe
covers is not modelled: the planner refuses it rather than guess.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from autotune_cache.plan.resolution import arch_major

TABLE = Path(__file__).resolve().parent / "data" / "vllm-0.33.0-moe-dispatch.json"


def layout_class(tp: int, dp: int, ep: int) -> str:
    """The probed layout whose dispatch stands for this one: vLLM's backend selection reads the
    MoE's dp size (``moe_parallel_config.dp_size > 1``) and whether experts are split whole
    (``use_ep``), not the widths (``tests/oracle/record_vllm.py DISPATCH_LAYOUTS``)."""
    if dp > 1:
        return "tp2-dp2-ep" if ep > 1 else "tp2-dp2"
    if ep > 1:
        return "tp2-ep"
    return "tp2" if tp > 1 else "tp1"


@dataclass(frozen=True)
class VllmDispatch:
    kind: str
    backend: str
    layout: str
    arch: str
    quant_method: str | None = None
    experts: str | None = None  # the experts class vLLM picked
    experts_module: str | None = None
    error: str | None = None  # vLLM's refusal (resolving the config or building the layer)

    @property
    def runs_flashinfer(self) -> bool:
        """The experts call a FlashInfer kernel (vLLM's ``experts/flashinfer_*`` and ``trtllm_*``)."""
        module = (self.experts_module or "").rsplit(".", 1)[-1]
        return module.startswith(("flashinfer_", "trtllm_"))

    @property
    def source(self) -> str:
        """The recording this dispatch comes from, as a plan names it (``from: ...``)."""
        return (f"vllm-0.33.0 dispatch probe ({self.arch}, {self.kind} experts, --moe-backend {self.backend}, "
                f"{self.layout}): {self.quant_method} -> {self.experts}")

    def refusal(self) -> str:
        return (f"--moe-backend {self.backend} with {self.kind} experts on {self.arch}: vLLM 0.33 refuses it at "
                f"startup ({self.error})")

    def why(self) -> str:
        return (f"--moe-backend {self.backend} with {self.kind} experts: vLLM 0.33 gives the MoE layers "
                f"{self.quant_method} with {self.experts} (not a FlashInfer kernel), so its autotune pass finds "
                "nothing to tune (vLLM's own model construction, recorded in "
                "engines/vllm/data/vllm-0.33.0-moe-dispatch.json)")


@functools.cache
def _table() -> dict[tuple[str, str, str, str], dict]:
    if not TABLE.is_file():
        return {}
    return {(p["arch"], p["kind"], p["backend"], p["layout"]): p for p in json.loads(TABLE.read_text())["probes"]}


def moe_dispatch(kind: str | None, arch: str, backend: str, tp: int, dp: int, ep: int) -> VllmDispatch | None:
    """vLLM's answer for these experts on ``arch``'s family (sm90 or sm100), or None: no probe."""
    family = {9: "sm90", 10: "sm100"}.get(arch_major(arch))
    layout = layout_class(tp, dp, ep)
    probe = _table().get((family, kind, backend, layout)) if family and kind else None
    if probe is None or "oracle_error" in probe:
        return None
    if "error" in probe:
        return VllmDispatch(kind, backend, layout, arch, error=probe["error"])
    first = probe["moe"][0] if probe.get("moe") else {}
    return VllmDispatch(kind, backend, layout, arch, first.get("quant_method"), first.get("experts"),
                        first.get("experts_module"))
