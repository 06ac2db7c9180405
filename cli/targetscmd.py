"""``--targets FILE`` on ``plan``, ``warm`` and ``check``: a fleet's targets from one file.

Each target's fields are parsed by the very options ``warm`` declares (``serving_options``), so
a field means in the file what its flag means on the command line, with the same checks.
"""

from __future__ import annotations

import click

from autotune_cache.errors import UsageError
from autotune_cache.plan.targets import Shard, Target, assign, load_targets, parse_shard, shard_from_env

from .plancmd import build_plan, request_from, serving_options

LAYOUT_NAMES = ("sglang", "flashinfer-v2")

@click.command("target", add_help_option=False)
@serving_options
def _target_parser(**kw):  # parses one target's fields into warm's keyword arguments
    return kw


_PARAMS = {p.name: p for p in _target_parser.params}
_BY_FLAG = {opt.lstrip("-").replace("-", "_"): p for p in _target_parser.params for opt in p.opts}
#: Fields a target may not set: one command works on one tree.
_GLOBAL_ONLY = {"cache_dir"}


def target_kwargs(target: Target) -> tuple[dict, tuple[str, ...]]:
    """(warm's keyword arguments, the layouts to write) for one target."""
    argv: list[str] = []
    layouts: tuple[str, ...] = ("sglang",)
    for name, value in target.fields.items():
        if name == "layouts":
            values = value.split(",") if isinstance(value, str) else list(value or [])
            layouts = tuple(str(v).strip() for v in values if str(v).strip())
            bad = [v for v in layouts if v not in LAYOUT_NAMES]
            if bad or "sglang" not in layouts:
                raise UsageError(f"{target.source}: layouts {list(layouts)}: sglang, plus flashinfer-v2 if wanted")
            continue
        if name == "dp_attention":
            if not isinstance(value, bool):
                raise UsageError(f"{target.source}: dp_attention is true or false, not {value!r}")
            if not value:
                argv.append("--no-dp-attention")
            continue
        param = _BY_FLAG.get(name) or _PARAMS.get(name)
        if param is None or param.name in _GLOBAL_ONLY:
            known = sorted({*_BY_FLAG, "layouts", "dp_attention", "name"} - _GLOBAL_ONLY - {"no_dp_attention"})
            raise UsageError(f"{target.source}: unknown field {name!r} (known: {', '.join(known)})")
        flag = max(param.opts, key=len)
        if getattr(param, "is_flag", False):
            if not isinstance(value, bool):
                raise UsageError(f"{target.source}: {name} is true or false, not {value!r}")
            if value:
                argv.append(flag)
            continue
        if value is None:
            continue
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        argv += [flag, str(value)]
    try:
        ctx = _target_parser.make_context("target", argv)
    except click.ClickException as e:
        raise UsageError(f"{target.source}: {e.format_message()}") from None
    return ctx.params, layouts


def reject_serving_flags(ctx: click.Context, allowed: tuple[str, ...] = ("cache_dir", "arch")) -> None:
    """With --targets, a target's fields live in the file (its ``defaults`` for shared ones)."""
    given = [p.name for p in _target_parser.params if p.name not in allowed and p.name in ctx.params
             and ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE]
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
        kw, layouts = target_kwargs(t)
        if kw["arch"] is None and arch is not None:
            kw["arch"] = arch
        try:
            request = request_from(kw)
            if fingerprint is not None:  # the serving image's: its GPU's arch, its FlashInfer
                request = request.for_target(fingerprint)
            plan = build_plan(request, cache_dir)
        except UsageError as e:
            raise UsageError(f"{t.source} ({t.name}): {e}") from None
        out.append((t, plan, layouts))
    seen: dict = {}
    for t, plan, _ in out:
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
    from autotune_cache.registry import default_layout
    from autotune_cache.tree.scan import scan_entry
    from autotune_cache.tree.status import EntryStatus

    if not plan.autotunes:
        return "not tuned by the engine"
    layout = default_layout()
    if store is not None:
        return "covered (store)" if store.record(layout.name, plan.entry_id) is not None else "missing (store)"
    if not plan.key_dir.is_dir():
        return "missing"
    e = scan_entry(layout, plan.key_dir, plan.entry_id)
    if e.status == EntryStatus.COMPLETE:
        return "covered"
    return f"partly ({e.status}, {e.ranks_str} rank files)"


def fleet_items(loaded) -> list:
    from autotune_cache.tune.fleet import FleetItem

    return [FleetItem(t.name, plan, layouts) for t, plan, layouts in loaded]


