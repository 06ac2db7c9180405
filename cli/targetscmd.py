"""``--targets FILE`` on ``plan``, ``warm`` and ``check``: a fleet's targets from one file.

Each target's fields are checked against the very table the command-line options are made
from (``plan.options.SERVING_OPTIONS``), so a field means in the file what its flag means on the
command line, with the same checks - and becomes a typed request directly.
"""

from __future__ import annotations

import time
from dataclasses import replace

import click

from autotune_cache import registry
from autotune_cache.check import run_check
from autotune_cache.engines.requests import build_request
from autotune_cache.errors import ExitCode, UsageError
from autotune_cache.engines.selection import WarmGroup, warm_groups, warm_layouts
from autotune_cache.plan.options import SERVING_OPTIONS, ServingOptions, take_options
from autotune_cache.plan.targets import Shard, Target, assign, load_targets, parse_shard, shard_from_env
from autotune_cache.tree.scan import scan_entry
from autotune_cache.tree.store import Store
from autotune_cache.tune.fleet import FleetItem, merge_work
from autotune_cache.tune.gpus import detect_gpu_uuids
from autotune_cache.tune.publish import writable_store
from autotune_cache.tune.session import FleetRunResult, WarmOptions, run_fleet

from .output import Output
from .params import resolve_root
from .progress import Progress
from .serving import build_plan

#: Fields a target may not set: one command works on one tree.
_GLOBAL_ONLY = {"cache_dir"}


def target_layouts() -> tuple[str, ...]:
    """What a target's ``layouts`` may hold: what ``warm --layout`` writes (one engine's tree, plus
    the stores written from its entries)."""
    return tuple(warm_layouts())


def target_options(target: Target) -> tuple[ServingOptions, WarmGroup, dict]:
    """(the serving options, the layouts to write for its one engine, that engine's own options)
    of one target, checked as the flags are."""
    fields = dict(target.fields)
    layouts: tuple[str, ...] = (registry.default_layout().name,)
    if "layouts" in fields:
        value = fields.pop("layouts")
        values = value.split(",") if isinstance(value, str) else list(value or [])
        layouts = tuple(str(v).strip() for v in values if str(v).strip())
    try:
        groups = warm_groups(",".join(layouts))
    except UsageError as e:
        raise UsageError(f"{target.source}: layouts {list(layouts)}: {str(e).removeprefix('--layout ')}") from None
    if len(groups) != 1:
        raise UsageError(f"{target.source}: layouts {list(layouts)}: one engine per target (its calls differ from "
                         "the other's): list the target once per engine")
    for name in fields:
        if name in _GLOBAL_ONLY:
            raise UsageError(f"{target.source}: unknown field {name!r} (set --{name.replace('_', '-')} on the command line)")
    engine = groups[0].engine
    own = take_options(fields, engine.cli_options, target.source)
    for other in registry.engines():
        names = [o.name for o in other.cli_options if o.name in fields or o.name.replace("_", "-") in fields]
        if other is not engine and names:
            raise UsageError(f"{target.source}: {names[0]} goes with layouts: [{other.layouts[0].name}]")
    return ServingOptions.from_fields(fields, target.source, also_known=("layouts", "name")), groups[0], own


def reject_serving_flags(ctx: click.Context, allowed: tuple[str, ...] = ("cache_dir", "arch")) -> None:
    """With --targets, a target's fields live in the file (its ``defaults`` for shared ones)."""
    names = [o.name for o in SERVING_OPTIONS]
    given = [n for n in names if n not in allowed and n in ctx.params
             and ctx.get_parameter_source(n) == click.core.ParameterSource.COMMANDLINE]
    if given:
        flags = ", ".join("--" + g.replace("_", "-") for g in given)
        raise UsageError(f"{flags}: with --targets, put target fields in the file (its 'defaults' for all of them)")
    if ctx.params.get("serving_command"):
        raise UsageError("a serving command after -- names one target: not with --targets")


