"""From the serving options a user gave to the typed request every command shares.

The options are spelled as SGLang's flags whatever the engine (vLLM's topology and backend
fields read the same); the engine of the layout asked for checks their values
(``Engine.check_option_values``: vLLM's as the default engine, SGLang, checks them) and adds its
own part (``Engine.target``).
"""

from __future__ import annotations

from typing import Callable

from autotune_cache import registry
from autotune_cache.errors import UsageError
from autotune_cache.plan.engine import Engine, ServingCommandReading
from autotune_cache.plan.launcher import split_command
from autotune_cache.plan.options import ServingOptions
from autotune_cache.plan.request import TuneRequest
from autotune_cache.plan.topology import TopologyError, normalize_gpu_uuid


def gpu_uuids_of(value: str | tuple | None, detect: Callable[[], list[str]] | None) -> tuple[str, ...]:
    """``--gpu-uuids``: a list, or ``auto``: this machine's GPUs in index order (``detect``)."""
    if not value:
        return ()
    if isinstance(value, tuple):
        return value
    if value == "auto":
        uuids = detect() if detect is not None else []
        if not uuids:
            raise UsageError("--gpu-uuids auto: no GPU found here (give the serving machine's UUIDs)")
        return tuple(uuids)
    try:
        return tuple(normalize_gpu_uuid(u) for u in value.split(",") if u.strip())
    except TopologyError as e:
        raise UsageError(f"--gpu-uuids: {e}") from None


def build_request(options: ServingOptions, *, layout: str | None = None, engine_options: dict | None = None,
                  detect_gpu_uuids: Callable[[], list[str]] | None = None) -> TuneRequest:
    """The request for ``options``, for the engine whose tree ``layout`` is (default, and for a layout
    of no engine - FlashInfer's managed store, written from the default engine's calls: the
    default engine's); ``engine_options``: that engine's own options (name -> value or None)."""
    engine = registry.engine_of_layout(layout) if layout else None
    serves = engine is not None or layout is None  # a layout of no engine: no engine release serves it
    if engine is None:
        engine, layout = registry.default_engine(), None
    engine.check_option_values(options.__dict__)
    model = options.model or options.model_path
    if model is None:
        raise UsageError("give --model (a hub id, preset or local model directory), or --model-path with --config")
    schema, schema_source = registry.default_engine().pick_schema(options.schema, options.engine)
    return TuneRequest(
        model=model, flags=options.flags(gpu_uuids_of(options.gpu_uuids, detect_gpu_uuids)),
        schema_source=schema_source, arch=options.arch.lower() if options.arch else None,
        config=options.config_path, revision=options.revision, schema=schema,
        flashinfer_version=options.flashinfer_version, max_tokens=options.max_tokens, model_path=options.model_path,
        engine=engine.target(layout, engine_options),
        # --schema names a key schema, not a release (and overrides --engine): which release serves is unknown
        engine_release=engine.serving_release(options.engine) if serves and not options.schema else None,
    )


def build_requests(options: ServingOptions, layouts: list[str], engine_options: dict | None = None,
                   detect_gpu_uuids: Callable[[], list[str]] | None = None) -> list[TuneRequest]:
    """One request per layout (each of another engine), each engine given its own options only;
    an option no engine of ``layouts`` takes is refused as ``build_request`` refuses it."""
    given = {k: v for k, v in (engine_options or {}).items() if v is not None}
    engines = [registry.engine_of_layout(x) or registry.default_engine() for x in layouts]
    taken = {o.name for e in engines for o in e.cli_options}
    engines[0].refuse_foreign_options({k: v for k, v in given.items() if k not in taken})
    return [build_request(options, layout=x, detect_gpu_uuids=detect_gpu_uuids,
                          engine_options={k: v for k, v in given.items() if k in {o.name for o in e.cli_options}})
            for x, e in zip(layouts, engines)]


def read_serving_command(argv: "list[str] | tuple[str, ...]", layout: str | None = None
                         ) -> tuple[Engine, ServingCommandReading]:
    """A pasted serving command, read by the engine whose program starts it (``Engine.programs``:
    ``vllm serve ...`` is vLLM's, ``python -m sglang.launch_server ...`` SGLang's); flags alone,
    with no program, are the engine of ``layout`` (the one asked for), else the default engine's.
    Any other program is refused, naming those read."""
    cmd = split_command(argv)
    if cmd.program is None:
        owner = registry.engine_of_layout(layout) if layout else None
        engine = owner or registry.default_engine()
    else:
        engine = next((e for e in registry.engines() if cmd.program in e.programs), None)
        if engine is None:
            known = [f"{p} ({e.label})" for e in registry.engines() for p in e.programs]
            raise UsageError(f"serving command: {' '.join(cmd.launcher)!r} starts no server fi-autotune reads; "
                             f"expected {', '.join(known)}, or the flags alone (read as "
                             f"{registry.default_engine().label}'s)")
    return engine, engine.parse_serving_command(argv)
