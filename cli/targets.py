"""``--targets FILE`` on ``plan``, ``warm`` and ``check``: what the CLI does with a fleet.

The library plans the file (``tune/session/fleetplan.py``: each target's fields checked against
the very table the command-line options are made from, so a field means in the file what its
flag means on the command line); here are the command-line checks, the printing, and the warm
of a fleet on one pool with its progress.
"""

from __future__ import annotations

import time
from dataclasses import replace

import click

from autotune_cache.errors import ExitCode, FiAutotuneError, Interrupted, UsageError
from autotune_cache.humanize import plural
from autotune_cache.plan.options import GIVEN_OPTIONS
from autotune_cache.tree.store.store import Store
from autotune_cache.tune.session.fleet import FleetItem, merge_work
from autotune_cache.tune.session.fleetplan import Fleet, FleetError, FleetOrder, fleet_items, plan_data
from autotune_cache.tune.session.publish import writable_store
from autotune_cache.tune.session.session import FleetRunResult, WarmOptions, run_fleet

from .output import Output
from .progress import Progress
from .roots import rooting


def reject_serving_flags(ctx: click.Context, allowed: tuple[str, ...] = ("cache_dir", "arch")) -> None:
    """With --targets, a target's fields live in the file (its ``defaults`` for shared ones)."""
    names = [o.name for o in GIVEN_OPTIONS]
    given = [n for n in names if n not in allowed and n in ctx.params
             and ctx.get_parameter_source(n) == click.core.ParameterSource.COMMANDLINE]
    if given:
        flags = ", ".join("--" + g.replace("_", "-") for g in given)
        raise UsageError(f"{flags}: with --targets, put target fields in the file (its 'defaults' for all of them)")
    if ctx.params.get("serving_command"):
        raise UsageError("a serving command after -- names one target: not with --targets")


def report_errors(out: Output, errors: list[FleetError]) -> None:
    """Each target that failed, one line on stderr in every mode; then exit 2 (its fields are
    wrong, or it cannot be checked), once the others have run."""
    for e in errors:
        out.error(e.line())
    if errors:
        raise click.exceptions.Exit(int(ExitCode.USAGE))


def plan_targets(out, fleet: Fleet, store_url: str | None) -> None:
    """``plan --targets``: per target's worker its id, work and coverage; the work once merged."""
    store = Store(store_url) if store_url else None
    data = plan_data(fleet.members, fleet.errors, shard=fleet.shard, total=fleet.total, store=store)

    def human() -> None:
        if fleet.shard is not None:
            out.line(f"{fleet.shard.describe()}: {len(fleet.members)} entries of {fleet.total} targets")
        out.table(["TARGET", "ID", "PROFILES", "STATUS"],
                  [[w["target"] if w["worker"] == "target" else f"{w['target']} {w['worker']}",
                    w["id"] if w["autotunes"] else "-", str(w["profiles"] if w["autotunes"] else 0), w["coverage"]]
                   for w in data["workers"]])
        # what warm will tune: the entries not already covered where it writes (it skips those)
        todo = [i for i, w in zip(fleet_items(fleet.members), data["workers"])
                if w["autotunes"] and not w["coverage"].startswith("covered")]
        covered = sum(1 for w in data["workers"] if w["autotunes"] and w["coverage"].startswith("covered"))
        work = merge_work(todo)
        alone, merged = sum(i.profiles for i in todo), work.profiles()
        saved = f", {1 - merged / alone:.0%} less" if alone else ""
        out.line(f"{plural(len(todo), 'entry', 'entries')} to tune: {alone} profiles one by one, {merged} once identical "
                 f"calls are merged ({len(work.ops)} distinct calls{saved})"
                 + (f"; {covered} already covered (warm skips {'it' if covered == 1 else 'them'} unless --force)"
                    if covered else ""))

    out.emit(human=human, data=data)
    report_errors(out, fleet.errors)


def warm_targets(kw: dict, opts: WarmOptions, targets_file: str, shard: str | None, push_url: str | None,
                 out: Output, t0: float) -> None:
    """``warm --targets``: one pool for the whole list; each entry (a target, its draft worker)
    written (then converted and pushed) as soon as its last bucket is done."""
    fleet_command(FleetOrder(rooting(kw["cache_dir"]), targets_file, shard),
                  replace(opts, plan_hint="`fi-autotune plan --targets`"), push_url, out, t0)


def note_pool(out: Output, timings: dict) -> None:
    """Why served workers (``fi-autotune workers``) were there but not used, on stderr."""
    note = timings.get("pool", {}).get("note")
    if note:
        out.note(note)


def fleet_command(order: FleetOrder, opts: WarmOptions, push_url: str | None, out: Output, t0: float) -> None:
    """Tune ``order`` (a targets file, or one command's several entries) on one pool of workers
    (``tune.session.run_fleet``: planned there once the GPUs are known, each written item converted
    to the layouts it lists and pushed); report, exit 1 if any failed. Shared by ``warm --targets``,
    ``warm --layout sglang,vllm`` (two targets: one per engine) and speculative decoding (target
    and draft)."""
    opts = replace(opts, store=writable_store(push_url))
    written = [0]
    count = [0]
    planned: list[FleetItem] = []

    def on_planned(items: list[FleetItem], fleet: Fleet | None) -> None:
        count[0] = len(items)
        planned[:] = items
        for e in fleet.errors if fleet is not None else ():
            out.error(e.line())
        if fleet is not None and fleet.shard is not None:
            out.note(f"{fleet.shard.describe()}: {len(fleet.members)} entries of {fleet.total} targets")
        if not items:
            out.note("nothing in this shard")
        said: dict[str, list[str]] = {}  # one line per warning, naming the targets it concerns
        for item in items:
            for w in item.plan.version_warnings:
                said.setdefault(w, []).append(item.name)
        for w, names in said.items():
            out.warn(f"{', '.join(names)}: {w}")

    def on_committed(item: FleetItem) -> None:
        if item.status != "written":
            out.error(f"{item.name}: {item.message}")
            return
        written[0] += 1
        out.note(f"written {item.name} ({item.plan.id_str}), {written[0]} of {count[0]}")

    progress = Progress(out.mode.value == "human")
    try:
        run = run_fleet(order, opts, progress=progress, on_planned=on_planned, on_committed=on_committed)
    except (FiAutotuneError, KeyboardInterrupt) as e:
        if out.mode.value == "json":  # what was written before it stopped, for a program as for a person
            out.emit(data={"workers": [i.to_dict() for i in planned], "stopped": str(e) or "interrupted",
                           "interrupted": isinstance(e, (Interrupted, KeyboardInterrupt))})
        raise
    finally:
        progress.close()  # before main() prints an interruption (exit 130)
    run.result.timings["command_wall_s"] = round(time.perf_counter() - t0, 3)
    note_pool(out, run.result.timings)
    _emit_fleet(out, run, opts, run.fleet.shard if run.fleet is not None else None)
    failed = [e.target.source for e in run.fleet.errors] if run.fleet is not None else []
    if failed:  # the file names targets that could not be planned (said before tuning; again here, last)
        out.error(f"not tuned, their fields are wrong: {', '.join(failed)}")
        raise click.exceptions.Exit(int(ExitCode.USAGE))
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
                                        "errors": [e.to_dict() for e in run.fleet.errors] if run.fleet else [],
                                        "shard": None if chosen is None else {"index": chosen.index, "count": chosen.count,
                                                                              "source": chosen.source}})