def load_fleet(path: str, cache_dir: str | None, arch: str | None, shard: str | None = None,
               use_env_shard: bool = False, fingerprint=None) -> tuple[list[tuple[Target, object, tuple[str, ...]]], Shard | None, int]:
    """Every target's (Target, plan, layouts), cut to this shard. ``arch``: the command line's
    --arch or this machine's GPU, for targets that do not name theirs. Returns also how many
    targets the whole file holds."""
    targets = load_targets(path)
    out = []
    for t in targets:
        options, group, engine_options = target_options(t)
        layouts = group.layouts
        if options.arch is None and arch is not None:
            options = options.replace(arch=arch)
        try:
            request = build_request(options, layout=group.layout, engine_options=engine_options,
                                    detect_gpu_uuids=detect_gpu_uuids)
            if fingerprint is not None:  # the serving image's: its GPU's arch, its FlashInfer
                request = request.for_target(fingerprint)
            # --cache-dir is the default engine's tree; another engine's targets go where it reads them
            plan = build_plan(request, cache_dir if group.engine is registry.default_engine() else None)
            if fingerprint is not None:
                plan = plan.for_environment(fingerprint.fields)
        except UsageError as e:
            raise UsageError(f"{t.source} ({t.name}): {e}") from None
        out.append((t, plan, layouts))
    seen: dict = {}
    for t, plan, _ in out:
        if not plan.bound:  # FlashInfer's managed store: targets share its directory, each key stands alone
            continue
        if plan.autotunes and plan.entry_id in seen:
            raise UsageError(f"{seen[plan.entry_id].source} ({seen[plan.entry_id].name}) and {t.source} ({t.name}) are "
                             f"one entry, {plan.entry_id}: the engine would read the same files")
        seen.setdefault(plan.entry_id, t)
    chosen = parse_shard(shard) if shard else (shard_from_env() if use_env_shard else None)
    if chosen is None or chosen.count == 1:
        return out, chosen, len(out)
    owners = assign([p.profiles if p.autotunes else 0 for _, p, _ in out], chosen.count)
    return [x for x, s in zip(out, owners) if s == chosen.index], chosen, len(out)


def coverage(plan, store=None) -> str:
    """A target's state where the engine (or the pull) will look: covered, partly, missing."""
    if not plan.autotunes:
        return "not tuned by the engine"
    if not plan.bound:
        return "unknown (FlashInfer's store: the GPU's environment names its directory; check --env-from tells)"
    layout = plan.layout_obj
    if store is not None:
        return "covered (store)" if store.record(layout.name, plan.entry_id) is not None else "missing (store)"
    if not plan.key_dir.is_dir():
        return "missing"
    e = scan_entry(layout, plan.key_dir, plan.entry_id)
    if e.complete_for(plan.rank_files):
        return "covered"
    return f"partly ({e.status}, {e.ranks_str} rank files)"


def fleet_items(loaded) -> list[FleetItem]:
    return [FleetItem(t.name, plan, layouts) for t, plan, layouts in loaded]


def plan_targets(out, loaded, shard, total: int, store_url: str | None) -> None:
    """``plan --targets``: per target its id, work and coverage; the work once merged."""
    store = Store(store_url) if store_url else None
    items = fleet_items(loaded)
    rows = [(i, coverage(i.plan, store)) for i in items]
    tuned = [i for i in items if i.plan.autotunes]
    work = merge_work(tuned)
    alone = sum(i.profiles for i in tuned)
    merged = work.profiles()

    def human() -> None:
        if shard is not None:
            out.line(f"{shard.describe()}: {len(items)} of {total} targets")
        out.table(["TARGET", "ID", "PROFILES", "STATUS"],
                  [[i.name, i.plan.id_str if i.plan.autotunes else "-", str(i.profiles if i.plan.autotunes else 0), st]
                   for i, st in rows])
        saved = f", {1 - merged / alone:.0%} less" if alone else ""
        out.line(f"{len(tuned)} targets to tune: {alone} profiles one by one, {merged} once identical calls are "
                 f"merged ({len(work.ops)} distinct calls{saved})")

    out.emit(human=human, data=lambda: {
        "shard": None if shard is None else {"index": shard.index, "count": shard.count, "source": shard.source},
        "targets_in_file": total,
        "targets": [{**i.to_dict(), "coverage": st, "source": t.source, "plan": i.plan.to_dict()}
                    for (i, st), (t, _, _) in zip(rows, loaded)],
        "profiles_one_by_one": alone, "profiles_merged": merged, "distinct_calls": len(work.ops)})


def warm_targets(kw: dict, opts: WarmOptions, targets_file: str, shard: str | None, push_url: str | None,
                 out: Output, t0: float) -> None:
    """``warm --targets``: one pool for the whole list; each target written (then converted and
    pushed) as soon as its last bucket is done."""
    def load(info):
        loaded, chosen, total = load_fleet(targets_file, kw["cache_dir"], info.arch, shard, use_env_shard=True)
        if chosen is not None:
            out.note(f"{chosen.describe()}: {len(loaded)} of {total} targets")
        return fleet_items(loaded), chosen

    fleet_command(load, replace(opts, plan_hint="`fi-autotune plan --targets`"), push_url, out, t0)


