"""Which trees one ``warm`` writes, and which engine tunes for each: ``--layout sglang,flashinfer-v2,vllm``.

Each engine that plans tunes its own calls (vLLM's differ from SGLang's in their keys), into one
of its layouts; a layout of an engine that does not plan (FlashInfer's managed store) is written
from a tuned entry whose layout converts into it (``CacheLayout.convert_targets``). Asked of the
registry, never by name.
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
    """The layouts of planning engines whose entries convert into the layout ``name``."""
    return [x.name for e in registry.engines() if e.plans for x in e.layouts if name in x.convert_targets]


def warm_layouts() -> list[str]:
    """Every layout a warm can write: the planning engines', and those written from them."""
    return [layout.name for engine in registry.engines() for layout in engine.layouts
            if engine.plans or _sources(layout.name)]


def warm_groups(text: str) -> list[WarmGroup]:
    """``--layout`` of warm, checked: one group per engine that tunes, the default engine's first."""
    wanted = [x.strip() for x in text.split(",") if x.strip()]
    known = warm_layouts()
    if not wanted or any(x not in known for x in wanted):
        raise UsageError(f"--layout {text!r}: warm writes {', '.join(known)} (comma-separated)")
    by_engine: dict[str, list[str]] = {}
    for name in wanted:
        by_engine.setdefault(registry.engine_of_layout(name).name, []).append(name)
    groups: list[WarmGroup] = []
    derived: dict[str, list[str]] = {}
    for engine in registry.engines():
        names = by_engine.get(engine.name)
        if not names:
            continue
        if engine.plans:
            if len(names) > 1:
                raise UsageError(f"--layout: {' or '.join(names)} ({engine.label} reads one of them), not both")
            groups.append(WarmGroup(engine, names[0]))
        else:
            for name in names:
                sources = _sources(name)
                chosen = [x for x in wanted if x in sources]
                if not chosen:
                    raise UsageError(f"--layout {name} is written from the {sources[0]} tuning: "
                                     f"--layout {sources[0]},{name}")
                derived.setdefault(chosen[0], []).append(name)
    return [WarmGroup(g.engine, g.layout, tuple(derived.get(g.layout, ()))) for g in groups]
