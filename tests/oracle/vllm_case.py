"""One vLLM 0.33 serving command, resolved and built by vLLM's own code: what its autotune pass reads.

    $FI_AUTOTUNE_VLLM_PYTHON tests/oracle/vllm_case.py CASES.json > RESOLVED.json

CASES.json: ``{"arch", "gpus", "models": {served: files}, "cases": [{"id", "argv", "env"}]}`` (one
arch per process: vLLM decides its platform from the GPU at import time). Each case runs in a
forked child: vLLM's ``vllm serve`` parser and ``create_engine_config`` (``vllm_env.resolve``),
then the worker's model construction on the meta device (``vllm_env.build_model``), and
``view`` reads what ``model_executor/warmup/kernel_warmup.py`` and
``flashinfer_autotune_cache.py`` read when the worker tunes:

- the gate: ``kernel_config.enable_flashinfer_autotune`` (and FlashInfer on sm90+, which the
  fake GPU's arch decides);
- which store: ``use_flashinfer_autotune_v2``'s inputs (elastic EP, pp, world size, nodes);
- the tuned token counts: ``max_num_batched_tokens``, each MoE layer's deferred-finalize cap,
  the speculator's widening (``_run_flashinfer_autotune_dummy_runs``);
- the ops skipped (``VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS``, or the CuTe-DSL FP4 linear kernel);
- every MoE layer's quant method, backend and experts kernel with the shapes and split its
  FusedMoEConfig holds, and the kernel classes of the linear layers and attention;
- the directory: ``sha256(compute_hash(include_version=False))`` of the config as the loaded
  model left it (``flashinfer_autotune_cache_hash``; see ``dir_hash`` for what it does not see).

A case vLLM refuses records its error (one line).
"""

from __future__ import annotations

import hashlib
import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_env as E  # noqa: E402


def _one_line(e: BaseException) -> str:
    """The message, on one line: pydantic's "1 validation error for X / Value error, ..." is cut
    to its value error, its trailing "For further information" line dropped."""
    lines = [ln.strip() for ln in "".join(traceback.format_exception_only(type(e), e)).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("For further information")]
    picked = next((ln for ln in lines if ln.startswith(("Value error", "Assertion failed"))), None)
    return (f"{type(e).__name__}: {picked}" if picked else " ".join(lines))[:400]


def _name(obj) -> str | None:
    if obj is None:
        return None
    return obj.__name__ if isinstance(obj, type) else type(obj).__name__


def _moe(layer) -> dict:
    qm = layer._quant_method
    mc = getattr(layer, "moe_config", None) or getattr(qm, "moe", None)
    backend = next((getattr(qm, a) for a in dir(qm) if a.endswith("_backend") and not a.startswith("__")
                    and not callable(getattr(qm, a, None))), None)
    experts = getattr(qm, "experts_cls", None)
    out = {"quant_method": _name(qm), "backend": str(backend) if backend is not None else None,
           "experts": _name(experts), "experts_module": getattr(experts, "__module__", None)}
    if mc is not None:
        p = mc.moe_parallel_config
        out |= {"experts_global": mc.num_experts, "experts_local": mc.num_local_experts, "top_k": mc.experts_per_token,
                "hidden": mc.hidden_dim, "intermediate_per_partition": mc.intermediate_size_per_partition,
                "in_dtype": str(mc.in_dtype), "activation": str(mc.activation), "moe_backend": str(mc.moe_backend),
                "tp": p.tp_size, "ep": p.ep_size, "dp": p.dp_size, "use_ep": p.use_ep,
                "all2all": str(getattr(p, "all2all_backend", None)),
                "deferred_finalize": bool(mc.use_deferred_moe_finalize),
                "deferred_max_tokens": mc.defer_moe_finalize_max_num_tokens,
                "max_num_tokens": mc.max_num_tokens}
    return out


def _kernels(model) -> dict:
    """The kernel (or scheme) classes of linear layers and the attention backends, each once."""
    linear, attention = set(), set()
    for module in model.modules():
        for holder in ("quant_method", "scheme"):
            kernel = getattr(getattr(module, holder, None), "kernel", None)
            if kernel is not None:
                linear.add(_name(kernel))
        backend = getattr(module, "attn_backend", None)
        if backend is not None:
            attention.add(getattr(backend, "__name__", _name(backend)))
    return {"linear": sorted(linear), "attention": sorted(attention)}


