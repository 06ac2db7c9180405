"""Can a file's access time say when an engine last loaded it?

Engines read cache files without changing them, so write time says nothing about use; the
access time does, where the filesystem keeps it:

* ``strictatime``: every read updates it.
* ``relatime`` (the Linux default): a read updates it when it is older than the last write or
  more than 24 hours old, so "last used" is right to within a day - enough for ``30d``.
* ``noatime``: never updated after creation. Last use is then unknown, and ``--unused-for``
  selects nothing rather than calling every entry unused.

fi-autotune's own reads (``ls``, ``show``, ``export``) open files with ``O_NOATIME`` where the
kernel allows it (files we own), so listing a cache does not count as using it.

A mount that keeps access times can still hold ones that say nothing about use: ``rsync``, a
restore, or a backup pass reads (or writes) every entry within seconds of the others, however
far apart they were written. ``atime_doubt`` names both cases; ``ls`` then says so, and
``prune --max-size`` / ``--unused-for`` treat last use as unknown (eviction by last write).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class AtimePolicy:
    trusted: bool
    mount_point: str
    options: tuple[str, ...]

    @property
    def why_not(self) -> str:
        return f"{self.mount_point} is mounted noatime: access times are not recorded, so last use is unknown"


def _unescape(field: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as octal.
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


@functools.lru_cache(maxsize=64)
def atime_policy(path: str) -> AtimePolicy:
    """From the mount holding ``path`` (longest matching mount point in /proc/self/mountinfo).
    Where that cannot be read (not Linux), atime is taken as kept, as POSIX requires."""
    real = os.path.realpath(path)
    best: tuple[str, tuple[str, ...]] = ("/", ())
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 6:
                    continue
                mount_point = _unescape(fields[4])
                options = tuple(fields[5].split(","))
                inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best[0]):
                    best = (mount_point, options)
    except OSError:
        return AtimePolicy(True, "/", ())
    return AtimePolicy("noatime" not in best[1], best[0], best[1])


#: Access times of every entry within this many seconds of each other, on entries written further
#: apart than that, were left by one pass over the tree, not by engines loading what they serve.
CLUSTER_S = 60.0


@dataclass
class TimeSpan:
    """The range of entries' last access and last write, gathered as they stream by (``ls`` of
    100,000 entries keeps four numbers, not the entries)."""

    entries: int = 0
    unknown: int = 0  # entries without an access time
    used: tuple[float, float] | None = None
    written: tuple[float, float] | None = None

    def add(self, last_used: float | None, last_modified: float | None) -> None:
        self.entries += 1
        if not last_used:
            self.unknown += 1
        else:
            self.used = _widen(self.used, last_used)
        if last_modified:
            self.written = _widen(self.written, last_modified)


def _widen(span: tuple[float, float] | None, t: float) -> tuple[float, float]:
    return (t, t) if span is None else (min(span[0], t), max(span[1], t))


def atime_doubt(root: Path, span: TimeSpan) -> str | None:
    """Why the access times under ``root`` cannot say when entries were last used, or None.
    Two or more entries all read within ``CLUSTER_S`` of each other, though written further
    apart, is a copy's mark: one engine loads one entry, so use does not line up across a tree."""
    policy = policy_for(root)
    if not policy.trusted:
        return policy.why_not
    if span.entries < 2 or span.unknown or span.used is None or span.written is None:
        return None
    read, wrote = span.used[1] - span.used[0], span.written[1] - span.written[0]
    if read <= CLUSTER_S < wrote:
        return (f"every entry was last read within {read:.0f}s of the others, though written {wrote / 86400:.1f} "
                "days apart: a copy or a restore (rsync, cp, a backup) read them all at once, so access times "
                "do not say when they were last used")
    return None


def policy_for(root: Path) -> AtimePolicy:
    """The policy of the nearest existing directory at or above ``root``."""
    p = Path(root)
    while not p.exists() and p != p.parent:
        p = p.parent
    return atime_policy(str(p))
