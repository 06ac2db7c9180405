"""Human strings for sizes, ages, durations and counts (one place, so every command prints alike)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from autotune_cache.errors import UsageError

_UNITS = ("B", "K", "M", "G", "T", "P")


def format_size(num_bytes: int) -> str:
    """``1.2M`` style, like ``du -h`` and ``hf cache scan``."""
    size = float(num_bytes)
    for unit in _UNITS:
        if size < 1000 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{int(size)}B"
            return f"{size:.1f}{unit}"
        size /= 1000
    raise AssertionError("unreachable")


def format_age(timestamp: float | None, now: float | None = None) -> str:
    """``3d ago``; ``unknown`` when the time cannot be known (never a made-up one)."""
    if timestamp is None or timestamp <= 0:
        return "unknown"
    delta = max(0.0, (now if now is not None else time.time()) - timestamp)
    for unit, seconds in (("y", 365 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= seconds:
            return f"{int(delta // seconds)}{unit} ago"
    return f"{int(delta)}s ago"


def shorten(text: str, width: int = 200) -> str:
    """``text`` whole when it fits, else cut at the last space before ``width`` and marked with
    ``...`` (a hard cut only for one unbroken run, such as a hostile 9,000-character key): a
    reason cut mid-word ("the nearest entry, 0.") reads as a different reason."""
    if len(text) <= width:
        return text
    cut = text.rfind(" ", 0, width - 3)
    return (text[:cut] if cut > width // 2 else text[:width - 3]).rstrip() + "..."


def plural(n: int, singular: str, plural_form: str | None = None) -> str:
    """``1 entry``, ``2 entries``, ``1 temp file``."""
    return f"{n} {singular if n == 1 else (plural_form or singular + 's')}"


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*\Z")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_ACCEPTED = "s (seconds), m (minutes), h (hours), d (days) or w (weeks)"


@dataclass(frozen=True)
class Duration:
    """A span the user typed: seconds for the code, the user's own text for messages."""

    seconds: float
    text: str

    def __str__(self) -> str:
        return self.text


def parse_duration(text: str) -> Duration:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``.

    The unit is required: these spans select entries to delete, and a bare ``30`` meant as days
    but read as seconds would select everything. A unit we do not take (``2y``, ``1mo``) is named
    with the ones we do, rather than guessed (a year or a month has no single length)."""
    m = _DURATION_RE.match(text)
    if not m:
        raise UsageError(f"invalid duration {text!r}: use a number with a unit, {_ACCEPTED} (e.g. 30d)")
    number, unit = m[1], m[2]
    if not unit:
        raise UsageError(f"duration {text.strip()!r} has no unit: write {number}d for days "
                         f"(units: {_ACCEPTED})")
    if unit not in _DURATION_UNITS:
        raise UsageError(f"unknown duration unit {unit!r} in {text.strip()!r}: use {_ACCEPTED} (e.g. 30d)")
    return Duration(float(number) * _DURATION_UNITS[unit], text.strip())


_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*\Z")
_SIZE_UNITS = {u: 1000 ** i for i, u in enumerate(_UNITS)} | {u + "B": 1000 ** i for i, u in enumerate(_UNITS) if u != "B"} \
    | {u + "iB": 1024 ** i for i, u in enumerate(_UNITS) if u != "B"}


def parse_size(text: str) -> int:
    """``50G``, ``500M``, ``1.5T``, ``10GiB``, ``123`` (bytes): decimal units as ``format_size``
    prints them (and ``du --si``), ``KiB``/``MiB``/``GiB`` for powers of 1024."""
    m = _SIZE_RE.match(text)
    unit = (m[2] or "B") if m else ""
    norm = unit[:1].upper() + unit[1:] if unit else unit
    if not m or norm not in _SIZE_UNITS:
        raise UsageError(f"invalid size {text!r}: a number with an optional unit, "
                         "K, M, G, T (powers of 1000) or KiB, MiB, GiB, TiB (e.g. 50G)")
    return int(float(m[1]) * _SIZE_UNITS[norm])