def dir_hash(cfg) -> str:
    """``flashinfer_autotune_cache_hash``: the cache config normalized, then sha256 of
    ``compute_hash(include_version=False)``. Computed on the config as ``create_engine_config``
    and the model's construction leave it; what a worker changes later (attention backends'
    CUDA-graph support checks after the KV cache is sized) is not run here."""
    from vllm.config import replace
    from vllm.model_executor.warmup.flashinfer_autotune_cache import _normalize_cache_config_for_hash

    cache = _normalize_cache_config_for_hash(cfg.cache_config)
    if cache is not cfg.cache_config:
        cfg = replace(cfg, cache_config=cache)
    return hashlib.sha256(cfg.compute_hash(include_version=False).encode()).hexdigest()


def view(cfg, model) -> dict:
    import vllm.envs as envs
    from vllm.platforms import current_platform
    from vllm.utils.flashinfer import has_flashinfer

    pc, sc, mc, kc = cfg.parallel_config, cfg.scheduler_config, cfg.model_config, cfg.kernel_config
    layers = E.moe_layers(cfg)
    moes = [_moe(layer) for layer in layers]
    distinct = []
    for m in moes:
        if m not in distinct:
            distinct.append(m)
    spec = cfg.speculative_config
    world = pc.world_size_across_dp if pc.data_parallel_size > 1 else pc.world_size
    return {
        "gate": {"enable_flashinfer_autotune": kc.enable_flashinfer_autotune, "has_flashinfer": has_flashinfer(),
                 "sm90_or_newer": current_platform.has_device_capability(90)},
        "store": {"world_size": world, "pp": pc.pipeline_parallel_size, "elastic_ep": pc.enable_elastic_ep,
                  "nnodes": getattr(pc, "nnodes", 1)},
        "parallel": {"tp": pc.tensor_parallel_size, "pp": pc.pipeline_parallel_size, "dp": pc.data_parallel_size,
                     "pcp": getattr(pc, "prefill_context_parallel_size", 1),
                     "dcp": getattr(pc, "decode_context_parallel_size", 1),
                     "enable_expert_parallel": pc.enable_expert_parallel, "enable_eplb": pc.enable_eplb,
                     "all2all_backend": str(getattr(pc, "all2all_backend", None))},
        # max_num_seqs bounds the speculator's widening only (runner.max_num_reqs)
        "tokens": {"max_num_batched_tokens": sc.max_num_batched_tokens,
                   "speculative": None if spec is None else {"method": spec.method,
                                                             "num_speculative_tokens": spec.num_speculative_tokens,
                                                             "max_num_seqs": sc.max_num_seqs}},
        "skip_ops": None if envs.VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS is None
        else sorted(envs.VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS),
        "model": {"dtype": str(mc.dtype), "quantization": mc.quantization, "architecture": mc.architecture},
        "kernel_config": {"moe_backend": str(kc.moe_backend), "linear_backend": str(kc.linear_backend)},
        "moe": {"layers": len(layers), "kinds": distinct},
        "kernels": _kernels(model),
        "lora": cfg.lora_config is not None,
        "dir_hash": dir_hash(cfg),
    }


def evaluate(case: dict) -> dict:
    out = {"id": case["id"]}
    try:
        cfg = E.resolve(case["argv"], case.get("env"), case.get("launcher", "vllm serve"))
    except BaseException as e:  # noqa: BLE001 - vLLM's own refusal is the answer
        return out | {"error": _one_line(e)}
    try:
        model = E.build_model(cfg)
    except BaseException as e:  # noqa: BLE001 - refused while building the layers
        return out | {"error": "building the model: " + _one_line(e)}
    return out | {"view": view(cfg, model)}


def main() -> None:
    payload = json.loads(Path(sys.argv[1]).read_text())
    result = E.claim_stdout()
    E.boot(payload["arch"], payload.get("gpus", 8))
    E.materialize_models(payload.get("models", {}))
    if payload["cases"]:  # import and warm vLLM once, before forking
        evaluate(dict(payload["cases"][0], id="warm-up"))
    results = []
    for case in payload["cases"]:
        res = E.in_child(evaluate, case, failed={"id": case["id"]})
        results.append(res)
        print(f"{case['id']}: {'error: ' + res['error'] if 'error' in res else 'ok'}", file=sys.stderr, flush=True)
    print(json.dumps({"arch": payload["arch"], "results": results}), file=result, flush=True)


if __name__ == "__main__":
    main()
