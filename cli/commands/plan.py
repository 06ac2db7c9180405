"""``plan``: what SGLang would tune for a model and flags, resolved on CPU; the JSON warm consumes."""

from __future__ import annotations


import click

from autotune_cache.autotuner.recipe import T, encode
from autotune_cache.plan.config_source import preset_ids
from autotune_cache.tree.layouts.values import DEFAULT_LAYOUT_NAME
from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.tune.session.fleetplan import COMMAND_LINE, FleetMember, load_fleet, plan_data

from ..output import Output
from ..params import LayoutName, json_option, shard_option, targets_option
from ..roots import rooting
from ..serving import (build_plan, engine_options, fold_serving_command, machine_of, planned_layouts,
                      request_from, serving_command_argument, serving_options)
from ..targets import plan_targets, reject_serving_flags


def _fmt_kwarg(value) -> str:
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
    for label, text in plan.engine.describe(plan):
        out.line(f"{label:<11} {text}")
    if plan.autotunes:
        for label, text in plan.layout_obj.where_rows(plan, _compact):
            out.line(f"{label:<11} {text}")
    elif r.autotunes:
        out.line("Key dir     none needed: the server's autotune pass has nothing to tune")
    else:
        out.line("Key dir     none: the server would not autotune, so it neither reads nor writes a cache")
    engine = plan.engine.title
    if plan.autotunes:
        out.line(f"Autotune    YES: {engine} would run FlashInfer autotune")
    elif r.autotunes:
        out.line(f"Autotune    NOTHING TO TUNE: {engine} would run its autotune pass, with no tactics to find")
    else:
        out.line(f"Autotune    NO: {engine} would not run FlashInfer autotune")
    _print_body(plan, out)


def _workload_title(plan, i: int, w) -> str:
    """Who gets the workload's winners, as the plan's layout says it."""
    spans = ", ".join(f"{a}-{b - 1}" for a, b in w.stages)
    return plan.layout_obj.workload_title(plan, i, spans, w.ranks, _compact)


def _print_body(plan, out: Output) -> None:
    r = plan.resolution
    for reason in plan.reasons:
        out.line(f"  - {reason}")
    for note in r.notes + plan.notes + plan.version_warnings:
        out.line(f"  note: {note}")
    for i, w in enumerate(plan.workloads, 1):
        if not w.ops:
            continue
        out.line("\n" + _workload_title(plan, i, w))
        for op in w.ops:
            rec = op.recipe
            out.line(f"  {rec.id}: {rec.api}  x{rec.layers} layers  custom_ops={','.join(rec.custom_ops)}"
                     + ("" if rec.verified else "  [keys from FlashInfer's own code on the engine's own call; "
                                                  "not yet run on a GPU]" if rec.keys_checked else
                        "  [read from SGLang's code; not recorded, not run on a GPU]"))
            out.line(f"    from {plan.provenance(rec)}")
            for k, v in rec.kwargs.items():
                if v is not None:
                    out.line(f"    {k:<24} {_fmt_kwarg(v)}")
            out.line(f"    buckets ({len(op.buckets)}, max {op.buckets[-1]}): {_compact(op.buckets)}")
            out.line(f"    engine dummy pass looks up {len(op.engine_keys)}: {_compact(op.engine_keys)}"
                     + (f"; added to the plan: {', '.join(map(str, op.added))}" if op.added else "; all in the plan")
                     if op.engine_keys else "    engine dummy pass does not call it: its buckets are for the calls of serving")
    written = plan.layout_obj.written_words(plan)
    out.line(f"\nProfiles    {plan.profiles} (op, bucket) profiles to tune" + (written if plan.autotunes else "; warm writes nothing"))
    if plan.autotunes:
        out.line(f"Kernels     {plan.kernel_modules().describe()}")


def _list_presets(ctx: click.Context, _param, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        for model in preset_ids():
            click.echo(model)
        ctx.exit(0)


@click.command("plan")
@click.option("--list-presets", is_flag=True, is_eager=True, expose_value=False, callback=_list_presets,
              help="Print the built-in presets (models whose config.json ships with fi-autotune: no hub needed) "
                   "and exit.")
@serving_options
@click.option("--layout", type=LayoutName(planned_layouts), default=DEFAULT_LAYOUT_NAME, show_default=True,
              help="Whose startup tuning to plan: SGLang's, or vLLM's (vllm-dir: under "
                   "$VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR).")
@engine_options
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
        reject_serving_flags(ctx)
        fleet = load_fleet(targets_file, rooting(kw["cache_dir"]), kw["arch"], shard, machine=machine_of(ctx))
        plan_targets(out, fleet, store_url)
        return
    if shard or store_url:
        raise UsageError("--shard and --store go with --targets")
    kw, layout = fold_serving_command(ctx, kw, out, "layout")
    request = request_from(kw, layout)
    members = [FleetMember(COMMAND_LINE, r.worker, build_plan(r, kw["cache_dir"]), ()) for r in request.workers()]
    plans = [m.plan for m in members]
    hints = would_autotune_with(plans[0], kw, layout)

    def human() -> None:
        for i, p in enumerate(plans):
            if i:
                out.line("\n" + "=" * 20 + " speculative draft worker: its own entry " + "=" * 20)
            print_plan(p, out)
        for h in hints:
            out.line(f"Hint        {plans[0].engine.label} would autotune with {h['flags']} "
                     f"({h['profiles']} profiles)")

    out.emit(human=human, data=lambda: plan_data(members, [], named=False, hints=hints))


def would_autotune_with(plan, kw: dict, layout: str) -> list[dict]:
    """Where the engine would not autotune: the option values of its own choices under which it
    would, each planned for real (a refusal, or a plan with nothing to tune, is not offered)."""
    found = []
    for change in plan.engine.alternatives(plan):
        try:
            alt = build_plan(request_from({**kw, **change}, layout), kw["cache_dir"], plan.resolution.arch)
        except FiAutotuneError:
            continue
        if alt.autotunes:
            flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in change.items())
            found.append({"flags": flags, "options": change, "profiles": alt.profiles})
    return found
