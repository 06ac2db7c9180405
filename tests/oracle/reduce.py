"""What of an oracle run fi-autotune's plan must equal: the autotune view of one serving command.

``sglang_case.evaluate`` returns everything (all ~550 resolved server arguments, every rank
file, every recorded call); a golden keeps the part that decides what SGLang tunes and where
it looks: the resolved arguments in ``RESOLVED_VIEW``, and per worker the autotune gate, key
string, key, rank files, dummy passes and the FlashInfer calls (with FlashInfer's own keys).
"""

from __future__ import annotations

#: Resolved server arguments that reach the autotune path or explain a difference there.
RESOLVED_VIEW = (
    "dtype", "quantization", "moe_runner_backend", "moe_a2a_backend", "speculative_moe_runner_backend",
    "speculative_moe_a2a_backend", "attention_backend", "decode_attention_backend", "prefill_attention_backend",
    "kv_cache_dtype", "page_size", "context_length", "chunked_prefill_size", "max_prefill_tokens",
    "max_running_requests", "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
    "speculative_num_draft_tokens", "speculative_draft_model_path", "speculative_draft_model_quantization",
    "tp_size", "pp_size", "dp_size", "attn_dp_size", "ep_size", "disaggregation_mode", "fp4_gemm_runner_backend",
    "fp8_gemm_runner_backend", "dsa_decode_backend", "dsa_prefill_backend", "disable_shared_experts_fusion",
    "enable_two_batch_overlap", "moe_dense_tp_size", "flashinfer_autotune_skip_ops", "disable_flashinfer_autotune",
)

WORKER_VIEW = ("should_run", "key_string", "key", "arch_dir", "flashinfer_version_dir", "rank_files", "dtype",
               "quantization", "hf_config_class", "architecture", "require_mlp_tp_gather", "decode_cuda_graph")


def worker_view(w: dict | None) -> dict | None:
    if not w:
        return None
    out = {k: w.get(k) for k in WORKER_VIEW}
    out["passes"] = [{k: p[k] for k in ("phase", "batch", "tokens_per_req")} for p in w.get("passes", [])]
    return out


def resolved_view(resolved: dict) -> dict:
    out = {k: resolved.get(k) for k in RESOLVED_VIEW}
    graph = resolved.get("cuda_graph_config") or {}
    decode = graph.get("decode") or {}
    out["cuda_graph_decode"] = {"backend": decode.get("backend"), "max_bs": decode.get("max_bs")}
    return out


def autotune_view(raw: dict) -> dict:
    """The parts of one evaluation the autotune path decides (no resolved arguments)."""
    if "error" in raw:
        return {"error": raw["error"]}
    if "oracle_error" in raw:
        return {"oracle_error": raw["oracle_error"]}
    out = {"target": worker_view(raw.get("target")), "draft": worker_view(raw.get("draft")),
           "extend_tokens": (raw.get("extend") or {}).get("tokens")}
    if raw.get("calls") is not None:
        out["calls"] = raw["calls"]
        out["call_errors"] = raw.get("call_errors") or []
        out["call_reads"] = raw.get("call_reads") or []
    return out


def reduce_case(case: dict, raw: dict, keys: dict | None) -> dict:
    out = {"id": case["id"], "arch": case["arch"], "argv": case["argv"], "env": case.get("env", {}),
           **autotune_view(raw)}
    if "resolved" in raw:
        out["resolved"] = resolved_view(raw["resolved"])
    if keys is not None:
        out["flashinfer_keys"] = _keys(raw.get("calls") or [], keys)
    return out


def _keys(calls: list[dict], results) -> list[dict]:
    """FlashInfer's keys per recorded call: {"call": index, "keys": [{"custom_op", "bucket",
    "candidates": [[runner, file_key], ...]}]} (duplicated calls point at the first)."""
    if not isinstance(results, list):
        return [{"error": str(results.get("oracle_error") if isinstance(results, dict) else results)}]
    by_id = {r["id"]: r for r in results}
    import json as _json

    first: dict[str, str] = {}
    out = []
    for i, c in enumerate(calls):
        sig = _json.dumps([c["api"], c["kwargs"]], sort_keys=True)
        ref = first.setdefault(sig, str(i))
        r = by_id.get(ref, {})
        out.append({"call": i, "error": r.get("error"),
                    "keys": [{"custom_op": k["custom_op"], "bucket": k["bucket"],
                              "candidates": [[c2["runner"], c2["file_key"]] for c2 in k["candidates"]
                                             if c2.get("valid_tactics") != 0]}
                             for k in r.get("keys", [])]})
    return out
