"""``--targets FILE`` on ``plan``, ``warm`` and ``check``: a fleet's targets from one file.

Each target's fields are checked against the very table the command-line options are made
from (``plan.options.SERVING_OPTIONS``), so a field means in the file what its flag means on the
command line, with the same checks - and becomes a typed request directly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import click

from autotune_cache import registry
from autotune_cache.engines.requests import build_request
from autotune_cache.errors import ExitCode, UsageError
from autotune_cache.engines.selection import WarmGroup, warm_groups
from autotune_cache.plan.options import GIVEN_OPTIONS, ServingOptions, take_options
from autotune_cache.plan.targets import Shard, Target, assign, load_targets, parse_shard, shard_from_env
from autotune_cache.tree.scanner.scan import scan_entry
from autotune_cache.tree.store.store import Store
from autotune_cache.tune.session.fleet import FleetItem, merge_work
from autotune_cache.tune.workers.gpus import detect_gpu_uuids
from autotune_cache.tune.session.publish import writable_store
from autotune_cache.tune.session.session import FleetRunResult, WarmOptions, run_fleet

from autotune_cache.humanize import plural

from .output import Output
from .progress import Progress
from .serving import build_plan

#: The one target of a command without --targets: its flags (or serving command).
COMMAND_LINE = Target("", {}, "the command line")
#: Fields a target may not set: one command works on one tree.
_GLOBAL_ONLY = {"cache_dir"}


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
    # the unknown-field message lists every field a target takes: every engine's own ones too
    engine_fields = tuple(o.name for e in registry.engines() for o in e.cli_options)
    return ServingOptions.from_fields(fields, target.source, also_known=("layouts", "name", *engine_fields)), groups[0], own


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


@dataclass(frozen=True)
class FleetMember:
    """One entry of a fleet: a target's worker (the target itself, or its speculative draft worker,
    which SGLang tunes into an entry of its own), with the layouts its target writes."""

    target: Target
    worker: str
    plan: object
    layouts: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.target.name if self.worker == "target" else f"{self.target.name} {self.worker}"


@dataclass(frozen=True)
class FleetError:
    """A target that could not be planned (or checked): named, while the others go on."""

    target: Target
    message: str

    def to_dict(self) -> dict:
        return {"target": self.target.name, "target_source": self.target.source, "error": self.message}

    def line(self) -> str:
        return f"{self.target.source}: {self.message}"


@dataclass
class Fleet:
    """A targets file planned: every target's every worker (what its single plan has), the targets
    that failed, and the shard."""

    members: list[FleetMember]
    errors: list[FleetError]
    shard: Shard | None
    total: int  # targets in the whole file


def _plan_target(t: Target, cache_dir: str | None, arch: str | None, fingerprint) -> list[FleetMember]:
    options, group, engine_options = target_options(t)
    if options.arch is None and arch is not None:
        options = options.replace(arch=arch)
    request = build_request(options, layout=group.layout, engine_options=engine_options,
                            detect_gpu_uuids=detect_gpu_uuids)
    if fingerprint is not None:  # the serving image's: its GPU's arch, its FlashInfer
        request = request.for_target(fingerprint)
    members = []
    for r in request.workers():
        # --cache-dir applies to every target, whatever its engine, as it does to the target's own
        # command; without it each engine's tree is where that engine reads it
        plan = build_plan(r, cache_dir)
        if fingerprint is not None:
            plan = plan.for_environment(fingerprint.fields)
        members.append(FleetMember(t, r.worker, plan, group.layouts))
    return members


def shared_entries(members: list[FleetMember]) -> dict[str, list[FleetMember]]:
    """Entries more than one worker of the fleet would read (the engine reads the same files):
    two targets whose flags make one key, or single-GPU vLLM targets in one managed-store entry."""
    seen: dict = {}
    for m in members:
        if m.plan.bound and m.plan.autotunes:  # unbound: FlashInfer's store before the environment names it
            seen.setdefault(m.plan.entry_id, []).append(m)
    return {str(eid): ms for eid, ms in seen.items() if len(ms) > 1}


def load_fleet(path: str, cache_dir: str | None, arch: str | None, shard: str | None = None,
               use_env_shard: bool = False, fingerprint=None, shared_ok: bool = False) -> Fleet:
    """Every target's workers planned, cut to this shard. ``arch``: the command line's --arch or
    this machine's GPU, for targets that do not name theirs. A target whose fields are wrong is
    an error of its own (named ``targets[i]``); the others are planned all the same. Targets that
    are one entry are refused (they would write the same files), unless ``shared_ok`` (``check``:
    it reads them, and reports each target)."""
    members: list[FleetMember] = []
    errors: list[FleetError] = []
    targets = load_targets(path)
    for t in targets:
        try:
            members += _plan_target(t, cache_dir, arch, fingerprint)
        except UsageError as e:
            errors.append(FleetError(t, str(e).removeprefix(f"{t.source}: ")))
    for eid, (first, m, *_) in ({} if shared_ok else shared_entries(members)).items():
        raise UsageError(f"{first.target.source} ({first.name}) and {m.target.source} ({m.name}) are one entry, "
                         f"{eid}: the engine would read the same files")
    chosen = parse_shard(shard) if shard else (shard_from_env() if use_env_shard else None)
    if chosen is not None and chosen.count > 1:
        owners = assign([m.plan.profiles if m.plan.autotunes else 0 for m in members], chosen.count)
        members = [m for m, s in zip(members, owners) if s == chosen.index]
    return Fleet(members, errors, chosen, len(targets))


def report_errors(out: Output, errors: list[FleetError]) -> None:
    """Each target that failed, one line on stderr in every mode; then exit 2 (its fields are
    wrong, or it cannot be checked), once the others have run."""
    for e in errors:
        out.error(e.line())
    if errors:
        raise click.exceptions.Exit(int(ExitCode.USAGE))


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


def fleet_items(members: list[FleetMember]) -> list[FleetItem]:
    return [FleetItem(m.name, m.plan, m.layouts, target=m.target.name, worker=m.worker) for m in members]


def member_fields(m: FleetMember, named: bool = True) -> dict:
    """Who a worker's JSON object belongs to: the same fields in every command's ``workers``."""
    return {"target": m.target.name if named else None, "target_source": m.target.source if named else None,
            "worker": m.worker}


def plan_data(members: list[FleetMember], errors: list[FleetError], *, shard: Shard | None = None,
              total: int | None = None, store=None, named: bool = True, hints: list | None = None) -> dict:
    """``plan --json``, one shape for one target (``named=False``: the command line's) and for a
    targets file: every worker of every target in ``workers``, one worker or two alike."""
    items = fleet_items(members)
    tuned = [i for i in items if i.plan.autotunes]
    work = merge_work(tuned)
    return {
        "shard": None if shard is None else {"index": shard.index, "count": shard.count, "source": shard.source},
        "targets_in_file": total,
        "workers": [{**member_fields(m, named), "coverage": coverage(m.plan, store) if named else None,
                     **{k: v for k, v in m.plan.to_dict().items() if k != "format"}} for m in members],
        "errors": [e.to_dict() for e in errors],
        "profiles_one_by_one": sum(i.profiles for i in tuned), "profiles_merged": work.profiles(),
        "distinct_calls": len(work.ops), "would_autotune_with": list(hints or ()),
    }


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
    fleets: list[Fleet] = []

    def load(info):
        fleet = load_fleet(targets_file, kw["cache_dir"], info.arch, shard, use_env_shard=True)
        fleets.append(fleet)
        for e in fleet.errors:
            out.error(e.line())
        if fleet.shard is not None:
            out.note(f"{fleet.shard.describe()}: {len(fleet.members)} entries of {fleet.total} targets")
        return fleet_items(fleet.members), fleet.shard

    fleet_command(load, replace(opts, plan_hint="`fi-autotune plan --targets`"), push_url, out, t0,
                  failed_targets=lambda: [e.target.source for e in (fleets[0].errors if fleets else ())])


def note_pool(out: Output, timings: dict) -> None:
    """Why served workers (``fi-autotune workers``) were there but not used, on stderr."""
    note = timings.get("pool", {}).get("note")
    if note:
        out.note(note)


def fleet_command(load, opts: WarmOptions, push_url: str | None, out: Output, t0: float,
                  failed_targets=lambda: []) -> None:
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
    note_pool(out, run.result.timings)
    _emit_fleet(out, run, opts, shard[0])
    failed = failed_targets()
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
                                        "shard": None if chosen is None else {"index": chosen.index, "count": chosen.count,
                                                                              "source": chosen.source}})
