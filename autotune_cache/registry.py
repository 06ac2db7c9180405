"""The engines fi-autotune knows, by name: the one place that lists them.

In the manner of fsspec's ``known_implementations``: each engine is named here by the import
path of its object (``"package.module:ATTRIBUTE"``), imported the first time someone asks for
it. The registry therefore sits on the lowest floor of the package - it imports no engine - and
everything above (the tree scanner, the planner, the CLI) asks it for an engine or a layout
instead of comparing names. Adding an engine is one module (a ``plan.engine.Engine``) plus one
line below, or ``register_engine`` at run time (what the tests' stand-in engine does).
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from autotune_cache.errors import UsageError


class KnownLayout(Protocol):
    """What the registry reads of a layout (a ``tree.layouts.base.CacheLayout``)."""

    name: str


class KnownEngine(Protocol):
    """What the registry reads of an engine (a ``plan.engine.Engine``, which this floor does
    not import: the engines sit above everything that asks the registry)."""

    name: str
    layouts: tuple[Any, ...]  # KnownLayout objects

#: name -> "module:attribute" of the engine object. The first is the default engine.
KNOWN_ENGINES: dict[str, str] = {
    "sglang": "autotune_cache.engines.sglang.engine:ENGINE",
    "vllm": "autotune_cache.engines.vllm.engine:ENGINE",
}
_BUILTIN_ENGINES = dict(KNOWN_ENGINES)

#: layout name -> (its engine, "module:attribute" of the layout object that engine hands out: the
#: same object, tests/engines/test_engine_seam.py holds the two tables together). The tree commands
#: (``ls``, ``show``, ``rm``, ``prune``, ``export``, ``import``) need layouts only: named here, a layout
#: is imported without its engine's planner. The first is the default layout (the default engine's
#: first). A layout of no engine (None): FlashInfer's own managed store, which no engine tunes for -
#: it is written from an engine's tuned entry (``CacheLayout.convert_targets``) and read by any
#: engine that enters ``autotune_v2``.
KNOWN_LAYOUTS: dict[str, tuple[str | None, str]] = {
    "sglang": ("sglang", "autotune_cache.engines.sglang.layout:LAYOUT"),
    "flashinfer-v2": (None, "autotune_cache.tree.layout_kinds.flashinfer_v2.layout:LAYOUT"),
    "vllm": ("vllm", "autotune_cache.engines.vllm.layout:LAYOUT"),
    "vllm-dir": ("vllm", "autotune_cache.engines.vllm.layout:DIR_LAYOUT"),
}

#: engine name -> "module:attribute" of its startup log's dialect (``logs.dialect.LogDialect``), the
#: same object as the engine's ``log_dialect``: ``doctor`` reads logs without the planners.
KNOWN_LOG_DIALECTS: dict[str, str] = {
    "sglang": "autotune_cache.engines.sglang.log_lines:DIALECT",
    "vllm": "autotune_cache.engines.vllm.log_lines:DIALECT",
}

_loaded: dict[str, KnownEngine] = {}
#: ``get_layout``'s answers so far (``ls`` asks three times per entry); emptied by any (un)registering.
_by_name: dict[str, KnownLayout] = {}


def register_engine(name: str, target: str | KnownEngine, *, clobber: bool = False) -> None:
    """Add an engine by import path or object. A name already taken needs ``clobber``."""
    if not clobber and (name in KNOWN_ENGINES or name in _loaded):
        raise ValueError(f"engine {name!r} is already registered")
    _loaded.pop(name, None)
    _by_name.clear()
    if isinstance(target, str):
        KNOWN_ENGINES[name] = target
    else:
        KNOWN_ENGINES[name] = f"<object {type(target).__name__}>"
        _loaded[name] = target


def unregister_engine(name: str) -> None:
    KNOWN_ENGINES.pop(name, None)
    _loaded.pop(name, None)
    _by_name.clear()


def get_engine(name: str) -> KnownEngine:
    if name in _loaded:
        return _loaded[name]
    try:
        path = KNOWN_ENGINES[name]
    except KeyError:
        raise UsageError(f"unknown engine {name!r}; known: {', '.join(KNOWN_ENGINES)}") from None
    engine = _import(path)
    if engine.name != name:
        raise RuntimeError(f"{path} is engine {engine.name!r}, registered as {name!r}")
    _loaded[name] = engine
    return engine


def engines() -> list[KnownEngine]:
    """Every known engine, in registration order."""
    return [get_engine(name) for name in list(KNOWN_ENGINES)]


def _import(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _static_engines() -> set[str]:
    """The engines whose layouts ``KNOWN_LAYOUTS`` names: those registered by this module's table,
    not at run time (``register_engine``: their layouts are read from the engine object)."""
    return {n for n, path in KNOWN_ENGINES.items() if path == _BUILTIN_ENGINES.get(n)}


def layouts() -> dict[str, KnownLayout]:
    """Every tree layout of every engine, by layout name (a name is unique across engines). The
    built-in ones are imported by name (no planner comes with them); an engine registered at run
    time adds its own."""
    out: dict[str, KnownLayout] = {}
    static = _static_engines()
    for name, (engine_name, path) in KNOWN_LAYOUTS.items():
        if engine_name is not None and engine_name not in static:  # replaced or removed at run time
            continue
        layout = _by_name.get(name) or _import(path)
        if layout.name != name:
            raise RuntimeError(f"{path} is layout {layout.name!r}, registered as {name!r}")
        out[name] = _by_name.setdefault(name, layout)
    for engine_name in KNOWN_ENGINES:
        if engine_name in static:
            continue
        for layout in get_engine(engine_name).layouts:
            if layout.name in out:
                raise RuntimeError(f"layout {layout.name!r} is claimed by two engines")
            out[layout.name] = layout
    return out


def log_dialects() -> list[Any]:
    """Every engine's startup-log dialect, in registration order (engines without a log of their
    own have none). Built-in ones are imported by name; an engine registered at run time hands
    its own ``log_dialect``."""
    static = _static_engines()
    out = []
    for name in KNOWN_ENGINES:
        if name in static:
            dialect = _import(KNOWN_LOG_DIALECTS[name]) if name in KNOWN_LOG_DIALECTS else None
        else:
            dialect = getattr(get_engine(name), "log_dialect", None)
        if dialect is not None:
            out.append(dialect)
    return out


def get_layout(name: str) -> KnownLayout:
    layout = _by_name.get(name)
    if layout is not None:
        return layout
    known = layouts()
    try:
        layout = known[name]
    except KeyError:
        raise UsageError(f"unknown layout {name!r}; known: {', '.join(sorted(known))}") from None
    _by_name[name] = layout
    return layout


def key_schemas() -> dict[str, Any]:
    """Every engine's key schemas (``Engine.key_schemas``) by name; a name is unique across engines."""
    out: dict[str, Any] = {}
    for engine in engines():
        for name, schema in getattr(engine, "key_schemas", {}).items():
            if name in out:
                raise RuntimeError(f"key schema {name!r} is claimed by two engines")
            out[name] = schema
    return out


