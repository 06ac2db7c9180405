"""Parameter types and shared options: validation happens once, here, through click's types."""

from __future__ import annotations

import os
import re
from pathlib import Path

import click

from autotune_cache.errors import RootMissing, UsageError
from autotune_cache.humanize import Duration, parse_duration, parse_size
from autotune_cache.autotuner.fingerprint import NO_GPU_STALENESS, Fingerprint, fingerprint_for_staleness, is_known
from autotune_cache.registry import default_layout, get_layout, layouts as known_layouts
from autotune_cache.autotuner.arch import ARCH_RE
from autotune_cache.autotuner.installed import VERSION_RE, installed_flashinfer_version
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import RootChoice
from autotune_cache.tree.lookup import trees_below
from autotune_cache.tree.select import EntryFilter
from autotune_cache.tree.store.storeio import DEFAULT_TIMEOUT, TIMEOUT_ENV, set_store_timeout
from autotune_cache.tree.status import EntryStatus

from .output import PROG


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


#: What each process has said once already (a command may resolve its root more than once).
_SAID: set[str] = set()
#: Roots ``--new-tree`` named in this process: a new tree is meant there, so nothing more is said.
_NEW_TREES: set[str] = set()


def _say_once(text: str) -> None:
    if text not in _SAID:
        _SAID.add(text)
        click.echo(f"{PROG}: {text}", err=True)


def _no_tree_here(root: Path, below: list[Path]) -> str:
    named = " or ".join(map(str, below[:3])) + (f" (or {len(below) - 3} more)" if len(below) > 3 else "")
    return f"no cache tree at {root}; did you mean {named}?"


def _tilde_hint(choice: RootChoice) -> None:
    """A root from a variable that starts with ``~``: the engine takes it verbatim (SGLang does not
    expand it: it reads ``./~/...`` relative to where it starts), and so does fi-autotune."""
    if choice.source.startswith("$") and str(choice.path).startswith("~"):
        _say_once(f"warning: {choice.source} is {str(choice.path)!r}: the engine does not expand '~' there "
                  f"(it reads a directory named '~' under its working directory), nor does fi-autotune; "
                  f"set it to an absolute path such as {os.path.expanduser(str(choice.path))}")


def resolve_root(cache_dir: str | None, *, must_exist: bool, layout: CacheLayout | None = None,
                 writes: bool = False, new_tree: bool = False) -> RootChoice:
    """``--cache-dir`` or the engine's own root. A path that is a file is a usage error, and so is
    a ``--cache-dir`` inside a tree or holding a nested one (the layout says: ``misplaced_root``),
    which would read as empty and be written into where no engine reads; a root that does not
    exist is an error for commands that read (exit 1), naming where it came from.

    A root that holds no tree while a directory one or two levels below it holds one (``opt``
    given for ``opt/sglang-cache``): a note for a reader, and for a writer (``writes``: ``import``,
    ``pull``) a usage error naming that directory, unless ``new_tree`` (``--new-tree``) says a new
    tree there is meant."""
    layout = layout or default_layout()
    if cache_dir is None and not layout.configured():
        raise UsageError(f"the {layout.name} layout's root is {layout.default_root().source}, which is not set "
                         "here: set it or give --cache-dir")
    choice = RootChoice(Path(cache_dir), "--cache-dir") if cache_dir is not None else layout.default_root()
    root = choice.path
    _tilde_hint(choice)
    misplaced = layout.misplaced_root(root) if cache_dir is not None else None
    if misplaced is not None:
        raise UsageError(f"--cache-dir {root} is {misplaced.what}: {misplaced.fix}")
    if root.exists() and not root.is_dir():
        raise UsageError(f"cache root {str(root)!r} (from {choice.source}) exists and is not a directory")
    if must_exist and not root.exists():
        raise RootMissing(f"cache root {root} does not exist (from {choice.source})")
    if new_tree:
        _NEW_TREES.add(os.path.abspath(root))
    below = [] if os.path.abspath(root) in _NEW_TREES else trees_below(root, layout)
    if below and writes:
        raise UsageError(_no_tree_here(root, below) + f" (give {'that' if len(below) == 1 else 'one'} as "
                         f"--cache-dir, or --new-tree to start a new tree at {root})")
    if below:
        _say_once("note: " + _no_tree_here(root, below))
    return choice


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


