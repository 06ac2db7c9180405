"""Which trees one ``warm`` writes, and which engine tunes for each: ``--layout sglang,flashinfer-v2,vllm``.

Each engine tunes its own calls (vLLM's differ from SGLang's in their keys), into one of its
layouts; a layout of no engine (FlashInfer's managed store) is written from a tuned entry whose
layout converts into it (``CacheLayout.convert_targets``). Asked of the registry, never by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune_cache import registry
from autotune_cache.plan.engine import Engine
from autotune_cache.errors import UsageError


@dataclass(frozen=True)
class WarmGroup:
    """One engine's tuning: the layout its entry is written in, and the layouts written from it."""

    engine: Engine
    layout: str
    also: tuple[str, ...] = ()

    @property
    def layouts(self) -> tuple[str, ...]:
        return (self.layout, *self.also)


def _sources(name: str) -> list[str]:
    """The engines' layouts whose entries convert into the layout ``name``."""
    return [x.name for e in registry.engines() for x in e.layouts if name in x.convert_targets]


def warm_layouts() -> list[str]:
    """Every layout a warm can write: the engines', and those written from them."""
    return [name for name in registry.layouts()
            if registry.engine_name_of_layout(name) is not None or _sources(name)]


def warm_groups(text: str) -> list[WarmGroup]:
    """``--layout`` of warm, checked: one group per engine that tunes, the default engine's first."""
    wanted = [x.strip() for x in text.split(",") if x.strip()]
    known = warm_layouts()
    if not wanted or any(x not in known for x in wanted):
        raise UsageError(f"--layout {text!r}: warm writes {', '.join(known)} (comma-separated)")
    groups: list[WarmGroup] = []
    for engine in registry.engines():
        names = [x for x in wanted if registry.engine_name_of_layout(x) == engine.name]
        if len(names) > 1:
            raise UsageError(f"--layout: {' or '.join(names)} ({engine.label} reads one of them), not both")
        if names:
            groups.append(WarmGroup(engine, names[0]))
    derived: dict[str, list[str]] = {}
    for name in (x for x in wanted if registry.engine_name_of_layout(x) is None):
        sources = _sources(name)
        chosen = [x for x in wanted if x in sources]
        if not chosen:
            raise UsageError(f"--layout {name} is written from the {sources[0]} tuning: --layout {sources[0]},{name}")
        derived.setdefault(chosen[0], []).append(name)
    return [WarmGroup(g.engine, g.layout, tuple(derived.get(g.layout, ()))) for g in groups]
