"""What a user asks fi-autotune to tune: typed from the command line to the worker boundary.

A ``TuneRequest`` is what ``plan``, ``warm`` and ``verify`` share, what ``warm`` records in each
manifest (so ``verify KEY`` rebuilds the same plan after an option is renamed), and nothing
else: the plan derives everything from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from autotune_cache import registry
from autotune_cache.autotuner.lookup_keys import unrecorded_release_note
from autotune_cache.errors import UsageError
from autotune_cache.plan.engine_target import EngineTarget
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.entry_key import DEFAULT_SCHEMA

REQUEST_FORMAT = 1


def _worker(value: object) -> str:
    if value not in ("target", "draft"):
        raise ValueError(f"request.worker {value!r} is not target or draft")
    return str(value)


def _engine_target(d: dict) -> EngineTarget:
    """The engine part of a recorded request: under the engine's own name (``"vllm": {...}``);
    none for the default engine (every request recorded before engines had names)."""
    for engine in registry.engines():
        if d.get(engine.name) is not None:
            return engine.target_from_dict(d[engine.name])
    return registry.default_engine().target()


@dataclass(frozen=True)
class TuneRequest:
    model: str  # where the config comes from: hub id, preset name, or local model directory
    flags: ServerFlags
    arch: str | None = None  # target arch; None: this machine's GPU
    config: str | None = None  # a config.json (or directory) to use instead of looking ``model`` up
    revision: str | None = None
    schema: str = DEFAULT_SCHEMA
    flashinfer_version: str | None = None  # None: the installed flashinfer-python
    max_tokens: int | None = None
    model_path: str | None = None  # the server's --model-path, hashed into the key; None: ``model``
    #: Where ``schema`` came from (``--engine sglang==0.5.20``, the installed sglang...), for messages.
    schema_source: str = field(default="", compare=False)
    #: The engine (and its tree layout and own options) the entry is for; ``schema`` applies to
    #: SGLang's only.
    engine: EngineTarget = field(default_factory=lambda: registry.default_engine().target())
    #: "target", or "draft": the speculative draft worker of the same serving command, which
    #: SGLang tunes into an entry of its own (key ``...|draft_quant=<quant>``).
    worker: str = "target"
    #: The engine release that will serve (``Engine.serving_release``), for its FlashInfer pin;
    #: None where unknown (a request read back from a manifest, a layout of no engine).
    engine_release: str | None = field(default=None, compare=False)

    def workers(self) -> list["TuneRequest"]:
        """This request per engine process that tunes into an entry of its own (SGLang: the
        target, and with speculative decoding the draft worker too)."""
        return registry.get_engine(self.engine.name).workers(self)

    @property
    def served_path(self) -> str:
        return self.model_path if self.model_path is not None else self.model

    def with_arch(self, arch: str) -> "TuneRequest":
        return replace(self, arch=arch)

    def for_target(self, fingerprint) -> "TuneRequest":
        """Fill what the user left open from the serving image's fingerprint (``--env-from``):
        its GPU arch, and its FlashInfer version - the version the engine puts in the path,
        whatever FlashInfer this machine has, if any."""
        if fingerprint is None:
            return self
        if self.arch and fingerprint.arch and self.arch != fingerprint.arch:  # a gate would check another tree
            raise UsageError(f"--arch {self.arch} here, but {fingerprint.source} says the serving GPU is "
                             f"{fingerprint.arch}: drop --arch, or give the serving image's env.json")
        version = fingerprint.fields.get("flashinfer_version")
        return replace(
            self,
            arch=self.arch or fingerprint.arch,
            flashinfer_version=self.flashinfer_version or (version if isinstance(version, str) and version not in ("unknown", "None") else None),
        )

    def plan(self, cache_root: Path):
        """The tuning plan, by this request's engine (CPU only, no GPU)."""
        if self.arch is None:
            raise ValueError("a plan needs a target arch")
        engine = registry.get_engine(self.engine.name)
        plan = engine.plan(self, cache_root)
        guessed = self.flashinfer_version is None  # the FlashInfer installed here, not one chosen
        warnings = (unrecorded_release_note(plan.flashinfer_version),
                    engine.pin_note(self.engine_release, plan.flashinfer_version) if guessed and plan.autotunes else None)
        warnings = tuple(n for n in warnings if n)
        return replace(plan, version_warnings=warnings) if warnings else plan

    def to_dict(self) -> dict:
        return {
            "format": REQUEST_FORMAT,
            "model": self.model,
            "model_path": self.model_path,
            "config": self.config,
            "revision": self.revision,
            "arch": self.arch,
            "schema": self.schema,
            "flashinfer_version": self.flashinfer_version,
            "max_tokens": self.max_tokens,
            "flags": self.flags.to_dict(),
            **self.engine.record(),
            **({"worker": self.worker} if self.worker != "target" else {}),
        }

    @classmethod
    def from_dict(cls, d: object) -> "TuneRequest":
        """Raises ValueError for a request this version cannot replay exactly."""
        if not isinstance(d, dict):
            raise ValueError("request is not an object")
        fmt = d.get("format")
        if not isinstance(fmt, int) or fmt > REQUEST_FORMAT:
            raise ValueError(f"request format {fmt!r} is not one this fi-autotune reads ({REQUEST_FORMAT})")
        if not isinstance(d.get("model"), str):
            raise ValueError("request.model is not a string")
        for name in ("model_path", "config", "revision", "arch", "flashinfer_version"):
            if not isinstance(d.get(name), (str, type(None))):
                raise ValueError(f"request.{name} is not a string or null")
        if not isinstance(d.get("max_tokens"), (int, type(None))):
            raise ValueError("request.max_tokens is not an integer or null")
        return cls(
            model=d["model"], flags=ServerFlags.from_dict(d.get("flags") or {}), arch=d.get("arch"),
            config=d.get("config"), revision=d.get("revision"), schema=str(d.get("schema") or DEFAULT_SCHEMA),
            flashinfer_version=d.get("flashinfer_version"), max_tokens=d.get("max_tokens"),
            model_path=d.get("model_path"),
            engine=_engine_target(d),
            worker=_worker(d.get("worker", "target")),
        )

    @classmethod
    def from_plan_args(cls, args: dict) -> "TuneRequest":
        """Format-1 manifests kept the raw command-line keywords (``extra.plan_args``)."""
        def split(v) -> tuple[str, ...]:
            return tuple(sorted({s.strip() for s in str(v or "").split(",") if s.strip()}))

        quant = args.get("quantization")
        flags = ServerFlags(
            tp=int(args.get("tp", 1)), pp=int(args.get("pp", 1)), dp=int(args.get("dp", 1)),
            dp_attention=not args.get("no_dp_attention", False), ep=int(args.get("ep", 1)),
            dtype=str(args.get("dtype") or "auto"), quantization=None if quant in (None, "", "None") else str(quant),
            moe_runner_backend=str(args.get("moe_runner_backend") or "auto"), skip_ops=split(args.get("skip_ops")),
            max_running_requests=args.get("max_running_requests"), cuda_graph_max_bs=args.get("cuda_graph_max_bs"),
            chunked_prefill_size=args.get("chunked_prefill_size"), autotune_extend=bool(args.get("autotune_extend")),
        )
        return cls(model=str(args["model"]), flags=flags, arch=args.get("arch"), config=args.get("config_path"),
                   revision=args.get("revision"), schema=str(args.get("schema") or DEFAULT_SCHEMA),
                   flashinfer_version=args.get("flashinfer_version"), max_tokens=args.get("max_tokens"))
