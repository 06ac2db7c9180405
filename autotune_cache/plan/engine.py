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

from abc import ABC
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TYPE_CHECKING, ClassVar

from autotune_cache import registry
from autotune_cache.registry import KnownLayout  # a tree.layout.CacheLayout: the tree sits above this floor
from autotune_cache.errors import UsageError
from autotune_cache.plan.engine_target import EngineTarget
from autotune_cache.plan.entry_key import DEFAULT_SCHEMA, get_schema
from autotune_cache.plan.options import Option

if TYPE_CHECKING:
    from autotune_cache.plan.request import TuneRequest
    from autotune_cache.plan.tuning import TuningPlan


@dataclass(frozen=True)
class ServingCommandReading:
    """A pasted serving command as an engine reads it (``Engine.parse_serving_command``): the
    serving options it sets (``plan.options`` names, plus ``cache_dir``), and what the command
    line says of its other flags."""

    options: dict
    notes: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()  # proven not to reach the autotune path
    not_understood: tuple[str, ...] = ()
    #: The tree the command's server reads (one of the engine's layouts; None: its first).
    layout: str | None = None


class Engine(ABC):
    #: Registry name (``registry.KNOWN_ENGINES``).
    name: ClassVar[str]
    #: For messages: the engine (``SGLang``), and which version's behaviour fi-autotune reproduces.
    label: ClassVar[str]
    title: ClassVar[str]
    #: Whether ``check`` can say if this engine will find an entry (``check --layout``).
    checks: ClassVar[bool] = False
    #: The programs that start this engine's server, as ``plan.launcher.split_command`` normalizes
    #: them (``"vllm serve"``, ``"python -m sglang.launch_server"``): a pasted serving command is
    #: read by the engine whose program it starts with.
    programs: ClassVar[tuple[str, ...]] = ()
    #: Options only this engine's targets take (``plan.options.Option``); the CLI offers them.
    cli_options: ClassVar[tuple[Option, ...]] = ()
    #: The key schemas this engine's releases hash, by name (``plan.entry_key.KeySchema``); all
    #: engines' are found through the registry (``plan.entry_key.key_schemas``).
    key_schemas: ClassVar[dict] = {}
    #: How ``doctor`` reads this engine's startup log (a ``logs.dialect.LogDialect``); None: it
    #: has no log of its own (FlashInfer's managed store). ``registry.log_dialects`` lists them.
    log_dialect: ClassVar[Any] = None

    #: The FlashInfer each release of this engine requires (its wheel's ``Requires-Dist``, recorded
    #: by tests/oracle/engine_pins.py): release -> version. A stock install runs that FlashInfer,
    #: which uses no cache made with another (``pin_note``).
    flashinfer_pins: ClassVar[dict[str, str]] = {}

    def __str__(self) -> str:
        return self.label

    def serving_release(self, engine_option: str | None) -> str | None:
        """The release of this engine that will serve (``--engine``, what is installed here, or
        the release fi-autotune reproduces); None where the engine has no releases to tell apart."""
        return None

    def pin_note(self, release: str | None, version: str) -> str | None:
        """What a plan for FlashInfer ``version`` says when ``release`` of this engine requires
        another: a stock install does not use the cache (another version's path, environment hash
        or file stamp) and tunes at startup. None when they agree (a local build, ``+cu130``, is the same release) or when
        the release's requirement is not recorded."""
        pin = self.flashinfer_pins.get(release or "")
        if pin is None or version.split("+", 1)[0] == pin:
            return None
        return (f"{self.label} {release} requires flashinfer-python=={pin} (its wheel's metadata), and this plan is "
                f"for FlashInfer {version}: a stock install does not use a cache made with another FlashInfer (the "
                "version is in its path or environment hash, and FlashInfer ignores files stamped with another) and "
                f"tunes at startup. Tune with flashinfer-python=={pin} installed; if the serving image has another "
                "FlashInfer, plan for it (--flashinfer-version, or check --env-from its `fi-autotune env --json`)")

    #: The trees this engine reads, the default first.
    layouts: ClassVar["tuple[KnownLayout, ...]"]

    def layout(self, name: str | None = None) -> KnownLayout:
        if name is None:
            return self.layouts[0]
        for layout in self.layouts:
            if layout.name == name:
                return layout
        raise UsageError(f"{self.title} has no layout {name!r}; it has: {', '.join(x.name for x in self.layouts)}")

    def target(self, layout: str | None = None, options: dict | None = None) -> EngineTarget:
        """The request's engine part for ``layout``, from the engine's own command-line options
        (``options``: name -> value, ``None`` where the user gave none)."""
        self.refuse_foreign_options(options)
        return EngineTarget(self.name, self.layout(layout).name)

    def refuse_foreign_options(self, options: dict | None) -> None:
        """An option of another engine's, given for this one, is a usage error naming its layouts."""
        mine = {o.name for o in self.cli_options}
        for name, value in (options or {}).items():
            if value is None or name in mine:
                continue
            owner = next((e for e in registry.engines() if any(o.name == name for o in e.cli_options)), None)
            where = " (or ".join(x.name for x in owner.layouts) + ")" * (len(owner.layouts) - 1) if owner else "?"
            raise UsageError(f"--{name.replace('_', '-')} goes with --layout {where}")

    def parse_serving_command(self, tokens: "list[str] | tuple[str, ...]") -> ServingCommandReading:
        """A pasted serving command (``-- python -m sglang.launch_server ...``), read as this
        engine's parser reads it; a flag it cannot model is a usage error. The serving options
        are spelled as the default engine's flags whatever the engine (``plan.options``), so an
        engine without a reader of its own reads the command as the default engine does."""
        return self._spelling_owner().parse_serving_command(tokens)

    def command_from_logged_args(self, args: dict | None) -> list[str] | None:
        """The serving command whose parse gives ``args``, the arguments the server logged at
        startup (``doctor``'s fix: ``warm -- <that command>``); None where this engine logs none."""
        return None

    def check_option_values(self, values: dict) -> None:
        """Serving option values (``plan.options`` names -> values) the engine's own parser would
        reject are a usage error (a typo such as ``--attention-backend flashinfr``), not a plan
        for a server that cannot start. By default checked as the default engine checks them:
        the options are spelled as its flags."""
        self._spelling_owner().check_option_values(values)

    def _spelling_owner(self) -> "Engine":
        owner = registry.default_engine()
        if owner is self:  # the default engine must answer itself
            raise NotImplementedError(f"{self.title} spells the serving options but reads no serving command")
        return owner  # type: ignore[return-value]

    def target_from_dict(self, d: dict) -> EngineTarget:
        """Raises ValueError for a record this version cannot read."""
        return EngineTarget(self.name, self.layout(d.get("layout")).name)

    def workers(self, request: "TuneRequest") -> "list[TuneRequest]":
        """The request once per engine process that tunes into an entry of its own."""
        return [request]

    def plan_layout(self, request: "TuneRequest") -> KnownLayout:
        """The tree the plan of ``request`` writes, whose root it goes under when no --cache-dir
        is given: the request's layout (a single-rank vLLM: FlashInfer's managed store)."""
        return self.layout(request.engine.layout)

    def plan(self, request: "TuneRequest", cache_root: Path) -> "TuningPlan":
        raise UsageError(f"fi-autotune does not plan for {self.title}; it writes it from another engine's entry")

    def tuning_buckets(self, plan: "TuningPlan") -> "tuple[int, ...] | None":
        """How the engine's startup pass tunes, for ``verify`` to replay it: the buckets of its one
        dummy run at the largest inside ``autotune(tuning_buckets=..., round_up=True)`` (vLLM), or
        None where it runs its own dummy passes at their token counts (SGLang: ``resolution.passes``)."""
        return None

    def existing_entry_refusal(self, manifest, plan: "TuningPlan") -> str | None:
        """Why an entry already at the plan's path must not be taken as this plan's (None: it may)."""
        return None

    def alternatives(self, plan: "TuningPlan") -> list[dict]:
        """Option values to try when ``plan`` would not autotune (``plan`` suggests those under
        which the engine would): the engine's own choices, each tried through its planner."""
        return []

    def pick_schema(self, schema: str | None, release: str | None) -> tuple[str, str]:
        """(key schema, where it came from) for ``--schema`` / ``--engine``: by name (any engine's),
        else the default schema; an engine whose releases hash differently picks by release."""
        if release:
            raise UsageError(f"--engine {release!r}: {self.title} has no releases to choose a key schema by")
        return (get_schema(schema).name, "--schema") if schema else (DEFAULT_SCHEMA, "the default key schema")

    def dp_meaning(self, topology) -> str | None:
        """What the plan's ``dp`` means in this engine's own flags (None: dp is 1, or says itself)."""
        return None

    def describe(self, plan: "TuningPlan") -> list[tuple[str, str]]:
        """Rows (label, text) a printed plan shows for this engine: its startup pass, its key."""
        return [("Key", f"{plan.key}  ({plan.key_string})")]
