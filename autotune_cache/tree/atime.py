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


def policy_for(root: Path) -> AtimePolicy:
    """The policy of the nearest existing directory at or above ``root``."""
    p = Path(root)
    while not p.exists() and p != p.parent:
        p = p.parent
    return atime_policy(str(p))
