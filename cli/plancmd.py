"""``plan``: what SGLang would tune for a model and flags, resolved on CPU; the JSON warm consumes."""

from __future__ import annotations

import functools

import click

from autotune_cache.errors import UsageError
from autotune_cache.plan.keys import DEFAULT_SCHEMA, SCHEMAS, get_schema, schema_for_sglang
from autotune_cache.plan.request import TuneRequest
from autotune_cache.engines.sglang.resolve import ServerFlags

from .output import Output
from .params import POSITIVE, cache_dir_option, json_option, resolve_root, shard_option, targets_option


def _split(value) -> tuple[str, ...]:
    """``--skip-ops a,b`` (ours: comma-separated); a tuple comes from a serving command, where
    SGLang keeps each token whole."""
    if isinstance(value, tuple):
        return tuple(sorted(set(value)))
    return tuple(sorted({s.strip() for s in value.split(",") if s.strip()}))


def vllm_options(fn):
    """What only a vLLM target needs: its config hash and token budget."""
    options = [
        click.option("--vllm-config-hash", default=None, metavar="HASH",
                     help="vllm layouts: the 64-hex hash vLLM names its cache dir by (computed by vLLM after it "
                          "loads the model); its startup line 'Using FlashInfer autotune cache file: ...' or that "
                          "path may be pasted whole."),
        click.option("--max-num-batched-tokens", type=POSITIVE, default=None,
                     help="vllm layouts: the server's --max-num-batched-tokens [default: 8192, vllm serve's on "
                          "an H100/H200]."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def vllm_request(request: TuneRequest, kw: dict, layout: str) -> TuneRequest:
    """``request`` aimed at vLLM's tree ``layout`` (vllm or vllm-dir)."""
    from dataclasses import replace

    from autotune_cache.engines.vllm.planner import DEFAULT_MAX_NUM_BATCHED_TOKENS, VllmTarget, parse_config_hash

    if kw.get("vllm_config_hash") is None:
        raise UsageError(f"--layout {layout} needs --vllm-config-hash: vLLM names its cache dir by a hash of its "
                         "whole resolved config, taken after it loads the model, so only vLLM can say it; copy it "
                         "from its startup line 'Using FlashInfer autotune cache file: .../<hash>/...'")
    n = kw.get("max_num_batched_tokens") or DEFAULT_MAX_NUM_BATCHED_TOKENS
    return replace(request, vllm=VllmTarget(parse_config_hash(kw["vllm_config_hash"]), n, layout))


def reject_vllm_only(kw: dict) -> None:
    for name in ("vllm_config_hash", "max_num_batched_tokens"):
        if kw.get(name) is not None:
            raise UsageError(f"--{name.replace('_', '-')} goes with --layout vllm (or vllm-dir)")


def serving_options(fn=None, *, model_required: bool = True):  # noqa: ARG001 - --model or --model-path, checked in request_from
    """The model and server flags shared by plan, warm and verify (named as sglang names them)."""
    if fn is None:
        return functools.partial(serving_options, model_required=model_required)
    options = [
        click.option("--model", default=None,
                     help="Where the config comes from: a hub id, a built-in preset, or a local model directory "
                          "(default: --model-path)."),
        click.option("--model-path", default=None,
                     help="The server's --model-path exactly as it will be launched (hashed into the key), "
                          "e.g. /models/GLM-5.1-FP8 in an image (default: --model)."),
        click.option("--config", "config_path", help="A config.json (or a directory holding one) to use instead of looking it up."),
        click.option("--revision", help="Hub revision of the config."),
        click.option("--arch", help="Target arch: sm90, sm100 or sm103 (default: this machine's GPU)."),
        click.option("--tp", type=POSITIVE, default=1, show_default=True),
        click.option("--pp", type=POSITIVE, default=1, show_default=True),
        click.option("--dp", type=POSITIVE, default=1, show_default=True, help="Attention DP size (--enable-dp-attention), or replicas with --no-dp-attention."),
        click.option("--no-dp-attention", is_flag=True, help="--dp means independent replicas."),
        click.option("--ep", type=POSITIVE, default=1, show_default=True),
        click.option("--dtype", default="auto", show_default=True),
        click.option("--quantization", default=None, help="The server's --quantization (default: unset)."),
        click.option("--moe-runner-backend", default="auto", show_default=True),
        click.option("--skip-ops", default="", help="Comma-separated --flashinfer-autotune-skip-ops."),
        click.option("--max-running-requests", type=POSITIVE),
        click.option("--cuda-graph-max-bs", type=POSITIVE),
        click.option("--chunked-prefill-size", type=POSITIVE),
        click.option("--autotune-extend", is_flag=True, help="The server runs with SGLANG_FLASHINFER_AUTOTUNE_EXTEND=1."),
        click.option("--moe-fused-finalize", is_flag=True,
                     help="The server runs with SGLANG_FLASHINFER_MOE_FUSED_FINALIZE=1 (in the cutlass MoE's key)."),
        click.option("--trust-remote-code", is_flag=True,
                     help="The server runs with --trust-remote-code (the key then hashes config.json's auto_map class)."),
        click.option("--moe-a2a-backend", default="none", show_default=True),
        click.option("--kv-cache-dtype", default="auto", show_default=True),
        click.option("--page-size", type=POSITIVE),
        click.option("--context-length", type=POSITIVE),
        click.option("--attention-backend", default=None),
        click.option("--decode-attention-backend", default=None),
        click.option("--prefill-attention-backend", default=None),
        click.option("--dsa-decode-backend", default=None),
        click.option("--fp4-gemm-backend", default="auto", show_default=True,
                     help="The server's --fp4-gemm-backend (NVFP4 linear layers)."),
        click.option("--speculative-algorithm", default=None, help="EAGLE (NEXTN) or EAGLE3: SGLang then tunes "
                     "a draft worker too, into an entry of its own."),
        click.option("--speculative-num-steps", type=POSITIVE),
        click.option("--speculative-eagle-topk", type=POSITIVE),
        click.option("--speculative-num-draft-tokens", type=POSITIVE),
        click.option("--speculative-moe-runner-backend", default=None),
        click.option("--speculative-draft-model-path", default=None),
        click.option("--speculative-attention-mode", default=None),
        click.option("--disaggregation-mode", type=click.Choice(["null", "decode"]), default="null", show_default=True,
                     help="decode: a PD-disaggregated decode worker."),
        click.option("--disable-cuda-graph", is_flag=True, help="The server runs with --disable-cuda-graph."),
        click.option("--max-tokens", type=POSITIVE, help="Tune buckets up to this many tokens instead of the engine's maximum."),
        click.option("--gpu-uuids", default=None,
                     help="flashinfer_megamoe only: the serving GPUs' UUIDs in tp-rank order (comma-separated, as "
                          "nvidia-smi -L prints them), or 'auto' for this machine's (rank t on GPU t)."),
        click.option("--engine", default=None, metavar="sglang==X.Y.Z",
                     help="The SGLang release that will serve: picks its cache-key schema (default: the sglang "
                          "installed here, read without importing it; else 0.5.23)."),
        click.option("--schema", default=None, help=f"Key schema by name, overriding --engine ({', '.join(SCHEMAS)})."),
        click.option("--flashinfer-version", help="Default: the installed flashinfer-python."),
        cache_dir_option,
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _gpu_uuids(value: str | None) -> tuple[str, ...]:
    """``--gpu-uuids``: a list, or ``auto``: this machine's GPUs in index order (NVML/nvidia-smi)."""
    from autotune_cache.plan.topology import TopologyError, normalize_gpu_uuid

    if not value:
        return ()
    if value == "auto":
        from autotune_cache.tune.warm import detect_gpu_uuids

        uuids = detect_gpu_uuids()
        if not uuids:
            raise UsageError("--gpu-uuids auto: no GPU found here (give the serving machine's UUIDs)")
        return tuple(uuids)
    try:
        return tuple(normalize_gpu_uuid(u) for u in value.split(",") if u.strip())
    except TopologyError as e:
        raise UsageError(f"--gpu-uuids: {e}") from None


def pick_schema(kw: dict) -> tuple[str, str]:
    """(key schema, where it came from): --schema, else --engine sglang==X.Y.Z, else the sglang
    installed in this Python (importlib.metadata: no import), else SGLang 0.5.23's."""
    from autotune_cache.autotuner.installed import installed_version

    if kw.get("schema"):
        return get_schema(kw["schema"]).name, "--schema"
    engine = kw.get("engine")
    if engine:
        name, sep, version = engine.partition("==")
        if name.strip().lower() != "sglang" or not sep:
            raise UsageError(f"--engine {engine!r}: expected sglang==X.Y.Z")
        return schema_for_sglang(version), f"--engine {engine}"
    here = installed_version("sglang")
    if here:
        return schema_for_sglang(here), f"sglang {here} installed here"
    return DEFAULT_SCHEMA, "SGLang 0.5.23 (no sglang installed here; --engine sglang==X.Y.Z picks another)"


def request_from(kw: dict) -> TuneRequest:
    """The typed request behind the serving options (``kw``: the click keyword arguments)."""
    from autotune_cache.engines.sglang.serving_command import check_option_values

    check_option_values(kw)
    model = kw["model"] or kw["model_path"]
    if model is None:
        raise UsageError("give --model (a hub id, preset or local model directory), or --model-path with --config")
    flags = ServerFlags(
        tp=kw["tp"], pp=kw["pp"], dp=kw["dp"], dp_attention=not kw["no_dp_attention"], ep=kw["ep"],
        dtype=kw["dtype"], quantization=None if kw["quantization"] in (None, "None", "") else kw["quantization"],
        moe_runner_backend=kw["moe_runner_backend"], skip_ops=_split(kw["skip_ops"]),
        max_running_requests=kw["max_running_requests"], cuda_graph_max_bs=kw["cuda_graph_max_bs"],
        chunked_prefill_size=kw["chunked_prefill_size"], autotune_extend=kw["autotune_extend"],
        autotune_disabled_by=kw.get("autotune_disabled_by"), gpu_uuids=_gpu_uuids(kw.get("gpu_uuids")),
        trust_remote_code=kw.get("trust_remote_code", False), moe_a2a_backend=kw.get("moe_a2a_backend") or "none",
        kv_cache_dtype=kw.get("kv_cache_dtype") or "auto", page_size=kw.get("page_size"),
        context_length=kw.get("context_length"), attention_backend=kw.get("attention_backend"),
        decode_attention_backend=kw.get("decode_attention_backend"),
        prefill_attention_backend=kw.get("prefill_attention_backend"), dsa_decode_backend=kw.get("dsa_decode_backend"),
        fp4_gemm_backend=kw.get("fp4_gemm_backend") or "auto",
        speculative_algorithm=kw.get("speculative_algorithm"), speculative_num_steps=kw.get("speculative_num_steps"),
        speculative_eagle_topk=kw.get("speculative_eagle_topk"),
        speculative_num_draft_tokens=kw.get("speculative_num_draft_tokens"),
        speculative_moe_runner_backend=kw.get("speculative_moe_runner_backend"),
        speculative_draft_model_path=kw.get("speculative_draft_model_path"),
        speculative_attention_mode=kw.get("speculative_attention_mode"),
        disaggregation_mode=kw.get("disaggregation_mode") or "null",
        decode_cuda_graph=not kw.get("disable_cuda_graph", False),
        moe_fused_finalize=kw.get("moe_fused_finalize", False),
    )
    schema, schema_source = pick_schema(kw)
    return TuneRequest(
        model=model, flags=flags, schema_source=schema_source, arch=kw["arch"].lower() if kw["arch"] else None, config=kw["config_path"],
        revision=kw["revision"], schema=schema, flashinfer_version=kw["flashinfer_version"],
        max_tokens=kw["max_tokens"], model_path=kw["model_path"],
    )


serving_command_argument = click.argument("serving_command", nargs=-1, type=click.UNPROCESSED,
                                          metavar="[-- SERVING COMMAND]")


def apply_serving_command(ctx: click.Context, kw: dict, out: Output) -> dict:
    """Fold a pasted serving command (after ``--``) into the serving options. A flag given both
    ways with two values is a usage error; flags the key and the plan do not use are listed."""
    argv = kw.pop("serving_command", ())
    if not argv:
        return kw
    from autotune_cache.engines.sglang.serving_command import parse_serving_command

    cmd = parse_serving_command(argv)
    cmd.check_refused()
    for name, value in cmd.serving_kwargs().items():
        given = ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE if name in kw else False
        if given and kw[name] != value:
            raise UsageError(f"--{name.replace('_', '-')} is {kw[name]!r} here but {value!r} in the serving command")
        kw[name] = value
    for note in cmd.notes:
        out.note(f"serving command: {note}")
    if cmd.ignored:
        out.note("serving command: ignored (SGLang's own code showed they do not reach its autotune path): "
                 + ", ".join(cmd.ignored))
    for flag in cmd.not_understood:
        out.note(f"warning: serving command: not understood: {flag}")
    kw["not_understood"] = tuple(cmd.not_understood)
    return kw


def build_plan(request: TuneRequest, cache_dir: str | None, arch: str | None = None):
    """The plan for ``request`` under the cache root ``cache_dir`` names (made if missing), else the
    root of the engine's layout."""
    from autotune_cache.registry import get_layout

    if request.arch is None:
        request = request.with_arch(arch or local_arch())
    layout = get_layout(request.vllm.layout if request.vllm is not None else "sglang")
    return request.plan(resolve_root(cache_dir, must_exist=False, layout=layout).path)


def local_arch() -> str:
    """This machine's GPU arch (NVML, no CUDA context); a usage error when there is none."""
    from autotune_cache.tune.warm import detect_gpus

    arch = detect_gpus().arch
    if arch is None:
        raise UsageError("no GPU found to take the target arch from: pass --arch sm90 or --arch sm100")
    return arch


def _fmt_kwarg(value) -> str:
    from autotune_cache.engines.sglang.recipes import T, encode

    if isinstance(value, T):
        dims = "x".join(str(d) for d in value.shape)
        col = " col-major" if value.layout == "column_major" else ""
        return f"[{dims}] {value.dtype}{col}"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt_kwarg(v) for v in value) + "]"
    enc = encode(value)
    if isinstance(enc, dict):
        return str(enc.get("enum") or enc.get("dtype"))
    return repr(value)


def _compact(values) -> str:
    values = list(values)
    return ", ".join(map(str, values)) if len(values) <= 12 else f"{', '.join(map(str, values[:6]))}, ..., {', '.join(map(str, values[-3:]))}"


def print_plan(plan, out: Output) -> None:
    r = plan.resolution
    f = r.key_fields
    out.line(f"Config      {plan.source.describe()}")
    served = f"; served as {r.key_fields.model_path}" if r.key_fields.model_path != plan.model else ""
    out.line(f"Model       {plan.model}{served}  ({plan.spec.architecture}, {plan.spec.family}, {plan.spec.config_class})")
    q = plan.spec.quant
    out.line(f"Checkpoint  dtype {plan.spec.dtype}, quantization {q.method if q else 'none'}"
             + (f" (block {q.weight_block_size[0]}x{q.weight_block_size[1]})" if q and q.weight_block_size else ""))
    out.line(f"Target      {r.arch}, {plan.layout_obj.describe_topology(r.topology)} ep={r.flags.ep}")
    out.line("Resolved    " + ", ".join([
        f"dtype={f.dtype}", f"quantization={f.quantization}", f"moe_runner_backend={f.moe_runner_backend}",
        f"attn_dp_size={f.attn_dp_size}", f"config_class={f.config_class}"]))
    if plan.spec.moe:
        out.line(f"MoE split   {plan.spec.moe.num_experts} experts, top-{plan.spec.moe.top_k}; per rank "
                 f"{r.experts_per_rank} experts, intermediate {r.moe_intermediate_per_partition} "
                 f"(moe_tp={r.moe_tp_size}, moe_ep={r.moe_ep_size})")
    if plan.engine == "vLLM":
        _print_vllm_header(plan, out)
    else:
        _print_sglang_header(plan, out)
    if plan.autotunes:
        out.line(f"Key dir     {plan.key_dir}")
        out.line(f"Rank files  {len(plan.rank_files)}: {_compact(plan.rank_files)}")
    elif r.autotunes:
        out.line("Key dir     none needed: the server's autotune pass has nothing to tune")
    else:
        out.line("Key dir     none: the server would not autotune, so it neither reads nor writes a cache")
    from autotune_cache.engines.vllm.planner import VLLM_CHECKED

    engine = "SGLang 0.5.23" if plan.engine == "SGLang" else f"vLLM {', '.join(VLLM_CHECKED)}"
    if plan.autotunes:
        out.line(f"Autotune    YES: {engine} would run FlashInfer autotune")
    elif r.autotunes:
        out.line(f"Autotune    NOTHING TO TUNE: {engine} would run its autotune pass, with no tactics to find")
    else:
        out.line(f"Autotune    NO: {engine} would not run FlashInfer autotune")
    _print_body(plan, out)


def _print_vllm_header(plan, out: Output) -> None:
    n = plan.resolution.chunked_prefill_size
    out.line(f"Tuning pass vLLM's autotune(tuning_buckets=get_hybrid_num_tokens_buckets({n}), round_up=True); "
             f"vLLM loads the files and skips it when every rank has one")
    out.line(f"Key         {plan.key}  ({plan.key_string})")


def _print_sglang_header(plan, out: Output) -> None:
    r = plan.resolution
    for p in r.passes:
        batch = f"{p.batch[0]}" if p.batch[0] == p.batch[1] else f"{p.batch[0]}-{p.batch[1]} (the request pool SGLang sizes from KV memory)"
        gather = f", x{r.attn_dp_size} at each MoE layer (dp gather)" if plan.spec.moe and r.gather > 1 else ""
        out.line(f"Dummy pass  {p.phase} ({p.runner}): batch {batch} x {p.tokens_per_req} token(s) per request{gather}")
    if not r.passes:
        out.line("Dummy pass  none")
    a = r.attention
    if a is not None and plan.spec.mla is not None:
        out.line(f"Attention   decode {a.decode_backend}" + (f" (DSA decode {a.dsa_decode_backend})" if a.dsa_decode_backend else "")
                 + f", KV {a.kv_cache_dtype}, page {a.page_size}, context {a.context_length}")
    if r.speculative is not None:
        s = r.speculative
        out.line(f"Speculative {s.algorithm} steps={s.num_steps} topk={s.eagle_topk} draft_tokens={s.num_draft_tokens}"
                 f", draft {s.draft_model_path}" + (" (the checkpoint's MTP layer)" if s.self_draft else "")
                 + (" - this plan: the DRAFT worker" if r.is_draft else " - this plan: the target worker"))
    graphs = f"decode CUDA graphs up to {r.decode_batch}" if r.decode_cuda_graph else "decode CUDA graphs off"
    out.line(f"Serving     chunked prefill {r.chunked_prefill_size} tokens per DP rank, {graphs}")
    source = f", from {plan.request.schema_source}" if plan.request is not None and plan.request.schema_source else ""
    out.line(f"Key         {plan.key}  (schema {plan.schema}: {get_schema(plan.schema).description}{source})")
    out.line(f"Key string  {plan.key_string}")


def _print_body(plan, out: Output) -> None:
    r = plan.resolution
    for reason in plan.reasons:
        out.line(f"  - {reason}")
    for note in r.notes + plan.notes:
        out.line(f"  note: {note}")
    for i, w in enumerate(plan.workloads, 1):
        if not w.ops:
            continue
        spans = ", ".join(f"{a}-{b - 1}" for a, b in w.stages)
        out.line(f"\nWorkload {i}: {len(w.ranks)} rank(s) share it (layers {spans}): {_compact(w.ranks)}")
        for op in w.ops:
            rec = op.recipe
            out.line(f"  {rec.id}: {rec.api}  x{rec.layers} layers  custom_ops={','.join(rec.custom_ops)}"
                     + ("" if rec.verified else "  [keys from FlashInfer's own code on SGLang's own call; not yet "
                                                  "run on a GPU]" if rec.keys_checked else
                        "  [read from SGLang's code; not recorded, not run on a GPU]"))
            out.line(f"    mirrors {rec.mirrors}")
            for k, v in rec.kwargs.items():
                if v is not None:
                    out.line(f"    {k:<24} {_fmt_kwarg(v)}")
            out.line(f"    buckets ({len(op.buckets)}, max {op.buckets[-1]}): {_compact(op.buckets)}")
            out.line(f"    engine dummy pass looks up {len(op.engine_keys)}: {_compact(op.engine_keys)}"
                     + (f"; added to the plan: {', '.join(map(str, op.added))}" if op.added else "; all in the plan"))
    out.line(f"\nProfiles    {plan.profiles} (op, bucket) profiles to tune"
             + (f", copied to {len(plan.rank_files)} rank files" if plan.autotunes else "; warm writes nothing"))


@click.command("plan")
@serving_options
@click.option("--layout", type=click.Choice(["sglang", "vllm", "vllm-dir"]), default="sglang", show_default=True,
              help="Whose startup tuning to plan: SGLang's, or vLLM's (vllm-dir: under "
                   "$VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR).")
@vllm_options
@targets_option
@shard_option
@click.option("--store", "store_url", default=None, help="With --targets: coverage in this store instead of the tree.")
@json_option
@serving_command_argument
@click.pass_context
def plan_cmd(ctx, layout, targets_file, shard, store_url, as_json, **kw):
    """Show what SGLang would autotune for a model and server flags, and the tuning plan (no GPU needed).

    The flags can also come from the serving command itself, after `--`:
    `fi-autotune plan --arch sm100 -- python -m sglang.launch_server --model-path ... --tp 8`.
    With --targets, a whole fleet: each target's id, work and coverage, and the work once
    identical calls are merged.
    """
    out = Output(as_json)
    if targets_file:
        from .targetscmd import load_fleet, plan_targets, reject_serving_flags

        reject_serving_flags(ctx)
        loaded, chosen, total = load_fleet(targets_file, kw["cache_dir"], kw["arch"], shard)
        plan_targets(out, loaded, chosen, total, store_url)
        return
    if shard or store_url:
        raise UsageError("--shard and --store go with --targets")
    kw = apply_serving_command(ctx, kw, out)
    request = request_from(kw)
    if layout == "sglang":
        reject_vllm_only(kw)
    else:
        request = vllm_request(request, kw, layout)
    plans = [build_plan(r, kw["cache_dir"]) for r in request.workers()]

    def human() -> None:
        for i, p in enumerate(plans):
            if i:
                out.line("\n" + "=" * 20 + " speculative draft worker: its own entry " + "=" * 20)
            print_plan(p, out)

    def data() -> dict:
        d = plans[0].to_dict()
        if len(plans) > 1:
            d["draft"] = plans[1].to_dict()
        return d

    out.emit(human=human, data=data)