def default_engine() -> KnownEngine:
    return get_engine(next(iter(KNOWN_ENGINES)))


def default_layout() -> KnownLayout:
    """The layout a bare id (``<version>/<arch>/<key>``) and ``--cache-dir`` refer to: the default
    engine's first, which ``KNOWN_LAYOUTS`` lists first (imported without the engine)."""
    first = next(iter(KNOWN_ENGINES))
    if first in _static_engines():
        return get_layout(next(name for name, (engine, _) in KNOWN_LAYOUTS.items() if engine == first))
    return default_engine().layouts[0]


def engine_name_of_layout(name: str) -> str | None:
    """The registry name of the engine a layout is of (a built-in one's without importing its
    planner); None for a layout no engine registers."""
    static = _static_engines()
    if name in KNOWN_LAYOUTS and (KNOWN_LAYOUTS[name][0] is None or KNOWN_LAYOUTS[name][0] in static):
        return KNOWN_LAYOUTS[name][0]
    for engine_name in KNOWN_ENGINES:
        if engine_name not in static and any(lay.name == name for lay in get_engine(engine_name).layouts):
            return engine_name
    return None


def engine_of_layout(name: str) -> KnownEngine | None:
    """The engine whose tree a layout is; None for a layout of no engine (FlashInfer's managed
    store). An unknown layout is a usage error."""
    for engine in engines():
        if any(layout.name == name for layout in engine.layouts):
            return engine
    if name in layouts():
        return None
    raise UsageError(f"unknown layout {name!r}; known: {', '.join(sorted(layouts()))}")
