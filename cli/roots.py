"""Which cache root a command works on: the library decides (``tree/roots.py``: ``--cache-dir`` or
the engine's own, checked once there); here each note it returns is said once per process, on
stderr, and the roots ``--new-tree`` named are remembered for the rest of the process."""

from __future__ import annotations

import os

import click

from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import RootChoice
from autotune_cache.tree.roots import Rooting, choose_root, choose_trees

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
    """The (layout, root) pairs a command works on (``tree.roots.choose_trees``), its notes said
    once per process."""
    return choose_trees(cache_dir, flatten(layouts), every_existing=every_existing, new_trees=_NEW_TREES, say=say_once)
