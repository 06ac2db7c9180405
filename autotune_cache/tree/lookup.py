"""Hints for a name that is not an entry of the tree a command looks in, but is one of another
layout's tree: the user gave an id or a directory of the wrong engine (a vLLM entry to a
command reading the SGLang tree), or a root that holds no tree while a directory just below it
does (``--cache-dir opt`` for ``opt/sglang-cache``). Every layout is asked, through the registry."""

from __future__ import annotations

import os
from pathlib import Path

from autotune_cache.registry import layouts
from autotune_cache.tree.layouts.base import CacheLayout


def other_layout_id(layout: CacheLayout, text: str) -> str | None:
    """A hint when ``text`` is the id of another layout's entry (``vllm:...`` given to an sglang tree)."""
    prefix, sep, _ = text.partition(":")
    if not sep or prefix == layout.name:
        return None
    other = layouts().get(prefix)
    if other is None or other.parse_id(text) is None:
        return None
    return (f"it is an id of the {prefix} layout and this command works on the {layout.name} tree: "
            f"give --layout {prefix} where the command takes it")


def tree_of_entry_dir(path: Path) -> str | None:
    """For a directory that is an entry of some layout's tree (a vLLM entry handed to a command
    looking in the SGLang tree): which flags name it, or None. The most specific layout wins
    (a vLLM entry dir also looks like a bare ``vllm-dir`` hash dir one level up)."""
    try:
        if not path.is_dir():
            return None
        real = path.resolve()
    except OSError:
        return None
    for other in sorted(layouts().values(), key=lambda lay: -(len(lay.base_parts()) + len(lay.levels))):
        depth = len(other.base_parts()) + len(other.levels)
        if len(real.parts) <= depth:
            continue
        root = Path(*real.parts[:-depth])
        if other.parse_member("/".join((*real.parts[-depth:], "x"))) is not None:
            return f"it is an entry of the {other.name} tree at {root}: --layout {other.name} --cache-dir {root}"
    return None


def wrong_tree_hint(layout: CacheLayout, ref: str) -> str | None:
    """Where ``ref`` belongs when it names an entry of another tree, or None."""
    text = ref.rstrip("/")  # never stripped of spaces: ids match exactly (tree/refs.py)
    return tree_of_entry_dir(Path(ref)) or other_layout_id(layout, text)


#: How many directories ``trees_below`` looks at under a root before it stops (a home dir given
#: as the root must not turn a listing into a walk of the disk).
BELOW_LOOK_LIMIT = 2000


def trees_below(root: Path, layout: CacheLayout) -> list[Path]:
    """The directories one or two levels below ``root`` that hold ``layout``'s tree (its base dir
    with at least one first-level dir in it: ``<child>/flashinfer/autotune/<version>``), where
    ``root`` holds none itself: ``--cache-dir opt`` given for ``opt/sglang-cache`` reads as empty,
    and a write there starts a second tree no engine reads. Empty where ``root`` holds a tree, is
    no directory, or the layout has no base dir of its own."""
    if not layout.base_parts() or not root.is_dir() or layout.base(root).exists():
        return []

    def holds_tree(d: Path) -> bool:
        try:
            with os.scandir(layout.base(d)) as it:
                return any(layout.levels[0].valid(e.name) and e.is_dir() for e in it)
        except OSError:
            return False

    def subdirs(d: Path) -> list[Path]:
        try:
            with os.scandir(d) as it:
                return sorted(Path(e.path) for e in it if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))
        except OSError:
            return []

    found, looked = [], 0
    for child in subdirs(root):
        looked += 1
        if holds_tree(child):
            found.append(child)
            continue
        for grandchild in subdirs(child):
            looked += 1
            if holds_tree(grandchild):
                found.append(grandchild)
            if looked >= BELOW_LOOK_LIMIT:
                return found
        if looked >= BELOW_LOOK_LIMIT:
            break
    return found
