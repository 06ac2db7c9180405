"""The serving options plan, warm, verify, check and pull share, and the request they make.

The options are declared once, in the library (``plan.options.SERVING_OPTIONS``, and each
engine's own in ``Engine.cli_options``); this module turns them into click options, folds a
pasted serving command into them, and hands a typed ``ServingOptions`` to the library's request
builder. Commands never build requests themselves.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import click

from autotune_cache import registry
from autotune_cache.engines.requests import build_request, build_requests, read_serving_command
from autotune_cache.engines.selection import WarmGroup, warm_groups
from autotune_cache.errors import UsageError
from autotune_cache.plan.entry_key import key_schemas
from autotune_cache.plan.options import GIVEN_OPTIONS, Option, ServingOptions
from autotune_cache.plan.request import TuneRequest
from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tree.roots import Rooting
from autotune_cache.tune.session.fleetplan import plan_request
from autotune_cache.tune.workers.gpus import detect_gpu_uuids
from autotune_cache.tune.workers.machine import THIS_MACHINE, Machine

from .output import Output
from .params import POSITIVE, cache_dir_option
from .roots import rooting


def _click_option(option: Option):
    kw: dict = {"help": option.help or None, "show_default": option.show_default, "metavar": option.metavar}
    if option.kind == "flag":
        return click.option(option.spelling, option.name, is_flag=True, **kw)
    kind = {"positive": POSITIVE, "choice": click.Choice(list(option.choices))}.get(option.kind)
    help_text = option.help
    if option.name == "schema":
        help_text = f"{option.help[:-1]} ({', '.join(key_schemas())})."
    kw["help"] = help_text or None
    return click.option(option.spelling, option.name, type=kind, default=option.default, **kw)


def serving_options(fn=None, *, model_required: bool = True):  # noqa: ARG001 - --model or --model-path, checked by the builder
    """The model and server flags (named as SGLang names them), and ``--cache-dir``."""
    if fn is None:
        return functools.partial(serving_options, model_required=model_required)
    for option in reversed((*(_click_option(o) for o in GIVEN_OPTIONS), cache_dir_option)):
        fn = option(fn)
    return fn


def engine_options(fn):
    """What only one engine's target needs (vLLM: its config hash and token budget)."""
    for engine in reversed(registry.engines()):
        for option in reversed(engine.cli_options):
            fn = _click_option(option)(fn)
    return fn


def engine_option_values(kw: dict) -> dict:
    """The engine options out of a command's keyword arguments (removed from ``kw``)."""
    names = [o.name for engine in registry.engines() for o in engine.cli_options]
    return {name: kw.pop(name, None) for name in names}


def planned_layouts() -> list[str]:
    """The layouts of the engines fi-autotune plans for (``--layout`` of plan)."""
    return [layout.name for engine in registry.engines() for layout in engine.layouts]


serving_command_argument = click.argument("serving_command", nargs=-1, type=click.UNPROCESSED,
                                          metavar="[-- SERVING COMMAND]")


