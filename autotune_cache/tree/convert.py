"""``convert``: a complete entry of one layout written into another, without tuning again.

Which conversions exist is the layouts' answer (``CacheLayout.convert_targets`` of the source,
``convert_into`` of the target), found through the registry: nothing here names an engine.
"""

from __future__ import annotations

from pathlib import Path

from autotune_cache.errors import UsageError
from autotune_cache.registry import get_layout, layouts
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.records import CacheEntry


def convert_choices() -> tuple[str, ...]:
    """The layouts ``convert --layout`` offers: those that take conversions, and those that
    explain why they do not (so the user reads why rather than "not a choice")."""
    return tuple(name for name, layout in layouts().items() if layout.accepts_conversion or layout.conversion_refusal)


def conversion_target(target: str) -> CacheLayout:
    """The layout named ``target`` if entries convert into it; a usage error saying why not."""
    into = get_layout(target)
    if not into.accepts_conversion:
        raise UsageError(into.conversion_refusal or f"cannot convert to {target!r}; converts to: "
                         + ", ".join(n for n in convert_choices() if get_layout(n).accepts_conversion))
    return into


def convert_entry(entry: CacheEntry, target: str, to_root: Path):
    """Write one complete entry into the ``target`` layout under ``to_root``: (result, values)."""
    return conversion_target(target).convert_into(entry, to_root)


def converts_to(entry: CacheEntry, target: str) -> bool:
    """Whether ``entry``'s layout writes its tactics into ``target``."""
    return target in get_layout(entry.layout).convert_targets
