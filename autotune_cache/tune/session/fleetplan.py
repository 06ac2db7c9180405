"""A targets file planned: every target's workers (a speculative target's draft too), each with
its plan, the targets that could not be planned (named, while the others go on), the shard this
machine takes; and what ``plan --json`` says of them. ``plan``, ``check`` and ``warm --targets``
hand it a path and how the command roots its plans (``tree.roots.Rooting``: ``--cache-dir``, and
where the notes about a root go); the CLI prints what comes back. ``plan_request`` is how any
command plans one request under its root.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune_cache import registry
from autotune_cache.engines.requests import build_request
from autotune_cache.engines.selection import WarmGroup, warm_groups
from autotune_cache.errors import UsageError
from autotune_cache.plan.options import ServingOptions, take_options
from autotune_cache.plan.request import TuneRequest
from autotune_cache.plan.targets import Shard, Target, assign, load_targets, parse_shard, shard_from_env
from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tree.roots import Rooting, choose_root
from autotune_cache.tree.scanner.scan import scan_entry
from autotune_cache.tune.session.fleet import FleetItem, merge_work
from autotune_cache.tune.workers.gpus import detect_gpu_uuids
from autotune_cache.tune.workers.machine import THIS_MACHINE, Machine


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


def local_arch(machine: Machine = THIS_MACHINE) -> str:
    """The machine's GPU arch (NVML, no CUDA context); a usage error when there is none."""
    arch = machine.detect_gpus().arch
    if arch is None:
        raise UsageError("no GPU found to take the target arch from: pass --arch sm90 or --arch sm100")
    return arch


def plan_request(request: TuneRequest, rooting: Rooting, arch: str | None = None,
                 machine: Machine = THIS_MACHINE) -> TuningPlan:
    """The plan for ``request`` under the cache root ``rooting.cache_dir`` names (made if missing),
    else the root of the engine's layout; for the request's arch, else ``arch``, else the
    machine's GPU's. The notes on the root go to ``rooting.say``."""
    if request.arch is None:
        request = request.with_arch(arch or local_arch(machine))
    layout = registry.get_engine(request.engine.name).plan_layout(request)
    root = choose_root(rooting.cache_dir, must_exist=False, layout=layout, new_trees=rooting.new_trees,
                       say=rooting.say)
    return request.plan(root.path)


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


def _plan_target(t: Target, rooting: Rooting, arch: str | None, fingerprint, machine: Machine) -> list[FleetMember]:
    options, group, engine_options = target_options(t)
    if options.arch is None and arch is not None:
        options = options.replace(arch=arch)
    request = build_request(options, layout=group.layout, engine_options=engine_options,
                            detect_gpu_uuids=detect_gpu_uuids)
    if fingerprint is not None:  # the serving image's: its GPU's arch, its FlashInfer
        request = request.for_target(fingerprint)
    members = []
    for r in request.workers():
        # the command's --cache-dir applies to every target, whatever its engine, as it does to the
        # target's own command; without it each engine's tree is where that engine reads it
        plan = plan_request(r, rooting, machine=machine)
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


def load_fleet(path: str, rooting: Rooting, arch: str | None, shard: str | None = None,
               use_env_shard: bool = False, fingerprint=None, shared_ok: bool = False,
               machine: Machine = THIS_MACHINE) -> Fleet:
    """Every target's workers planned under ``rooting`` (the command's ``--cache-dir`` applies to
    every target, whatever its engine), cut to this shard. ``arch``: the command line's --arch or
    the GPU of ``machine``, for targets that do not name theirs. A target whose fields are wrong is
    an error of its own (named ``targets[i]``); the others are planned all the same. Targets that
    are one entry are refused (they would write the same files), unless ``shared_ok`` (``check``:
    it reads them, and reports each target)."""
    members: list[FleetMember] = []
    errors: list[FleetError] = []
    targets = load_targets(path)
    for t in targets:
        try:
            members += _plan_target(t, rooting, arch, fingerprint, machine)
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


@dataclass(frozen=True)
class FleetOrder:
    """What a warm of several entries plans once its GPUs are known (their arch for whatever names
    none), under ``rooting``: a targets file's targets (``warm --targets``), cut to ``shard`` (else
    the environment's), or one command's own entries (``entries``: (engine group, worker request)
    pairs - both engines' calls, a speculative target and its draft)."""

    rooting: Rooting
    targets_file: str | None = None
    shard: str | None = None
    entries: tuple[tuple[WarmGroup, TuneRequest], ...] = ()


def command_items(entries: tuple[tuple[WarmGroup, TuneRequest], ...], rooting: Rooting, arch: str | None,
                  machine: Machine = THIS_MACHINE) -> list[FleetItem]:
    """One command's several entries, one item each (named by its layout where two engines' are
    written, else by its worker). ``--cache-dir`` is the root of the first group's tree (the others
    write to their own)."""
    several = len({g.layout for g, _ in entries}) > 1
    first = entries[0][0]

    def name(g: WarmGroup, r: TuneRequest) -> str:
        return (g.layout + ("" if r.worker == "target" else f" {r.worker}")) if several else r.worker

    return [FleetItem(name(g, r), plan_request(r, rooting if g is first else replace(rooting, cache_dir=None),
                                               arch, machine), g.layouts, worker=r.worker) for g, r in entries]


def plan_order(order: FleetOrder, arch: str | None,
               machine: Machine = THIS_MACHINE) -> tuple[list[FleetItem], Fleet | None]:
    """The items of a fleet order, and the targets file planned (its errors, its shard; None for
    one command's entries)."""
    if order.targets_file is not None:
        fleet = load_fleet(order.targets_file, order.rooting, arch, order.shard, use_env_shard=True,
                           machine=machine)
        return fleet_items(fleet.members), fleet
    return command_items(order.entries, order.rooting, arch, machine), None


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