LAYOUT_NAMES = CommaList("layout", choices=lambda: list(known_layouts()))
layout_option = click.option(
    "--layout", "layouts", multiple=True, type=LAYOUT_NAMES,
    help="Which engine's tree: " + ", ".join(f"{n} ({l.default_root().source.removeprefix('the default ')})"
                                            for n, l in known_layouts().items()) + f". Default: {default_layout().name}; `ls` lists every one that exists.",
)


def _layout_named(ctx, param, value):  # noqa: ARG001 - click's callback signature
    return get_layout(value)


archive_layout_option = click.option(
    "--layout", "layout", default=default_layout().name, show_default=True, callback=_layout_named,
    type=LayoutName(),
    help="Which engine's tree the entries belong to (its root: --cache-dir, else the engine's own).",
)


def trees(cache_dir: str | None, layouts, *, every_existing: bool = False) -> list[tuple[CacheLayout, RootChoice]]:
    """The (layout, root) pairs a command works on. ``--cache-dir`` is one layout's root (sglang
    unless ``--layout`` says which); otherwise each layout's own root. With ``every_existing``
    (``ls`` without ``--layout``), every layout whose root exists - an error if none does."""
    names = flatten(layouts)
    if cache_dir is not None:
        if len(names) > 1:
            raise UsageError("--cache-dir is one layout's root: give one --layout with it")
        layout = get_layout(names[0]) if names else default_layout()
        return [(layout, resolve_root(cache_dir, must_exist=True, layout=layout))]
    if names:
        return [(get_layout(n), resolve_root(None, must_exist=True, layout=get_layout(n))) for n in names]
    if not every_existing:
        return [(default_layout(), resolve_root(None, must_exist=True))]
    found, missing = [], []
    for layout in known_layouts().values():
        if not layout.configured():
            continue
        choice = layout.default_root()
        _tilde_hint(choice)
        if choice.path.is_dir():
            found.append((layout, choice))
        else:
            missing.append(choice)
    if not found:
        first, *rest = missing
        raise RootMissing(f"cache root {first.path} does not exist (from {first.source})"
                              + "".join(f"; nor does {c.path} (from {c.source})" for c in rest))
    return found


cache_dir_option = click.option(
    "--cache-dir",
    type=click.Path(file_okay=True, dir_okay=True),
    default=None,
    help="The layout's cache root (sglang: the dir holding flashinfer/autotune; default: the engine's own, "
         "$SGLANG_CACHE_DIR else ~/.cache/sglang; vllm: $VLLM_CACHE_ROOT; see --layout).",
)
def _set_timeout(ctx, param, value):
    if value is not None:
        if not value > 0:
            raise click.BadParameter("give a number of seconds above 0", ctx, param)
        set_store_timeout(value)
    return value


timeout_option = click.option(
    "--timeout", type=float, default=None, metavar="SECONDS", expose_value=False, callback=_set_timeout,
    help=f"Seconds a store may stay silent before the command fails (default: ${TIMEOUT_ENV}, else "
         f"{DEFAULT_TIMEOUT:g}; connecting waits at most 10).")
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

FILTER_HELP = {
    "model": "Only entries served as this model path, exactly as plan, check and pull take --model "
             "(zai-org/GLM-5.1 is not zai-org/GLM-5.1-FP8; entries without a manifest have none).",
    "model_glob": "Only entries whose model path matches this shell pattern, any case: * ? [..] "
                  "('*GLM-5.1*' takes GLM-5.1 and GLM-5.1-FP8; quote it from the shell).",
    "versions": "Only these FlashInfer versions (comma-separated or repeated), matched exactly: 0.7.2 is not "
                "0.7.2.post1 (ls names the versions the tree holds when none matches).",
    "arch": "Only these archs, e.g. sm90,sm100 (comma-separated or repeated, any case).",
    "status": "Only these statuses: " + ", ".join(EntryStatus.names()) + " (comma-separated or repeated).",
    "older_than": "Only entries not modified for this long: a number with s, m, h, d or w, any case, or "
                  "their long forms (30d, 12h, 90min, 2 weeks); a bare number is refused.",
    "unused_for": "Only entries no engine has read for this long, from access times (30d). Where the "
                  "filesystem keeps no access times (noatime mounts), or a copy left them (every entry read within "
                  "seconds: rsync, a restore), last use is unknown and nothing is selected, with a note; "
                  "relatime (the Linux default) is exact to a day.",
}


