"""Hints for a name that is not an entry of the tree a command looks in, but is one of another
layout's tree: the user gave an id or a directory of the wrong engine (a vLLM entry to a
command reading the SGLang tree). Every layout is asked, through the registry."""

from __future__ import annotations

from pathlib import Path

from autotune_cache.registry import layouts
from autotune_cache.tree.layout import CacheLayout


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
