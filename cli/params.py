"""Parameter types and shared options: validation happens once, here, through click's types."""

from __future__ import annotations

import re

import click

from autotune_cache.errors import UsageError
from autotune_cache.humanize import Duration, parse_duration
from autotune_cache.registry import default_layout, get_layout, layouts as known_layouts
from autotune_cache.autotuner.arch import ARCH_RE
from autotune_cache.autotuner.installed import VERSION_RE
from autotune_cache.tree.store.storeio import DEFAULT_TIMEOUT, TIMEOUT_ENV, set_store_timeout
from autotune_cache.tree.status import EntryStatus


class DurationType(click.ParamType):
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``: a unit is required (a bare ``30`` is refused)."""

    name = "duration"

    def convert(self, value, param, ctx) -> Duration:
        if isinstance(value, Duration):
            return value
        try:
            return parse_duration(str(value))
        except UsageError as e:
            self.fail(str(e), param, ctx)


class CommaList(click.ParamType):
    """Comma-separated values (the option may also repeat); each one normalized and checked."""

    def __init__(self, name: str, normalize=lambda s: s, check=None, choices=None, hint=None):
        """``choices``: a list, or a function giving one when a value is checked (the registry's
        layouts, which a test may extend after this module is imported). ``hint(raw)``: what to
        add to "invalid ...", so a refusal says what would be taken."""
        self.name = name
        self.normalize = normalize
        self.check = check
        self.choices = choices
        self.hint = hint

    def convert(self, value, param, ctx) -> tuple:
        if isinstance(value, tuple):
            return value
        out = []
        for raw in str(value).split(","):
            item = self.normalize(raw.strip())
            if not item:
                continue
            choices = self.choices() if callable(self.choices) else self.choices
            if choices is not None and item not in choices:
                self.fail(f"unknown {self.name} {raw.strip()!r}; known: {', '.join(choices)}", param, ctx)
            if self.check is not None and not self.check(item):
                hint = f": {self.hint(raw.strip())}" if self.hint is not None else ""
                self.fail(f"invalid {self.name} {raw.strip()!r}{hint}", param, ctx)
            out.append(item)
        return tuple(out)


def _arch_hint(raw: str) -> str:
    """The accepted forms, and the nearest one where punctuation is all that differs (``sm_90``)."""
    near = re.sub(r"[^a-z0-9]", "", raw.lower())
    guess = f"; did you mean {near}?" if ARCH_RE.match(near) else ""
    return f"give sm<major><minor>[suffix], e.g. sm90, sm100a, SM90 (any case){guess}"


ARCHS = CommaList("arch", normalize=str.lower, check=lambda a: bool(ARCH_RE.match(a)), hint=_arch_hint)
STATUSES = CommaList("status", normalize=str.lower, choices=EntryStatus.names())
VERSIONS = CommaList("FlashInfer version", check=lambda v: bool(VERSION_RE.match(v)))
DURATION = DurationType()
POSITIVE = click.IntRange(min=1)


def flatten(values) -> tuple:
    """Repeated comma-list options arrive as a tuple of tuples."""
    out: list = []
    for v in values or ():
        for item in (v if isinstance(v, tuple) else (v,)):
            if item not in out:
                out.append(item)
    return tuple(out)


class LayoutName(click.ParamType):
    """A layout name, checked against the registry when the command runs (an engine registered
    after the CLI was imported is known too)."""

    name = "layout"

    def __init__(self, offered=lambda: list(known_layouts())) -> None:
        self.offered = offered  # () -> the names this option takes

    def get_metavar(self, param, ctx=None) -> str:  # noqa: ARG002 - click's signature
        return "[" + "|".join(self.offered()) + "]"

    def convert(self, value, param, ctx) -> str:
        if value in self.offered():
            return value
        self.fail(f"{value!r} is not one of {', '.join(map(repr, self.offered()))}.", param, ctx)


class HelpWhenShown(click.Option):
    """An option whose help text is written when ``--help`` shows it, from ``help_text()``: text
    that reads the environment (a layout's root: ``$SGLANG_CACHE_DIR``, ``~``) says what holds for
    that command, and importing the CLI reads no variable for it."""

    def __init__(self, *args, help_text, **kw):
        super().__init__(*args, **kw)
        self.help_text = help_text

    def get_help_record(self, ctx):
        self.help = self.help_text()
        return super().get_help_record(ctx)


def _layouts_help() -> str:
    roots = ", ".join(f"{n} ({l.default_root().source.removeprefix('the default ')})" for n, l in known_layouts().items())
    return f"Which engine's tree: {roots}. Default: {default_layout().name}; `ls` lists every one that exists."


LAYOUT_NAMES = CommaList("layout", choices=lambda: list(known_layouts()))
layout_option = click.option("--layout", "layouts", multiple=True, type=LAYOUT_NAMES, cls=HelpWhenShown,
                             help_text=_layouts_help)


def _layout_named(ctx, param, value):  # noqa: ARG001 - click's callback signature
    return get_layout(value)


archive_layout_option = click.option(
    "--layout", "layout", default=default_layout().name, show_default=True, callback=_layout_named,
    type=LayoutName(),
    help="Which engine's tree the entries belong to (its root: --cache-dir, else the engine's own).",
)


cache_dir_option = click.option(
    "--cache-dir",
    type=click.Path(file_okay=True, dir_okay=True),
    default=None,
    help="The layout's cache root (sglang: the dir holding flashinfer/autotune; default: the engine's own, "
         "$SGLANG_CACHE_DIR else ~/.cache/sglang; vllm: $VLLM_CACHE_ROOT; see --layout).",
)
def _set_timeout(ctx, param, value):
    """Seconds, bare (``30``) or in the durations' grammar (``30s``, ``2m``) that every other
    span takes: a wait, unlike a span that selects what to delete, may go without its unit."""
    if value is not None:
        try:
            seconds = float(value)
        except ValueError:
            try:
                seconds = parse_duration(value).seconds
            except UsageError as e:
                raise click.BadParameter(str(e), ctx, param) from None
        if not seconds > 0:
            raise click.BadParameter("give a number of seconds above 0", ctx, param)
        set_store_timeout(seconds)
    return value


timeout_option = click.option(
    "--timeout", default=None, metavar="SECONDS", expose_value=False, callback=_set_timeout,
    help=f"Seconds a store may stay silent before the command fails (30, or 30s, 2m; default: ${TIMEOUT_ENV}, "
         f"else {DEFAULT_TIMEOUT:g}; connecting waits at most 10).")
new_tree_option = click.option(
    "--new-tree", is_flag=True,
    help="Start a new tree at the root even though a directory one or two levels below it holds one "
         "(without it such a root is refused, naming that directory: a --cache-dir one level too high).")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")
quiet_option = click.option("-q", "--quiet", is_flag=True, help="Print entry ids only, one per line.")
env_from_option = click.option(
    "--env-from", type=click.Path(dir_okay=False), default=None,
    help="Judge staleness against this fingerprint (`fi-autotune env --json` run in the serving image) "
         "instead of this host. Needs no GPU and no flashinfer here.",
)
check_env_option = click.option(
    "--check-env", is_flag=True,
    help="Judge staleness against this host's FlashInfer and GPU (imports flashinfer; a host without a GPU "
         "cannot stand for a serving environment: use --env-from).",
)

targets_option = click.option(
    "--targets", "targets_file", type=click.Path(dir_okay=False, allow_dash=True), default=None,
    help="A YAML or JSON list of targets (warm's flags as fields; a list value expands into one target per "
         "value) instead of one target's flags: docs/fleet.md.")
shard_option = click.option(
    "--shard", default=None, metavar="i/N",
    help="With --targets: this process's part of the list (0-based i of N), split the same way everywhere "
         "(warm's default: the index a Kubernetes Indexed Job, a Slurm array or torchrun gives).")


def parse_gpus(value: str | None) -> int | None:
    """``--gpus``: a count, or None for every GPU (``all``)."""
    if value in (None, "all"):
        return None
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"--gpus takes a number or 'all', got {value!r}") from None
    if n < 1:
        raise UsageError(f"--gpus must be >= 1, got {n}")
    return n
