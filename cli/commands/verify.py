"""``verify``: replay the engine's startup pass against a cache on this GPU and count hits.

The entry is named by its ID (flags from the manifest warm wrote), by --model alone, or by
--model with the server's flags (any entry those flags map to, engine-written ones included);
``--layout`` says whose pass: SGLang's dummy passes, or vLLM's bucketed run over its rank files or,
single rank, over FlashInfer's managed store at its root (``tune.verify``).
"""

from __future__ import annotations

from pathlib import Path

import click

from autotune_cache import registry
from autotune_cache.autotuner.fingerprint import this_host
from autotune_cache.errors import ExitCode, FiAutotuneError, UsageError
from autotune_cache.tree.layouts.values import DEFAULT_LAYOUT_NAME
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.tune.session.recorded import request_of
from autotune_cache.tune.workers.gpus import NO_GPU_TO_REPLAY_ON

from ..output import Output
from ..params import LayoutName, json_option
from ..roots import resolve_root
from ..serving import build_plan, engine_options, machine_of, planned_layouts, request_from, serving_options


def _plan_from_flags(kw: dict, layout: str):
    """The plan the server's flags map to, bound to this GPU's environment where its directory is
    named by one (a single-rank vLLM's managed store); its entry must exist."""
    plan = build_plan(request_from(kw, layout), kw["cache_dir"])
    if not plan.bound:  # this_host() imports torch: verify needs it anyway
        plan = plan.for_environment(this_host().fields)
    if not plan.key_dir.is_dir():
        raise FiAutotuneError(f"no cache entry at {plan.key_dir} (id {plan.id_str} for these flags)")
    return plan


def _plan_from_entry(ref: str | None, kw: dict, layout: str):
    root = resolve_root(kw["cache_dir"], must_exist=True, layout=registry.get_layout(layout)).path
    info = scan_cache(root, registry.get_layout(layout))
    if ref is not None:
        entries = info.resolve([ref])
    else:
        entries = [e for e in info.entries if e.model == kw["model"]]
        if not entries:
            raise FiAutotuneError(f"no cache entry for {kw['model']!r} under {root}")
        if len(entries) > 1:
            raise UsageError(f"{kw['model']!r} has {len(entries)} entries; give one id: "
                             + ", ".join(str(e.id) for e in entries))
    entry = entries[0]
    # the entry's own arch (or --arch): never "pass --arch" for an entry whose arch is known
    plan = build_plan(request_of(entry), str(root), kw.get("arch") or entry.arch)
    if plan.key != entry.key:
        raise FiAutotuneError(f"the recorded request now maps to key {plan.key}, not {entry.key}")
    return plan


@click.command("verify")
@click.argument("ref", required=False, metavar="[ID]")
@serving_options(model_required=False)
@click.option("--layout", type=LayoutName(planned_layouts), default=DEFAULT_LAYOUT_NAME, show_default=True,
              help="Whose startup pass to replay: sglang, or vllm / vllm-dir (a single-rank vLLM: its managed "
                   "store, as vLLM enters it).")
@engine_options
@json_option
@click.pass_context
def verify_cmd(ctx, ref, layout, as_json, **kw):
    """Replay the engine's startup pass against a cache on this GPU; exit 1 unless every lookup hits.

    Name the entry by its ID (as `ls` prints it; a unique key or the entry's directory work too;
    flags from the manifest warm wrote), by --model alone (the entry warm wrote for that model),
    or by --model with the server's flags (any entry those flags map to, engine-written ones
    included; a single-rank vLLM's store is found from this GPU's environment).
    """
    flags_given = [k for k in kw if k not in ("model", "cache_dir")
                   and ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE]
    if ref is None and kw["model"] is None:
        raise UsageError("give an entry ID or --model")
    single = registry.engine_of_layout(layout).name != registry.default_engine().name
    plan = _plan_from_flags(kw, layout) if ref is None and (flags_given or single) else _plan_from_entry(ref, kw, layout)
    if not machine_of(ctx).detect_gpus().count:  # NVML: said in a moment, not after torch's seconds of import
        raise UsageError(NO_GPU_TO_REPLAY_ON)
    # tune.verify imports torch (the skeleton): only ``verify`` pays for it, once there is a GPU to replay on.
    from autotune_cache.tune.verify import verify

    report = verify(plan, plan.key_dir)
    out = Output(as_json)

    def human() -> None:
        for w in report.workloads:
            state = "metadata accepted" if w.metadata_accepted else "METADATA REJECTED by FlashInfer here"
            out.line(f"{Path(w.rank_file).name} (x{w.ranks} ranks): {w.hits}/{w.lookups} lookups hit, "
                     f"{w.retuned} would be tuned again, replay {w.replay_s:.2f} s, {state}")
        pct = 100.0 * report.hits / report.lookups if report.lookups else 0.0
        out.line(f"{'OK' if report.ok else 'INCOMPLETE'}: {report.hits}/{report.lookups} hits ({pct:.1f}%)")

    out.emit(human=human, data=report.to_dict)
    if not report.ok:
        raise click.exceptions.Exit(int(ExitCode.FAILURE))
