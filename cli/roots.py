"""Which cache root a command works on: the library decides (``tree/roots.py``: ``--cache-dir`` or
the engine's own, checked once there); here each note it returns is said once per process, on
stderr, and the roots ``--new-tree`` named are remembered for the rest of the process."""

from __future__ import annotations

import os

import click

from autotune_cache.errors import RootMissing, UsageError
from autotune_cache.registry import default_layout, get_layout, layouts as known_layouts
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import RootChoice
from autotune_cache.tree.roots import Rooting, choose_root, tilde_note

from .output import PROG
from .params import flatten


#: What each process has said once already (a command may resolve its root more than once).
_SAID: set[str] = set()
#: Roots ``--new-tree`` named in this process: a new tree is meant there, so nothing more is said.
_NEW_TREES: set[str] = set()


def say_once(text: str) -> None:
    """A note about a root, on stderr, once per process (the sink the library's planning says into)."""
    if text not in _SAID:
        _SAID.add(text)
        click.echo(f"{PROG}: {text}", err=True)


def rooting(cache_dir: str | None) -> Rooting:
    """How this command's plans are rooted: under ``cache_dir`` (None: each engine's own root),
    its notes said once per process, the roots ``--new-tree`` named in it remembered."""
    return Rooting(cache_dir, _NEW_TREES, say_once)


def resolve_root(cache_dir: str | None, *, must_exist: bool, layout: CacheLayout | None = None,
                 writes: bool = False, new_tree: bool = False) -> RootChoice:
    """``--cache-dir`` or the engine's own root (``tree.roots.choose_root`` says what is wrong with
    one), its notes said once per process; a root ``new_tree`` names is remembered as one."""
    choice = choose_root(cache_dir, must_exist=must_exist, layout=layout, writes=writes, new_tree=new_tree,
                         new_trees=_NEW_TREES, say=say_once)
    if new_tree:
        _NEW_TREES.add(os.path.abspath(choice.path))
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
        note = tilde_note(choice)
        if note:
            say_once(note)
        if choice.path.is_dir():
            found.append((layout, choice))
        else:
            missing.append(choice)
    if not found:
        first, *rest = missing
        raise RootMissing(f"cache root {first.path} does not exist (from {first.source})"
                              + "".join(f"; nor does {c.path} (from {c.source})" for c in rest))
    return found
