"""Human strings for sizes, ages and durations (one place, so every command prints alike)."""

from __future__ import annotations

import re
import time

from .errors import UsageError

_UNITS = ("B", "K", "M", "G", "T", "P")


def format_size(num_bytes: int) -> str:
    """``1.2M`` style, like ``du -h`` and ``huggingface-cli scan-cache``."""
    size = float(num_bytes)
    for unit in _UNITS:
        if size < 1000 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{int(size)}B"
            return f"{size:.1f}{unit}"
        size /= 1000
    raise AssertionError("unreachable")


def format_age(timestamp: float, now: float | None = None) -> str:
    delta = max(0.0, (now if now is not None else time.time()) - timestamp)
    for unit, seconds in (("y", 365 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= seconds:
            return f"{int(delta // seconds)}{unit} ago"
    return f"{int(delta)}s ago"


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` -> seconds. Bare numbers are seconds."""
    m = _DURATION_RE.match(text)
    if not m:
        raise UsageError(f"invalid duration {text!r}: use a number with s, m, h, d or w (e.g. 30d)")
    return float(m[1]) * _DURATION_UNITS[m[2]]
