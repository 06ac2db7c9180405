"""The engine part of a request: which engine an entry is for, in which of its tree layouts, with
that engine's own options (vLLM's config hash). Engines with options subclass it
(``engines/vllm/target.py``); the registry's engine object reads it back from a manifest."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineTarget:
    name: str
    layout: str

    def options(self) -> dict:
        """The engine's own options, as recorded (none for an engine without any)."""
        return {}

    def record(self) -> dict:
        """What a manifest's request records for it: the options under the engine's name, or
        nothing for an engine without options (SGLang: every request before engines had names)."""
        return {self.name: self.options()} if self.options() else {}
