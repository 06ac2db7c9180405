"""One serving command through SGLang 0.5.23's own code, on a fake GPU: what it would autotune.

    $FI_AUTOTUNE_SGLANG_PYTHON tests/oracle/sglang_case.py CASE.json > OUT.json

CASE.json: ``{"id", "arch", "gpus", "argv" (flags after the launcher), "env", "models":
{served path: {"config", "sidecar"}}, "token_capacity"}``. Prints one JSON object:

- ``resolved``: SGLang's ``resolved_dict()`` (every server argument after its resolution hooks);
- ``target`` / ``draft``: for the target worker and, with speculative decoding, the draft
  worker: ``should_run`` (``should_run_flashinfer_autotune``), the key string and key and every
  rank file (``flashinfer_autotune_cache_path`` for each rank the launcher spawns), and the
  dummy passes' sizes (``passes``: per phase the batch and tokens per request from SGLang's
  ``get_batch_sizes_to_capture`` / ``resolve_num_tokens_per_req``, and whether the MLP input is
  gathered over attention-DP ranks, ``require_mlp_tp_gather``);
- ``extend``: the optional EXTEND pass's token count (``max_prefill_buffer_tokens()`` or
  ``max_prefill_tokens``) and whether it runs;
- ``reads``: every resolved config leaf the code above read (the autotune path's inputs);
- ``error``: SGLang's one-line rejection of the command, if it rejects it (then nothing else).
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_env as E  # noqa: E402


def key_of(mr) -> dict:
    """SGLang's cache path for this runner, its key string (the parts it hashes) and key."""
    import hashlib

    from sglang.srt.model_executor.runner import flashinfer_autotune as F

    captured = {}
    real_sha = hashlib.sha256

    def spy(data=b"", *a, **k):
        captured.setdefault("key_string", data.decode())
        return real_sha(data, *a, **k)

    F.hashlib.sha256 = spy
    try:
        path = F.flashinfer_autotune_cache_path(mr)
    finally:
        F.hashlib.sha256 = real_sha
    return {"path": path, "key_string": captured["key_string"]}


def worker(sa, *, draft: bool, token_capacity: int) -> dict:
    from sglang.srt.model_executor.runner import flashinfer_autotune as F
    from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture
    from sglang.srt.runtime_context import get_exec, get_spec
    from sglang.srt.utils.common import require_attn_tp_gather, require_mlp_tp_gather

    ranks = E.launcher_ranks(sa)
    first = ranks[0]
    E.publish(sa, tp_rank=first["tp"], pp_rank=first["pp"], dp_rank=first["dp"])
    pool = E.request_pool_size(sa, token_capacity)
    mr = E.ModelRunnerView(sa, is_draft_worker=draft, pool_size=pool)
    out: dict = {"should_run": F.should_run_flashinfer_autotune(mr, for_speculative_draft=draft),
                 "request_pool": pool, "dtype": str(mr.dtype),
                 "quantization": mr.model_config.quantization,
                 "hf_config_class": type(mr.model_config.hf_config).__name__,
                 "architecture": mr.model_config.hf_config.architectures[0] if mr.model_config.hf_config.architectures else None}
    files = []
    key = None
    for i, r in enumerate(ranks):
        E.publish(sa, tp_rank=r["tp"], pp_rank=r["pp"], dp_rank=r["dp"], gpu_id=i)
        k = key_of(E.ModelRunnerView(sa, is_draft_worker=draft, pool_size=pool, gpu_id=i))
        files.append(k["path"].name)
        if key is None:
            key = k
        assert k["path"].parent == key["path"].parent, "ranks disagree on the key dir"
    E.publish(sa, tp_rank=first["tp"], pp_rank=first["pp"], dp_rank=first["dp"])
    out["key_string"] = key["key_string"]
    out["key"] = key["path"].parent.name
    out["arch_dir"] = key["path"].parent.parent.name
    out["flashinfer_version_dir"] = key["path"].parent.parent.parent.name
    out["rank_files"] = files
    mlp_gather, attn_gather = require_mlp_tp_gather(), require_attn_tp_gather()
    out["require_mlp_tp_gather"], out["require_attn_tp_gather"] = mlp_gather, attn_gather
    passes = []
    graph = get_exec().graph.cuda_graph_config
    out["decode_cuda_graph"] = graph is not None and str(graph.decode.backend) not in ("disabled", "Backend.DISABLED")
    if not draft:
        # cuda_graph_setup.capture_cuda_graphs builds the EagerRunner first, and its __init__ runs
        # warmup(): the autotune dummy pass (base_runner._warmup) happens there, once per model
        # runner (mr._kernel_warmed_up), at EagerRunner._autotune_buffers' batch - the request
        # pool, padded by get_eager_max_batch_size - whatever the CUDA graphs capture later.
        from sglang.srt.runtime_context import max_speculative_num_draft_tokens
        from sglang.srt.utils.common import get_eager_max_batch_size

        if mr.spec_algorithm.is_speculative():
            width = mr.decode_num_tokens_per_req(num_draft_tokens=max_speculative_num_draft_tokens() or 1)
        else:
            width = 1
        passes.append({"phase": "target_verify" if mr.spec_algorithm.is_speculative() else "decode",
                       "runner": "EagerRunner", "batch": get_eager_max_batch_size(mr.max_running_requests),
                       "tokens_per_req": width})
    elif out["decode_cuda_graph"]:
        # The draft worker's EagerRunner warmup does not tune (should_run is False for a draft
        # outside maybe_flashinfer_autotune_speculative_draft); its draft CUDA-graph runners tune
        # once per phase, at the first shape they capture: the largest batch.
        from sglang.srt.speculative.spec_utils import resolve_num_tokens_per_req

        bs, _ = get_batch_sizes_to_capture(mr)
        for phase in ("draft_decode", "draft_extend"):
            passes.append({"phase": phase, "runner": "draft CUDA graph", "batch": max(bs),
                           "tokens_per_req": resolve_num_tokens_per_req(phase=phase)})
    out["passes"] = passes
    return out


def evaluate(case: dict) -> dict:
    """Resolve ``case``'s command with SGLang and compute what its autotune path decides."""
    result: dict = {"id": case["id"]}
    try:
        sa = E.resolve(case["argv"], case.get("env"))
    except BaseException as e:  # SGLang rejecting the command is a result, not a failure
        msg = str(e).strip().splitlines()
        result["error"] = f"{type(e).__name__}: {msg[0] if msg else ''}"
        return result
    result["resolved"] = E.jsonable(sa.resolved_dict())
    E.trace_reads()
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.runtime_context import get_schedule, max_prefill_buffer_tokens

    capacity = case.get("token_capacity", 1 << 30)
    try:
        result["target"] = worker(sa, draft=False, token_capacity=capacity)
        if resolving_view(sa).speculative_algorithm:
            result["draft"] = worker(sa, draft=True, token_capacity=capacity)
        result["extend"] = {"tokens": max_prefill_buffer_tokens() or get_schedule().max_prefill_tokens}
    except BaseException as e:
        result["oracle_error"] = "".join(traceback.format_exception_only(type(e), e)).strip()
        result["oracle_traceback"] = traceback.format_exc().splitlines()[-12:]
    result["reads"] = sorted(f"{p}.{n}" for p, n in E.READS)
    return E.jsonable(result)


def main() -> None:
    case = json.loads(Path(sys.argv[1]).read_text())
    E.boot(case["arch"], case.get("gpus", 8))
    E.materialize_models(case.get("models", {}))
    print(json.dumps(evaluate(case)))


if __name__ == "__main__":
    main()
