"""Which cache root a command works on: ``--cache-dir`` or the engine's own, checked once here -
a file, a directory inside a tree or holding a nested one, a root one or two levels above the
tree meant, a ``~`` the engine would not expand - each said in one line (a note, once per
process, or a usage error for a command that would write where no engine reads)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from autotune_cache.errors import RootMissing, UsageError
from autotune_cache.registry import default_layout, get_layout, layouts as known_layouts
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import RootChoice
from autotune_cache.tree.lookup import trees_below

from .output import PROG
from .params import flatten


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