def fold_serving_command(ctx: click.Context, kw: dict, out: Output, layout_param: str) -> tuple[dict, str]:
    """Fold a pasted serving command (after ``--``) into the command's keyword arguments, read by
    the engine whose program starts it (``vllm serve`` is vLLM's). The command alone says the
    server's options: one given here with another value than the command's - or than the default
    the server runs with where the command does not set it - is a usage error (folded in, a
    ``--tp 4`` beside a command without ``--tp-size`` planned an entry its TP1 server never reads);
    fi-autotune's own options (``Option.ours``: the arch, the config, the key schema) and
    ``--cache-dir`` (where to write or check, e.g. a copy to be shipped) stay the caller's. Flags
    the key and the plan do not use are listed. Returns the keyword
    arguments and the layout: the one ``--layout`` (the parameter ``layout_param``) names, which
    must be the command's engine's, else the tree the command's server reads."""
    layout = ctx.params[layout_param]
    argv = kw.pop("serving_command", ())
    if not argv:
        return kw, layout
    given_layout = ctx.get_parameter_source(layout_param) == click.core.ParameterSource.COMMANDLINE
    first = str(layout).split(",")[0].strip() if given_layout else None
    engine, cmd = read_serving_command(argv, first or None)
    if given_layout:
        for name in (x.strip() for x in str(layout).split(",") if x.strip()):
            owner = registry.engine_of_layout(name)
            if owner is not None and owner is not engine:
                raise UsageError(f"--layout {name} is {owner.label}'s tree, but the serving command starts "
                                 f"{engine.label} ({engine.title} reads {', '.join(x.name for x in engine.layouts)})")
    else:
        layout = cmd.layout or engine.layout().name
    for name, value in cmd.options.items():
        if _given(ctx, name, kw) and kw[name] != value:
            raise UsageError(f"--{name.replace('_', '-')} is {kw[name]!r} here but {value!r} in the serving command")
        kw[name] = value
    for option in _server_options():
        name = option.name
        if name not in cmd.options and _given(ctx, name, kw) and kw[name] != (default := _default(ctx, name)):
            said = "given" if option.kind == "flag" else f"{kw[name]!r}"
            runs = "without it" if default in (None, "", (), False) else f"with {default!r}"
            raise UsageError(f"{option.spelling} is {said} here, but the serving command does not set it (its server "
                             f"runs {runs}): set it in the serving command, or drop {option.spelling}")
    for note in cmd.notes:
        out.note(f"serving command: {note}")
    if cmd.ignored:
        out.note(f"serving command: ignored ({engine.label}'s own code showed they do not reach its autotune path): "
                 + ", ".join(cmd.ignored))
    for flag in cmd.not_understood:
        out.note(f"warning: serving command: not understood: {flag}")
    kw["not_understood"] = tuple(cmd.not_understood)
    return kw, layout


def _given(ctx: click.Context, name: str, kw: dict) -> bool:
    return name in kw and ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


def _default(ctx: click.Context, name: str):
    return next(p for p in ctx.command.params if p.name == name).get_default(ctx)


def _server_options() -> list[Option]:
    """The options that say how the server runs: every serving option and engine option but
    fi-autotune's own."""
    return [o for o in (*GIVEN_OPTIONS, *(o for e in registry.engines() for o in e.cli_options)) if not o.ours]


def machine_of(ctx: click.Context | None = None) -> Machine:
    """The machine given as click's context object (a test launcher's fake GPUs), else this one."""
    ctx = ctx or click.get_current_context(silent=True)
    return (ctx.find_object(Machine) if ctx is not None else None) or THIS_MACHINE


def request_from(kw: dict, layout: str | None = None, *, engine_options: bool = True) -> TuneRequest:
    """The typed request behind a command's serving (and engine) options. ``engine_options``
    False: leave the engine options out (one command writing two engines' trees)."""
    options = engine_option_values(dict(kw)) if engine_options else {}
    return build_request(ServingOptions.pick(kw), layout=layout, engine_options=options,
                         detect_gpu_uuids=detect_gpu_uuids)


def requests_from(kw: dict, layouts: list[str]) -> list[TuneRequest]:
    """One request per layout (each another engine's), each engine given only its own options."""
    options = engine_option_values(dict(kw))  # the command's keywords all read here, then the library
    return build_requests(ServingOptions.pick(kw), layouts, options, detect_gpu_uuids=detect_gpu_uuids)


@dataclass(frozen=True)
class WarmRequests:
    """A warm's serving options read once: the engine groups it writes (``--layout``, else the tree
    the serving command's server reads), one request each, and how its plans are rooted."""

    groups: list[WarmGroup]
    requests: list[TuneRequest]
    rooting: Rooting


def warm_requests(ctx: click.Context, kw: dict, out: Output) -> WarmRequests:
    """``warm``'s options and pasted serving command into its requests, in one step: the serving
    command folded in (``fold_serving_command``), ``--layout`` checked, one request per engine."""
    kw, layouts = fold_serving_command(ctx, kw, out, "layouts")
    roots = rooting(kw["cache_dir"])  # the serving command's environment may name the root
    groups = warm_groups(layouts)
    return WarmRequests(groups, requests_from(kw, [g.layout for g in groups]), roots)


def build_plan(request: TuneRequest, cache_dir: str | None, arch: str | None = None) -> TuningPlan:
    """The plan for ``request`` under the cache root ``cache_dir`` names (made if missing), else the
    root of the engine's layout (``fleetplan.plan_request``; its notes said once, on stderr)."""
    return plan_request(request, rooting(cache_dir), arch, machine_of())