def fleet_command(load, opts: WarmOptions, push_url: str | None, out: Output, t0: float) -> None:
    """Tune ``load(gpu_info) -> (FleetItems, shard or None)`` on one pool of workers
    (``tune.session.run_fleet``: each written item converted to the layouts it lists and pushed);
    report, exit 1 if any failed. Shared by ``warm --targets``, ``warm --layout sglang,vllm``
    (two targets: one per engine) and speculative decoding (target and draft)."""
    opts = replace(opts, store=writable_store(push_url))
    shard: list = [None]
    written = [0]
    count = [0]

    def load_items(info) -> list[FleetItem]:
        items, shard[0] = load(info)
        count[0] = len(items)
        if not items:
            out.note("nothing in this shard")
        return items

    def on_committed(item: FleetItem) -> None:
        if item.status != "written":
            out.error(f"{item.name}: {item.message}")
            return
        written[0] += 1
        out.note(f"written {item.name} ({item.plan.id_str}), {written[0]} of {count[0]}")

    progress = Progress(out.mode.value == "human")
    try:
        run = run_fleet(load_items, opts, progress=progress, on_committed=on_committed)
    finally:
        progress.close()  # before main() prints an interruption (exit 130)
    run.result.timings["command_wall_s"] = round(time.perf_counter() - t0, 3)
    _emit_fleet(out, run, opts, shard[0])
    if run.failed:
        raise click.exceptions.Exit(int(ExitCode.FAILURE))


def _emit_fleet(out: Output, run: FleetRunResult, opts: WarmOptions, chosen) -> None:
    result = run.result

    def human() -> None:
        out.table(["TARGET", "ID", "STATUS"], [[i.name, i.plan.id_str, i.status + (f": {i.message}" if i.message and i.status != "written" else "")]
                                               for i in result.items])
        if result.profiles_total:
            merged = 1 - result.profiles_distinct / result.profiles_total
            out.line(f"{result.profiles_tuned} profiles tuned on {result.gpus} GPU(s) in {result.timings['command_wall_s']:.1f} s "
                     f"for {len(result.items)} targets ({result.profiles_total} one by one, {result.profiles_distinct} once "
                     f"identical calls are merged: {merged:.0%} less)")
        for name, ok in run.pushed:
            out.line(f"{'pushed' if ok else 'unchanged in'} {opts.store}: {name}")
        for name, why in run.failed_after_writing:
            out.line(f"failed after writing: {name}: {why}")

    out.emit(human=human, data=lambda: {**result.to_dict(), "pushed": [n for n, _ in run.pushed],
                                        "failed_after_writing": dict(run.failed_after_writing),
                                        "converted": run.converted,
                                        "shard": None if chosen is None else {"index": chosen.index, "count": chosen.count,
                                                                              "source": chosen.source}})


def check_targets(ctx, out, targets_file: str, kw: dict, store_url: str | None, layout_name: str, fingerprint,
                  strict: bool) -> None:
    """``check --targets``: which targets the tree (or store) covers; --strict fails on any miss."""
    reject_serving_flags(ctx)
    reader = registry.get_layout(layout_name)
    cache_dir = kw["cache_dir"]
    if store_url is None and not reader.env_keyed:
        cache_dir = str(resolve_root(cache_dir, must_exist=False).path)
    loaded, _, total = load_fleet(targets_file, cache_dir, kw["arch"], fingerprint=fingerprint)
    reports = [(t, plan, run_check(plan, reader, store_url, fingerprint, kw["cache_dir"])) for t, plan, _ in loaded]
    bad = [r for _, _, r in reports if r.autotunes and not r.ok]

    def human() -> None:
        # A reason cut to fit a column is a reason lost ("the nearest entry, 0."): the table
        # says which targets miss, and each miss follows it, whole, on its own line.
        rows = []
        for t, plan, r in reports:
            state = "not tuned by the engine" if not r.autotunes else "OK" if r.ok else f"MISS ({len(r.misses)})"
            rows.append([t.name, plan.id_str if r.autotunes else "-", state])
        out.table(["TARGET", "ID", "RESULT"], rows)
        for t, _, r in reports:
            for m in (r.misses if r.autotunes and not r.ok else ()):
                out.line(f"MISS: {t.name}: {m}")
        out.line(f"{total - len(bad)} of {total} targets covered" + (f"; {len(bad)} would tune at startup" if bad else ""))

    out.emit(human=human, data=lambda: {"targets": [{"name": t.name, **r.to_dict()} for t, _, r in reports],
                                        "covered": total - len(bad), "missing": len(bad)})
    if strict and bad:
        raise click.exceptions.Exit(int(ExitCode.FAILURE))
