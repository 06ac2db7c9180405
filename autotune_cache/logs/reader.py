"""A startup log, line by line, into events: who printed what (engine, server, rank), and when.

Logs arrive as users have them: one file per rank, or a ``kubectl logs``/``docker logs`` dump
with every rank of a server interleaved, each line maybe behind a collector's own prefix
(``[pod/sglang-0/server] ``, an RFC 3339 timestamp, ``sglang-1  | ``). The engine's own prefix is
found wherever it starts on the line; what stands before it (less a leading timestamp) names the
server. tqdm redraws a bar with ``\\r``: each redraw is read, the last one of a bar counts; a bar
cut short or garbled (no whole redraw of it on the line) is still a bar: the pass tuned.
Lines no engine source shows are skipped, never interpreted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from autotune_cache.logs.dialect import LogDialect
from autotune_cache.logs.formats import dialects, match_message
from autotune_cache.logs.library import BAR_START as _BAR_START, LIBRARY, TQDM_BAR, seconds

#: A collector's timestamp before the engine's line (``kubectl logs --timestamps``, ``docker logs -t``),
#: with the whitespace around it. The lookbehind starts a match only where a whitespace run starts:
#: ``sub`` tries every position, and a bare ``\s*`` would rescan a run from each of its characters.
_OUTER_TS = re.compile(r"(?<!\s)\s*\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s*")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class Event:
    """One recognised line. ``rank`` is None where the line carries none (FlashInfer's own
    handler, tqdm); ``fields`` are the format's named groups."""

    source: str  # the log file ("-" for stdin) and line number, for messages
    server: str  # the file, or the collector's prefix that names the pod/container
    engine: str  # whose prefix the line has: a dialect's name (tqdm's bars: FlashInfer's)
    rank: str | None
    ts: str | None
    kind: str
    fields: dict = field(default_factory=dict)


@dataclass
class LogText:
    """What one log held: its events, and whether it looks cut short (no final newline in the
    middle of a bar, or a bar that stopped before its total)."""

    name: str
    events: list[Event] = field(default_factory=list)
    lines: int = 0
    ends_mid_line: bool = False


def _server_of(name: str, outer: str) -> str:
    outer = _OUTER_TS.sub(" ", outer).strip().rstrip("|").strip()
    return outer or name


def _bar_event(name: str, where: str, outer: str, m: re.Match) -> Event:
    fields = {"op": m["op"], "n": int(m["n"]), "total": int(m["total"]), "seconds": seconds(m["elapsed"]),
              "rate": m["rate"].strip()}
    return Event(where, _server_of(name, outer), LIBRARY.name, None, None, "tuner.bar", fields)


def _bars(name: str, where: str, text: str, outer: str) -> list[Event]:
    """The bars of a line: tqdm's redraws, the last one of each op wins. A bar cut short (after
    its percentage, by a kill, by another process writing into it) or garbled still shows tuning:
    its start with no whole bar is a ``tuner.bar_cut`` of its op, unless a whole bar of that
    op was read on the line."""
    whole: dict[str, Event] = {}
    cut: dict[str, Event] = {}
    for segment in text.split("\r"):
        spans = []
        for m in TQDM_BAR.finditer(segment):
            whole[m["op"]] = _bar_event(name, where, outer, m)
            spans.append(m.start())
        for m in _BAR_START.finditer(segment):
            if m.start() not in spans:
                op = m["op"].rstrip(":") or "?"
                cut[op] = Event(where, _server_of(name, outer), LIBRARY.name, None, None, "tuner.bar_cut", {"op": op})
    return [*whole.values(), *(e for op, e in cut.items() if op not in whole)]


def _line_events(name: str, lineno: int, text: str, known: tuple[LogDialect, ...]) -> list[Event]:
    where = f"{name}:{lineno}"
    events: list[Event] = []
    starts = list(_BAR_START.finditer(text))
    collector = None
    if starts:  # a collector's prefix stands before the first bar and its first \r
        collector = text[: starts[0].start()].split("\r")[0]
        events = _bars(name, where, text, collector)
        text = text[starts[-1].end():]  # an engine line may follow the last bar on the same line
    # the last redraw of a \r-rewritten line; vLLM's NewLineFormatter ends each line of a
    # multi-line message in "\r" ("\r\n" + the prefix): that line is read, not dropped
    text = text.rstrip("\r").rsplit("\r", 1)[-1]
    for dialect in known:
        m = dialect.prefix.search(text)
        if m is None:
            continue
        server = _server_of(name, text[: m.start()] if collector is None else collector)
        found = match_message(dialect, text[m.end():])
        kind, fields = found if found is not None else ("other", {})
        return [*events, Event(where, server, dialect.name, dialect.rank_of(m), m["ts"], kind, fields)]
    return events


def read_log(name: str, data: str) -> LogText:
    """Every recognised line of one log (its text already decoded)."""
    out = LogText(name)
    data = _ANSI.sub("", data)
    out.ends_mid_line = bool(data) and not data.endswith("\n")
    lines = data.split("\n")
    out.lines = len(lines) - (0 if out.ends_mid_line else 1)
    known = dialects()
    for i, line in enumerate(lines, 1):
        out.events.extend(_line_events(name, i, line, known))
    return out
