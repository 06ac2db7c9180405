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

Prints ``{"arch", "probes": {id: {"resolved_backend", "resolved_a2a", "quant_config", "quant_method",
"moe_scheme", "runner", "apis", "tunable_calls"} | {"error"}}}``. ``tunable_calls``: each distinct
tunable FlashInfer MoE call (``cutlass_fused_moe``, ``trtllm_*_moe``) with the arguments that shape
its autotune key or say how the experts are split (``KEY_ARGS``; tensors as shape and dtype).
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_env as E  # noqa: E402


#: Arguments of a tunable FlashInfer MoE call kept in the table: the parallel split, the A2A and
#: finalize flags, the routing width, and the activation / expert-weight tensors (shape and dtype).
KEY_ARGS = ("enable_alltoall", "use_fused_finalize", "tp_size", "tp_rank", "ep_size", "ep_rank", "top_k",
            "num_experts", "local_num_experts", "local_expert_offset", "n_group", "topk_group",
            "routing_method_type", "activation_type", "tune_max_num_tokens", "use_w4_group_scaling",
            "use_mxfp8_act_scaling", "use_deepseek_fp8_block_scale", "use_int8_woq_per_channel",
            "min_latency_mode", "do_finalize", "input", "hidden_states", "token_selected_experts",
            "topk_ids", "fc1_expert_weights", "gemm1_weights")


def _is_tunable(api: str) -> bool:
    # autotune_cache/engines/sglang/dispatch.py is_tunable_moe_api
    return api.startswith("flashinfer.fused_moe.") and api.endswith("_moe")


def tunable_calls(calls: list[dict]) -> list[dict]:
    out = []
    for c in calls:
        if not _is_tunable(c["api"]):
            continue
        kept = {"api": c["api"], "args": {k: c["kwargs"][k] for k in KEY_ARGS if k in c["kwargs"]}}
        if kept not in out:
            out.append(kept)
    return out


def dispatch(argv: list[str], m_tokens: int = 8) -> dict:
    from sglang_moe_calls import record_moe_calls

    try:
        sa = E.resolve(argv)
    except BaseException as e:  # noqa: BLE001 - SGLang's own refusal is the answer
        return {"error": _one_line(e)}
    out = {"resolved_backend": str(sa.moe_runner_backend), "resolved_a2a": str(sa.moe_a2a_backend)}
    try:  # SGLang's ModelConfig (quantization verification) as the scheduler builds it
        ranks = E.launcher_ranks(sa)
        E.publish(sa, tp_rank=ranks[0]["tp"], pp_rank=ranks[0]["pp"], dp_rank=ranks[0]["dp"])
        mr = E.ModelRunnerView(sa)
    except BaseException as e:  # noqa: BLE001 - SGLang's own refusal is the answer
        return out | {"error": _one_line(e)}
    info: dict = {}
    try:
        calls = record_moe_calls(sa, mr, m_tokens, info=info)
    except BaseException as e:  # noqa: BLE001 - refused building the layer, or failed in its first forward
        out["error"] = _one_line(e)
        calls = None
    if info:
        out |= {"quant_config": info["quant_config"], "quant_method": info["quant_method"],
                "runner": info["runner_backend"].rsplit(".", 1)[-1]}
        if info.get("moe_scheme"):
            out["moe_scheme"] = info["moe_scheme"]
    if calls is not None:
        out["apis"] = sorted({c["api"] for c in calls})
        out["tunable_calls"] = tunable_calls(calls)
    return out


def _one_line(e: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(e), e)).strip()
    if not str(e):  # a bare ``assert``: say where it failed (SGLang file, line, function)
        frame = traceback.extract_tb(e.__traceback__)[-1]
        where = frame.filename.split("site-packages/", 1)[-1]
        text += f" (at {where}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()})"
    return text[:500]


def _real_scalar_types() -> None:
    """``sgl_kernel.scalar_type`` is pure Python (ScalarType and the ``scalar_types`` table, no CUDA),
    but ``cudastubs`` stands in for all of ``sgl_kernel``, whose stub answers every attribute with a
    fresh object: SGLang's Marlin checks (quantization/marlin_utils.py ``quant_type in
    supported_types``) then fail, so GPTQ / AWQ checkpoints are never converted to gptq_marlin /
    awq_marlin as on a GPU. Where sglang-kernel is installed (README.md: the oracle interpreter),
    its own scalar_type.py is loaded from the installed file; nothing else of it is."""
    import importlib.util

    from importlib.metadata import PackageNotFoundError, distribution

    try:
        files = distribution("sglang-kernel").files or []
    except PackageNotFoundError:
        return
    path = next((f.locate() for f in files if str(f) == "sgl_kernel/scalar_type.py"), None)
    if path is None:
        return
    spec = importlib.util.spec_from_file_location("sgl_kernel.scalar_type", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["sgl_kernel.scalar_type"] = module
    spec.loader.exec_module(module)


def run_child(argv: list[str]) -> dict:
    return E.in_child(dispatch, argv)


def main() -> None:
    payload = json.loads(Path(sys.argv[1]).read_text())
    E.boot(payload["arch"], payload.get("gpus", 8))
    _real_scalar_types()
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
