"""The FlashInfer calls one serving command's startup autotune passes make, recorded from SGLang's code.

    $FI_AUTOTUNE_SGLANG_PYTHON tests/oracle/sglang_calls.py KIND CASE.json

KIND is ``moe``, ``linear`` or ``attention`` (each recorder patches the process its own way, so
each runs in a process of its own). CASE.json is a ``sglang_case.py`` case plus ``passes``: what
``sglang_case.py`` found for it (``{"target": [...], "draft": [...]}``, each pass with ``phase``,
``batch``, ``tokens_per_req``) and ``gather`` (the attention-DP width the MoE input is gathered
over, per worker). Prints ``{"calls": [{"worker", "phase", "m", "api", "kwargs", ...}], "errors"}``.

Per pass: the MoE block runs on ``batch x tokens_per_req x gather`` rows (eagerly for the target,
in capture mode for the draft, as SGLang's passes run), the linear layers on ``batch x
tokens_per_req`` rows, and the attention backend on ``batch`` requests of ``tokens_per_req``
tokens (decode, or TARGET_VERIFY), for MLA models (no MHA entry point of FlashInfer is tunable);
the draft's extend pass (DRAFT_EXTEND_V2) is not recorded for attention.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_env as E  # noqa: E402


def main() -> None:
    kind, case = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    if kind == "linear":
        import sglang_linear_calls as L

        L.boot(case["arch"], case.get("gpus", 8))
    else:
        E.boot(case["arch"], case.get("gpus", 8))
    E.materialize_models(case.get("models", {}))
    sa = E.resolve(case["argv"], case.get("env"))
    ranks = E.launcher_ranks(sa)
    E.publish(sa, tp_rank=ranks[0]["tp"], pp_rank=ranks[0]["pp"], dp_rank=ranks[0]["dp"])
    out: dict = {"calls": [], "errors": []}
    E.trace_reads()
    pool = E.request_pool_size(sa, case.get("token_capacity", 1 << 30))
    for worker, passes in case["passes"].items():
        if not passes:
            continue
        mr = E.ModelRunnerView(sa, is_draft_worker=worker == "draft", pool_size=pool)
        gather = case["gather"].get(worker, 1)
        for p in passes:
            try:
                calls = _record(kind, sa, mr, worker, p, gather)
            except BaseException as e:  # noqa: BLE001 - reported, the other passes still run
                if os.environ.get("FI_AUTOTUNE_ORACLE_TRACE"):
                    traceback.print_exc()
                out["errors"].append({"worker": worker, "phase": p["phase"],
                                      "error": "".join(traceback.format_exception_only(type(e), e)).strip()[:500]})
                continue
            for c in calls:
                out["calls"].append({"worker": worker, "phase": p["phase"], "kind": kind, **c})
    out["reads"] = sorted(f"{p}.{n}" for p, n in E.READS)
    print(json.dumps(E.jsonable(out)))


def _no_symmetric_memory() -> None:
    """--enable-symm-mem makes SGLang allocate the MoE's buffers from an NCCL memory pool (a CUDA
    extension it builds at runtime): where a buffer lives, not what the FlashInfer call is given.
    The recorders take ordinary CPU tensors instead."""
    from sglang.srt.distributed.device_communicators import pynccl_allocator

    pynccl_allocator.is_symmetric_memory_enabled = lambda: False


NOT_RECORDED = {("linear", "draft"): "the linear recorder builds target models only",
                ("attention", "draft"): "the attention recorder builds the target's backend only"}


def _record(kind: str, sa, mr, worker: str, p: dict, gather: int) -> list[dict]:
    batch, width = p["batch"], p["tokens_per_req"]
    if (kind, worker) in NOT_RECORDED:
        return []
    _no_symmetric_memory()
    if kind == "moe":
        from sglang_moe_calls import record_moe_calls

        hf = mr.model_config.hf_config
        if not any(getattr(hf, n, None) for n in ("n_routed_experts", "num_experts", "num_local_experts")):
            return []  # a dense model (no expert count in its config): no MoE block to build

        m = batch * width * gather
        return [dict(c, m=m) for c in record_moe_calls(sa, mr, m, capture_mode=worker == "draft")]
    if kind == "linear":
        import sglang_linear_calls as L

        m = batch * width
        calls = [dict(c, m=m) for c in L.record_linear_calls(sa, mr, m) if c.get("tunable", True)]
        if L.LAST_RUN.get("errors"):  # a layer whose forward failed recorded nothing: say so
            raise RuntimeError("; ".join(L.LAST_RUN["errors"][:3]))
        return calls
    if kind == "attention":
        from sglang_attn_calls import record_attention_calls

        if getattr(mr.model_config, "kv_lora_rank", None) is None:
            # Not an MLA model: FlashInfer 0.7.2.post1 enters its autotuner (AutoTuner.choose_one)
            # from no MHA/GQA attention entry point (decode.py, prefill.py have none); only the
            # MLA decode kernel (mla/_core.py) is tunable.
            return []

        if p["phase"] == "draft_extend":
            return []
        if p["phase"] == "draft_decode":  # each of the top-k branches decodes one token
            batch, width = batch * width, 1
        mode = "target_verify" if p["phase"] == "target_verify" else "decode"
        return [dict(c, m=batch) for c in record_attention_calls(sa, mr, batch, width, mode)
                if c.get("tunable", True)]
    raise SystemExit(f"unknown recorder {kind!r}")


if __name__ == "__main__":
    main()
