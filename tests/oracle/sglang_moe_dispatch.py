"""Which quant method and MoE runner SGLang 0.5.23 gives a model's experts, for a MoE runner backend.

    $FI_AUTOTUNE_SGLANG_PYTHON tests/oracle/sglang_moe_dispatch.py PROBES.json > DISPATCH.json

PROBES.json: ``{"arch", "gpus", "models": {served: files}, "probes": [{"id", "argv"}]}`` (one arch
per process: SGLang picks its defaults from the GPU at import time). Each probe is a serving
command; in a forked child (one probe cannot leak state into the next) SGLang's own code
resolves it (``sglang_env.resolve``), sets the process up as a scheduler does
(``sglang_moe_calls._init_process``: ``initialize_moe_config`` and the GEMM backends) and builds
the model up to its first MoE layer (``sglang_moe_calls.build_moe_block``: the loader's
``_initialize_model`` with SGLang's quantization config). So the quant method is the one the
layer's own constructor picks (``quant_config.get_quant_method`` or ``UnquantizedFusedMoEMethod``)
and the runner the one its ``create_moe_runner`` selects. No forward runs, no FlashInfer call is
made. A probe SGLang refuses records its error.

Prints ``{"arch", "probes": {id: {"resolved_backend", "quant_config", "quant_method", "runner"}
| {"error"}}}``.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_env as E  # noqa: E402


def dispatch(argv: list[str], m_tokens: int = 8) -> dict:
    from sglang_moe_calls import record_moe_calls

    try:
        sa = E.resolve(argv)
    except BaseException as e:  # noqa: BLE001 - SGLang's own refusal is the answer
        return {"error": _one_line(e)}
    ranks = E.launcher_ranks(sa)
    E.publish(sa, tp_rank=ranks[0]["tp"], pp_rank=ranks[0]["pp"], dp_rank=ranks[0]["dp"])
    mr = E.ModelRunnerView(sa)
    info: dict = {}
    out = {"resolved_backend": str(sa.moe_runner_backend)}
    try:
        calls = record_moe_calls(sa, mr, m_tokens, info=info)
    except BaseException as e:  # noqa: BLE001 - refused building the layer, or failed in its first forward
        out["error"] = _one_line(e)
        calls = None
    if info:
        out |= {"quant_config": info["quant_config"], "quant_method": info["quant_method"],
                "runner": info["runner_backend"].rsplit(".", 1)[-1]}
    if calls is not None:
        out["apis"] = sorted({c["api"] for c in calls})
    return out


def _one_line(e: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(e), e)).strip()[:500]


def run_child(argv: list[str]) -> dict:
    return E.in_child(dispatch, argv)


def main() -> None:
    payload = json.loads(Path(sys.argv[1]).read_text())
    E.boot(payload["arch"], payload.get("gpus", 8))
    E.materialize_models(payload.get("models", {}))
    import sglang_moe_calls  # noqa: F401 - import SGLang once, before forking
    from sglang.srt.model_loader import loader  # noqa: F401

    out = {"arch": payload["arch"], "probes": {}}
    for p in payload["probes"]:
        out["probes"][p["id"]] = res = run_child(p["argv"])
        print(f"{p['id']}: {res}", file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