def plan_targets(out, loaded, shard, total: int, store_url: str | None) -> None:
    """``plan --targets``: per target its id, work and coverage; the work once merged."""
    from autotune_cache.tune.fleet import merge_work
    from autotune_cache.tree.store import Store

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
                  [[i.name, str(i.plan.entry_id) if i.plan.autotunes else "-", str(i.profiles if i.plan.autotunes else 0), st]
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


def warm_targets(kw: dict, n: int | None, force: bool, targets_file: str, shard: str | None, push_url: str | None,
                 out, t0: float) -> None:
    """``warm --targets``: one pool for the whole list; each target written (then converted and
    pushed) as soon as its last bucket is done."""
    def load(info):
        loaded, chosen, total = load_fleet(targets_file, kw["cache_dir"], info.arch, shard, use_env_shard=True)
        if chosen is not None:
            out.note(f"{chosen.describe()}: {len(loaded)} of {total} targets")
        return fleet_items(loaded), chosen

    run_fleet(load, n, force, push_url, out, t0, "`fi-autotune plan --targets`")


def run_fleet(load, n: int | None, force: bool, push_url: str | None, out, t0: float, plan_hint: str) -> None:
    """Tune ``load(gpu_info) -> (FleetItems, shard or None)`` on one pool of workers; convert each
    written item to the layouts it lists and push it, report, exit 1 if any failed. Shared by
    ``warm --targets`` and ``warm --layout sglang,vllm`` (two targets: one per engine)."""
    import threading
    import time

    from autotune_cache.errors import ExitCode, FiAutotuneError
    from autotune_cache.tune.fleet import warm_fleet
    from autotune_cache.tune.warm import WorkerPool

    from .warmcmd import _Progress, _also_v2, _writable_store, gpus_for_warm, push_entry

    store = _writable_store(push_url)
    pool = WorkerPool(n) if n is not None else None  # start-up overlaps the planning
    pushes: list[threading.Thread] = []
    lock = threading.Lock()
    pushed, failed_pushes, converted = [], [], {}
    written = [0]
    try:
        info = gpus_for_warm(n, plan_hint)
        items, chosen = load(info)
        if not items:
            out.note("nothing in this shard")
        pool = pool or WorkerPool(info.count)
        progress = _Progress(out.mode.value == "human")

        def push(item) -> None:
            try:
                r = push_entry(store, item.plan)
                with lock:
                    pushed.append((item.name, bool(r.pushed)))
            except FiAutotuneError as e:
                with lock:
                    failed_pushes.append((item.name, str(e)))

        def convert(item) -> None:
            if "flashinfer-v2" not in item.layouts:
                return
            try:
                converted[item.name] = _also_v2(item.plan, out).to_dict()
            except FiAutotuneError as e:
                failed_pushes.append((item.name, f"flashinfer-v2: {e}"))

        def on_committed(item) -> None:
            if item.status != "written":
                out.error(f"{item.name}: {item.message}")
                return
            written[0] += 1
            out.note(f"written {item.name} ({item.plan.entry_id}), {written[0]} of {len(items)}")
            convert(item)
            if store is not None:  # uploads run beside the tuning, one at a time
                t = threading.Thread(target=push, args=(item,), daemon=True)
                if pushes:
                    previous = pushes[-1]
                    t = threading.Thread(target=lambda prev=previous, it=item: (prev.join(), push(it)), daemon=True)
                pushes.append(t)
                t.start()

        try:
            result = warm_fleet(items, gpus=n, info=info, pool=pool, force=force, progress=progress,
                                on_committed=on_committed)
        finally:
            progress.close()  # before main() prints an interruption (exit 130)
    finally:
        if pool is not None:
            pool.close()
    for item in result.items:  # complete ones already there: convert and push them too
        if item.status == "complete":
            convert(item)
            if store is not None:
                push(item)
    for t in pushes:
        t.join()
    result.timings["command_wall_s"] = round(time.perf_counter() - t0, 3)
    failed = [i for i in result.items if i.status == "failed"]

    def human() -> None:
        out.table(["TARGET", "ID", "STATUS"], [[i.name, str(i.plan.entry_id), i.status + (f": {i.message}" if i.message and i.status != "written" else "")]
                                               for i in result.items])
        if result.profiles_total:
            merged = 1 - result.profiles_distinct / result.profiles_total
            out.line(f"{result.profiles_tuned} profiles tuned on {result.gpus} GPU(s) in {result.timings['command_wall_s']:.1f} s "
                     f"for {len(items)} targets ({result.profiles_total} one by one, {result.profiles_distinct} once "
                     f"identical calls are merged: {merged:.0%} less)")
        for name, ok in pushed:
            out.line(f"{'pushed' if ok else 'unchanged in'} {store}: {name}")
        for name, why in failed_pushes:
            out.line(f"failed after writing: {name}: {why}")

    out.emit(human=human, data=lambda: {**result.to_dict(), "pushed": [n for n, _ in pushed],
                                        "failed_after_writing": dict(failed_pushes), "converted": converted,
                                        "shard": None if chosen is None else {"index": chosen.index, "count": chosen.count,
                                                                              "source": chosen.source}})
    if failed or failed_pushes:
        raise click.exceptions.Exit(int(ExitCode.FAILURE))


def check_targets(ctx, out, targets_file: str, kw: dict, store_url: str | None, layout_name: str, fingerprint,
                  strict: bool) -> None:
    """``check --targets``: which targets the tree (or store) covers; --strict fails on any miss."""
    from autotune_cache.errors import ExitCode
    from autotune_cache.registry import default_layout

    from .checkcmd import run_check
    from .params import resolve_root

    reject_serving_flags(ctx)
    cache_dir = kw["cache_dir"]
    if store_url is None and layout_name == "sglang":
        cache_dir = str(resolve_root(cache_dir, must_exist=False).path)
    loaded, _, total = load_fleet(targets_file, cache_dir, kw["arch"], fingerprint=fingerprint)
    layout = default_layout()
    reports = [(t, plan, run_check(plan, layout, layout_name, store_url, fingerprint, kw["cache_dir"]))
               for t, plan, _ in loaded]
    bad = [r for _, _, r in reports if r.autotunes and not r.ok]

    def human() -> None:
        rows = []
        for t, plan, r in reports:
            state = "not tuned by the engine" if not r.autotunes else "OK" if r.ok else f"MISS: {r.misses[0][:100]}"
            rows.append([t.name, str(plan.entry_id) if r.autotunes else "-", state])
        out.table(["TARGET", "ID", "RESULT"], rows)
        out.line(f"{total - len(bad)} of {total} targets covered" + (f"; {len(bad)} would tune at startup" if bad else ""))

    out.emit(human=human, data=lambda: {"targets": [{"name": t.name, **r.to_dict()} for t, _, r in reports],
                                        "covered": total - len(bad), "missing": len(bad)})
    if strict and bad:
        raise click.exceptions.Exit(int(ExitCode.FAILURE))
