"""What every engine answers, in the manner of platformdirs' ``PlatformDirsABC``.

An *engine* is a program that loads FlashInfer autotune caches at startup (SGLang, vLLM, or
FlashInfer's own managed store that either may read). Everything fi-autotune does that depends
on which engine - where its tree lives and how it is laid out, which key names an entry, what
its startup pass tunes, what the command line offers for it - is answered by its engine object,
found by name in ``autotune_cache.registry``. The planner and the CLI never compare engine or
layout names: they ask.

One module (or small package) per engine under ``engines/``; one line in the registry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from autotune_cache.errors import UsageError

if TYPE_CHECKING:
    from autotune_cache.plan.request import TuneRequest
    from autotune_cache.plan.tuning import TuningPlan
    from autotune_cache.tree.layout import CacheLayout


@dataclass(frozen=True)
class EngineTarget:
    """Which engine a request is for, the tree layout it writes, and that engine's own options.

    Engines with options of their own (vLLM's config hash) subclass it; ``to_dict`` /
    ``Engine.target_from_dict`` carry it through a manifest and back.
    """

    engine: str
    layout: str

    def to_dict(self) -> dict:
        return {"engine": self.engine, "layout": self.layout}


class Engine(ABC):
    #: Registry name (``registry.KNOWN_ENGINES``).
    name: ClassVar[str]
    #: For messages: which engine, which version's behaviour fi-autotune reproduces.
    title: ClassVar[str]
    #: Whether fi-autotune plans and tunes for this engine (FlashInfer's managed store is only
    #: ever written from another engine's tuned entry).
    plans: ClassVar[bool] = True

    @property
    @abstractmethod
    def layouts(self) -> "tuple[CacheLayout, ...]":
        """The trees this engine reads, the default first."""

    def layout(self, name: str | None = None) -> "CacheLayout":
        if name is None:
            return self.layouts[0]
        for layout in self.layouts:
            if layout.name == name:
                return layout
        raise UsageError(f"{self.title} has no layout {name!r}; it has: {', '.join(x.name for x in self.layouts)}")

    def target(self, layout: str | None = None, options: dict | None = None) -> EngineTarget:
        """The request's engine part for ``layout``, from the engine's own command-line options
        (``options``: name -> value, ``None`` where the user gave none)."""
        given = {k: v for k, v in (options or {}).items() if v is not None}
        if given:
            raise UsageError(f"{', '.join('--' + k.replace('_', '-') for k in sorted(given))} "
                             f"{'does' if len(given) == 1 else 'do'} not apply to {self.title}")
        return EngineTarget(self.name, self.layout(layout).name)

    def target_from_dict(self, d: dict) -> EngineTarget:
        """Raises ValueError for a record this version cannot read."""
        return EngineTarget(self.name, self.layout(d.get("layout")).name)

    def workers(self, request: "TuneRequest") -> "list[TuneRequest]":
        """The request once per engine process that tunes into an entry of its own."""
        return [request]

    def plan(self, request: "TuneRequest", cache_root: Path) -> "TuningPlan":
        raise UsageError(f"fi-autotune does not plan for {self.title}; it writes it from another engine's entry")

    def describe_files(self, count: int) -> str:
        """What ``count`` data files of an entry are, for summaries (``8 rank files``)."""
        return f"{count} rank file{'s' if count != 1 else ''}"
