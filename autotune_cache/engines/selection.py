"""Which trees one ``warm`` writes, and which engine tunes for each: ``--layout sglang,flashinfer-v2,vllm``.

Each engine that plans tunes its own calls (vLLM's differ from SGLang's in their keys), into one
of its layouts; an engine that does not plan (FlashInfer's managed store) is written from the
entry of the engine it names (``Engine.written_from``). Asked of the registry, never by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune_cache import registry
from autotune_cache.engines.base import Engine
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


def warm_layouts() -> list[str]:
    """Every layout a warm can write."""
    return [layout.name for engine in registry.engines() if engine.plans or engine.written_from
            for layout in engine.layouts]


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
            source = registry.get_engine(engine.written_from)
            if source.name not in by_engine:
                raise UsageError(f"--layout {names[0]} is written from the {source.name} tuning: "
                                 f"--layout {source.layouts[0].name},{names[0]}")
            derived.setdefault(source.name, []).extend(names)
    return [WarmGroup(g.engine, g.layout, tuple(derived.get(g.engine.name, ()))) for g in groups]
