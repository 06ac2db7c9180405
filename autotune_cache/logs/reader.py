"""A startup log, line by line, into events: who printed what (engine, server, rank), and when.

Logs arrive as users have them: one file per rank, or a ``kubectl logs``/``docker logs`` dump
with every rank of a server interleaved, each line maybe behind a collector's own prefix
(``[pod/sglang-0/server] ``, an RFC 3339 timestamp, ``sglang-1  | ``). The engine's own prefix is
found wherever it starts on the line; what stands before it (less a leading timestamp) names the
server. tqdm redraws a bar with ``\\r``: each redraw is read, the last one of a bar counts.
Lines no engine source shows are skipped, never interpreted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from autotune_cache.logs.formats import PREFIXES, TQDM_BAR, match_message, seconds

#: A collector's timestamp before the engine's line (``kubectl logs --timestamps``, ``docker logs -t``).
_OUTER_TS = re.compile(r"\s*\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s*")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class Event:
    """One recognised line. ``rank`` is None where the line carries none (FlashInfer's own
    handler, tqdm); ``fields`` are the format's named groups."""

    source: str  # the log file ("-" for stdin) and line number, for messages
    server: str  # the file, or the collector's prefix that names the pod/container
    engine: str  # whose prefix the line has: "sglang", "vllm", "flashinfer" (tqdm: "flashinfer")
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


def _rank_of(engine: str, m: re.Match) -> str | None:
    if engine == "sglang":
        return m["rank"].strip() or "-"  # a scheduler without a prefix: one rank (tp 1)
    if engine == "vllm":
        return m["proc"]
    return None


def _bar_event(name: str, where: str, outer: str, m: re.Match) -> Event:
    fields = {"op": m["op"], "n": int(m["n"]), "total": int(m["total"]), "seconds": seconds(m["elapsed"]),
              "rate": m["rate"].strip()}
    return Event(where, _server_of(name, outer), "flashinfer", None, None, "flashinfer.bar", fields)


def _line_events(name: str, lineno: int, text: str) -> list[Event]:
    where = f"{name}:{lineno}"
    bars = []
    first = TQDM_BAR.search(text)
    outer = text[: first.start()].split("\r")[0] if first else ""  # a collector's prefix stands before the first \r
    for segment in text.split("\r"):  # tqdm's redraws; the last one wins, per bar
        bars.extend(_bar_event(name, where, outer, m) for m in TQDM_BAR.finditer(segment))
    if bars:
        last: dict[str, Event] = {}
        for b in bars:
            last[b.fields["op"]] = b
        return list(last.values())
    text = text.rsplit("\r", 1)[-1]
    for engine, _source, prefix in PREFIXES:
        m = prefix.search(text)
        if m is None:
            continue
        found = match_message(engine, text[m.end():])
        if found is None:
            return [Event(where, _server_of(name, text[: m.start()]), engine, _rank_of(engine, m), m["ts"], "other")]
        kind, fields = found
        return [Event(where, _server_of(name, text[: m.start()]), engine, _rank_of(engine, m), m["ts"], kind, fields)]
    return []


def read_log(name: str, data: str) -> LogText:
    """Every recognised line of one log (its text already decoded)."""
    out = LogText(name)
    data = _ANSI.sub("", data)
    out.ends_mid_line = bool(data) and not data.endswith("\n")
    lines = data.split("\n")
    out.lines = len(lines) - (0 if out.ends_mid_line else 1)
    for i, line in enumerate(lines, 1):
        out.events.extend(_line_events(name, i, line))
    return out