def filter_options(fn):
    """The filters ``ls``, ``prune`` and ``export`` share."""
    options = [
        click.option("--model", default=None, help=FILTER_HELP["model"]),
        click.option("--model-glob", default=None, metavar="PATTERN", help=FILTER_HELP["model_glob"]),
        click.option("--flashinfer-version", "versions", multiple=True, type=VERSIONS, help=FILTER_HELP["versions"]),
        click.option("--arch", multiple=True, type=ARCHS, help=FILTER_HELP["arch"]),
        click.option("--status", multiple=True, type=STATUSES, help=FILTER_HELP["status"]),
        click.option("--older-than", type=DURATION, default=None, help=FILTER_HELP["older_than"]),
        click.option("--unused-for", type=DURATION, default=None, help=FILTER_HELP["unused_for"]),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


size_filter_options = [
    click.option("--larger-than", default=None, metavar="SIZE",
                 help="Entries taking more than SIZE on disk (50M, 1G, 10GiB; a unit is required, any case), "
                      "as docker's and hf's size filters."),
    click.option("--smaller-than", default=None, metavar="SIZE", help="Entries taking less than SIZE on disk."),
]


def size_filters(fn):
    """``--larger-than``/``--smaller-than`` (``ls``, ``prune``): sizes parsed by ``humanize.parse_size``."""
    for option in reversed(size_filter_options):
        fn = option(fn)
    return fn


def entry_filter(model, versions, arch, status, older_than, unused_for, other_versions_than=None, *,
                 larger_than: str | None = None, smaller_than: str | None = None,
                 model_glob: str | None = None) -> EntryFilter:
    return EntryFilter(
        model_glob=model_glob or None,
        larger_than=None if larger_than is None else parse_size(larger_than),
        smaller_than=None if smaller_than is None else parse_size(smaller_than),
        model=model or None,
        flashinfer_versions=flatten(versions),
        archs=flatten(arch),
        statuses=tuple(EntryStatus(s) for s in flatten(status)),
        older_than=older_than,
        unused_for=unused_for,
        other_versions_than=other_versions_than,
    )


def model_hint(asked: str | None, models) -> str | None:
    """"--model matches exactly" when ``asked`` selected nothing but other models contain it (the
    old substring meaning): the pattern that would take them, never taken on a guess."""
    if not asked:
        return None
    near = sorted({m for m in models if m and m != asked and asked.lower() in m.lower()})
    if not near:
        return None
    shown = ", ".join(near[:3]) + (f" (+{len(near) - 3})" if len(near) > 3 else "")
    return f"--model matches the model path exactly; {shown} only contain{'s' if len(near) == 1 else ''} " \
           f"{asked!r}: --model-glob '*{asked}*' selects by pattern"


def staleness_fingerprint(env_from: str | None, check_env: bool, flt: EntryFilter, out):
    """The fingerprint to judge staleness against, or None (with a note saying why).

    ``--env-from`` wins; ``--check-env`` or ``--status stale`` mean this host, which must have a
    GPU: a host without one is no serving environment, so nothing is called stale there.
    """
    wants_stale = EntryStatus.STALE in flt.statuses
    if not (env_from or check_env or wants_stale):
        return None
    fp = fingerprint_for_staleness(env_from, required=wants_stale)
    if fp is None:
        out.warn(NO_GPU_STALENESS)
    return fp


def keep_latest_version(env_from: str | None) -> str | None:
    """The FlashInfer version ``prune --keep-latest`` keeps first: the serving image's
    (``--env-from``), else the one installed here, read from package metadata (no import)."""
    if env_from:
        value = Fingerprint.load(env_from).fields.get("flashinfer_version")
    else:
        value = installed_flashinfer_version()
    return value if isinstance(value, str) and is_known(value) and VERSION_RE.match(value) else None


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
