"""Human strings for sizes, ages, durations, counts and process ends (one place, so every command
prints alike)."""

from __future__ import annotations

import re
import signal
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


def how_it_ended(returncode: int | None) -> str:
    """A child process's end as ``Popen.returncode`` holds it, in words: ``killed by SIGKILL``
    (the kernel's OOM killer, ``kill -9``, a scheduler's time limit), ``exit status 1``. A worker
    killed before it logs a line says nothing else about why it stopped."""
    if returncode is None:
        return "no exit status"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def plural(n: int, singular: str, plural_form: str | None = None) -> str:
    """``1 entry``, ``2 entries``, ``1 temp file``."""
    return f"{n} {singular if n == 1 else (plural_form or singular + 's')}"


#: One grammar for every duration and size option (docs/cli.md, "Units"): a number, optional
#: spaces, a unit in any case. The unit is never optional: these values select entries to delete.
_VALUE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*\Z")
_DURATION_UNITS = {name: seconds for names, seconds in (
    (("s", "sec", "secs", "second", "seconds"), 1),
    (("m", "min", "mins", "minute", "minutes"), 60),
    (("h", "hr", "hrs", "hour", "hours"), 3600),
    (("d", "day", "days"), 86400),
    (("w", "wk", "wks", "week", "weeks"), 7 * 86400),
) for name in names}
_ACCEPTED = "s (seconds), m (minutes), h (hours), d (days) or w (weeks)"


@dataclass(frozen=True)
class Duration:
    """A span the user typed: seconds for the code, the user's own text for messages."""

    seconds: float
    text: str

    def __str__(self) -> str:
        return self.text


def parse_duration(text: str) -> Duration:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``; any case, and the long forms (``30 days``,
    ``12hr``, ``90 minutes``).

    The unit is required: these spans select entries to delete, and a bare ``30`` meant as days
    but read as seconds would select everything. A unit we do not take (``2y``, ``1mo``) is named
    with the ones we do, rather than guessed (a year or a month has no single length)."""
    m = _VALUE_RE.match(text)
    if not m:
        raise UsageError(f"invalid duration {text!r}: use a number with a unit, {_ACCEPTED} (e.g. 30d)")
    number, unit = m[1], m[2]
    if not unit:
        raise UsageError(f"duration {text.strip()!r} has no unit: write {number}d for days "
                         f"(units: {_ACCEPTED})")
    if unit.lower() not in _DURATION_UNITS:
        raise UsageError(f"unknown duration unit {unit!r} in {text.strip()!r}: use {_ACCEPTED} (e.g. 30d)")
    return Duration(float(number) * _DURATION_UNITS[unit.lower()], text.strip())


#: Sizes: K, M, G, T, P are powers of 1000 (as ``format_size`` prints them, and ``du --si``),
#: KiB... PiB (or Ki... Pi) powers of 1024; a trailing B or b is bytes either way (a cache is
#: never measured in bits, so ``50Gb`` is 50 GB, not a slip to refuse); ``B`` alone is bytes.
_SIZE_UNITS = {"b": 1} | {
    prefix + tail: base ** power
    for power, prefix in enumerate("kmgtp", start=1)
    for tail, base in (("", 1000), ("b", 1000), ("i", 1024), ("ib", 1024))
}
_SIZE_ACCEPTED = "K, M, G, T, P (powers of 1000) or KiB, MiB, GiB, TiB, PiB (powers of 1024), any case"


def parse_size(text: str) -> int:
    """``50G``, ``500M``, ``1.5T``, ``10GiB``, ``50gb``, ``7B``; any case.

    The unit is required, as a duration's: ``prune --max-size 50`` read as 50 bytes would evict
    every entry, so a bare number is a usage error suggesting ``50G``."""
    m = _VALUE_RE.match(text)
    if not m:
        raise UsageError(f"invalid size {text!r}: use a number with a unit, {_SIZE_ACCEPTED} (e.g. 50G)")
    number, unit = m[1], m[2]
    if unit == "":
        raise UsageError(f"size {text.strip()!r} has no unit: write {number}G for gigabytes "
                         f"(units: {_SIZE_ACCEPTED}; B for bytes)")
    if unit.lower() not in _SIZE_UNITS:
        raise UsageError(f"invalid size {text.strip()!r}: unknown unit {unit!r}; use {_SIZE_ACCEPTED} (e.g. 50G)")
    return int(float(number) * _SIZE_UNITS[unit.lower()])
