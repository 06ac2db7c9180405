"""Which cache root a command works on: ``--cache-dir`` or the engine's own, checked once here -
a file, a directory inside a tree or holding a nested one, a root one or two levels above the
tree meant, a ``~`` the engine would not expand. Decided without a word printed: what is to be
said comes back as notes (the CLI says each once per process), what is wrong is raised (a usage
error for a command that would write where no engine reads, ``RootMissing`` for a reader)."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from autotune_cache.errors import RootMissing, UsageError
from autotune_cache.registry import default_layout, get_layout, layouts as known_layouts
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import RootChoice
from autotune_cache.tree.lookup import trees_below


def _silent(text: str) -> None:  # noqa: ARG001 - a library caller that says nothing
    return None


@dataclass(frozen=True)
class Rooted:
    """A root chosen, and the notes to say about it, in order."""

    choice: RootChoice
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rooting:
    """How a command roots what it plans: ``--cache-dir`` (None: each engine's own root), the roots
    ``--new-tree`` named (a new tree is meant there: nothing is said of trees below them), and
    where each note about a root goes (an output sink: the CLI says each once per process)."""

    cache_dir: str | None = None
    new_trees: Collection[str] = frozenset()
    say: Callable[[str], None] = field(default=_silent, compare=False)


def no_tree_here(root: Path, below: list[Path]) -> str:
    named = " or ".join(map(str, below[:3])) + (f" (or {len(below) - 3} more)" if len(below) > 3 else "")
    return f"no cache tree at {root}; did you mean {named}?"


def tilde_note(choice: RootChoice) -> str | None:
    """A root from a variable that starts with ``~``: the engine takes it verbatim (SGLang does not
    expand it: it reads ``./~/...`` relative to where it starts), and so does fi-autotune."""
    if choice.source.startswith("$") and str(choice.path).startswith("~"):
        return (f"warning: {choice.source} is {str(choice.path)!r}: the engine does not expand '~' there "
                f"(it reads a directory named '~' under its working directory), nor does fi-autotune; "
                f"set it to an absolute path such as {os.path.expanduser(str(choice.path))}")
    return None


def named_root(cache_dir: str | None, layout: CacheLayout) -> Rooted:
    """``--cache-dir`` or the layout's own root, with the ``~`` warning; a usage error where the
    layout's root comes from a variable that is not set."""
    if cache_dir is None and not layout.configured():
        raise UsageError(f"the {layout.name} layout's root is {layout.default_root().source}, which is not set "
                         "here: set it or give --cache-dir")
    choice = RootChoice(Path(cache_dir), "--cache-dir") if cache_dir is not None else layout.default_root()
    note = tilde_note(choice)
    return Rooted(choice, (note,) if note else ())


def check_root(choice: RootChoice, layout: CacheLayout, *, given: bool, must_exist: bool, writes: bool = False,
               new_tree: bool = False, new_trees: Collection[str] = frozenset()) -> tuple[str, ...]:
    """The notes on a root named (``given``: by ``--cache-dir``), or the error it is. A path that is
    a file is a usage error, and so is a ``--cache-dir`` inside a tree or holding a nested one (the
    layout says: ``misplaced_root``), which would read as empty and be written into where no
    engine reads; a root that does not exist is an error for commands that read (exit 1), naming
    where it came from.

    A root that holds no tree while a directory one or two levels below it holds one (``opt``
    given for ``opt/sglang-cache``): a note for a reader, and for a writer (``writes``: ``import``,
    ``pull``) a usage error naming that directory, unless ``new_tree`` (``--new-tree``) says a new
    tree there is meant, or it is one of ``new_trees`` (named so earlier)."""
    root = choice.path
    misplaced = layout.misplaced_root(root) if given else None
    if misplaced is not None:
        raise UsageError(f"--cache-dir {root} is {misplaced.what}: {misplaced.fix}")
    if root.exists() and not root.is_dir():
        raise UsageError(f"cache root {str(root)!r} (from {choice.source}) exists and is not a directory")
    if must_exist and not root.exists():
        raise RootMissing(f"cache root {root} does not exist (from {choice.source})")
    below = [] if new_tree or os.path.abspath(root) in new_trees else trees_below(root, layout)
    if below and writes:
        raise UsageError(no_tree_here(root, below) + f" (give {'that' if len(below) == 1 else 'one'} as "
                         f"--cache-dir, or --new-tree to start a new tree at {root})")
    return ("note: " + no_tree_here(root, below),) if below else ()


def choose_root(cache_dir: str | None, *, must_exist: bool, layout: CacheLayout | None = None, writes: bool = False,
                new_tree: bool = False, new_trees: Collection[str] = frozenset(),
                say: Callable[[str], None] = _silent) -> RootChoice:
    """``named_root`` then ``check_root``, each note handed to ``say`` as soon as it is known (the
    ``~`` warning before the error the root then turns out to be)."""
    layout = layout or default_layout()
    named = named_root(cache_dir, layout)
    for note in named.notes:
        say(note)
    for note in check_root(named.choice, layout, given=cache_dir is not None, must_exist=must_exist, writes=writes,
                           new_tree=new_tree, new_trees=new_trees):
        say(note)
    return named.choice


def choose_trees(cache_dir: str | None, names: tuple[str, ...], *, every_existing: bool = False,
                 new_trees: Collection[str] = frozenset(),
                 say: Callable[[str], None] = _silent) -> list[tuple[CacheLayout, RootChoice]]:
    """The (layout, root) pairs a command reads. ``--cache-dir`` is one layout's root (the default
    layout unless ``names`` says which); otherwise each named layout's own root. With
    ``every_existing`` (``ls`` without ``--layout``), every configured layout whose root exists:
    an error naming each root looked at if none does."""
    if cache_dir is not None:
        if len(names) > 1:
            raise UsageError("--cache-dir is one layout's root: give one --layout with it")
        layout = get_layout(names[0]) if names else default_layout()
        return [(layout, choose_root(cache_dir, must_exist=True, layout=layout, new_trees=new_trees, say=say))]
    if names:
        return [(get_layout(n), choose_root(None, must_exist=True, layout=get_layout(n), new_trees=new_trees, say=say))
                for n in names]
    if not every_existing:
        return [(default_layout(), choose_root(None, must_exist=True, new_trees=new_trees, say=say))]
    found, missing = [], []
    for layout in known_layouts().values():
        if not layout.configured():
            continue
        choice = layout.default_root()
        note = tilde_note(choice)
        if note:
            say(note)
        if choice.path.is_dir():
            found.append((layout, choice))
        else:
            missing.append(choice)
    if not found:
        first, *rest = missing
        raise RootMissing(f"cache root {first.path} does not exist (from {first.source})"
                          + "".join(f"; nor does {c.path} (from {c.source})" for c in rest))
    return found


def named_roots(cache_dir: str | None, names: tuple[str, ...], *, new_trees: Collection[str] = frozenset(),
                say: Callable[[str], None] = _silent) -> list[tuple[str, RootChoice]]:
    """Each root a reader would look at, existing or not (``ls --dir``): the named layouts', else
    the default layout's with ``--cache-dir``, else every configured layout's."""
    names = names or ((default_layout().name,) if cache_dir is not None else
                      tuple(n for n, lay in known_layouts().items() if lay.configured()))
    return [(n, choose_root(cache_dir, must_exist=False, layout=get_layout(n), new_trees=new_trees, say=say))
            for n in names]
