"""The startup-log lines ``doctor`` reads, gathered: every registered engine's dialect (from its
own package, through the registry), then FlashInfer's own lines, which every engine's log
carries. A line that matches no format here is not interpreted: no format is guessed."""

from __future__ import annotations

from autotune_cache import registry
from autotune_cache.logs.dialect import LogDialect
from autotune_cache.logs.library import LIBRARY


def dialects() -> tuple[LogDialect, ...]:
    """The engines' dialects in registration order, FlashInfer's lines last. Asked of the
    registry each time (an engine registered at run time is seen): a reader holds the answer
    for one log."""
    return (*registry.log_dialects(), LIBRARY)


def dialect_of(name: str | None) -> LogDialect | None:
    """The dialect of an engine (or of FlashInfer's own lines) by name; None for none known."""
    return next((d for d in dialects() if d.name == name), None)


def layout_dialect(layout_name: str) -> LogDialect | None:
    """The dialect of the engine whose tree a layout is (None: an engine with no log of its own)."""
    return engine_dialect(registry.engine_name_of_layout(layout_name))


def engine_dialect(name: str | None) -> LogDialect | None:
    """An engine's dialect, not FlashInfer's own lines (a log of FlashInfer alone names no engine)."""
    d = dialect_of(name)
    return d if d is not LIBRARY else None


def default_dialect() -> LogDialect:
    """The default engine's, for a fix where the log names no engine."""
    return engine_dialect(registry.default_engine().name) or LIBRARY


def understood() -> dict[str, str]:
    """The releases whose formats are read, by name. A log naming another release is still
    read, with a warning: the lines may have changed there."""
    return {d.name: d.release for d in dialects()}


def labels(joined_by: str, *, releases: bool = False) -> str:
    """``SGLang, vLLM or FlashInfer`` (with ``releases``: ``SGLang 0.5.23, ...``): whose lines
    are read, for messages."""
    names = [f"{d.label} {d.release}" if releases else d.label for d in dialects()]
    return ", ".join(names[:-1]) + f" {joined_by} " + names[-1] if len(names) > 1 else names[0]


def match_message(dialect: LogDialect, message: str) -> tuple[str, dict[str, str]] | None:
    """(event, its fields) for a message printed under ``dialect``'s prefix, or None.
    FlashInfer's messages also reach an engine's handlers (root propagation), so an engine line
    is matched against its own formats and FlashInfer's."""
    for fmt in (*dialect.formats, *(LIBRARY.formats if dialect is not LIBRARY else ())):
        if m := fmt.pattern.search(message):
            return fmt.event, m.groupdict()
    return None
