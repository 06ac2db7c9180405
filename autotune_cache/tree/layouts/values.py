"""The small frozen values a layout names and answers with: an entry's id, a directory level,
what a name in an entry is, the root a command works on and where it came from, the entry at a
plan's path, ``verify``'s staged copy, and a root that is not one."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path

#: The layout a bare id (``<version>/<arch>/<key>``) names: how ids print, with no registry look-up
#: per id (``registry.default_layout()`` is the same layout, the first engine's first).
DEFAULT_LAYOUT_NAME = "sglang"


class NameKind(enum.Enum):
    """What a name directly inside an entry dir is."""

    DATA = "data"  # a file the engine reads (SGLang: a rank file)
    MANIFEST = "manifest"  # ours
    TEMP = "temp"  # a temp file of an interrupted write (ours or the engine's)
    ENGINE_SIDE = "engine-side"  # a directory the engine keeps beside its files (SGLang: runs/)
    FOREIGN = "foreign"  # not part of any cache


@dataclass(frozen=True, order=True)
class EntryId:
    """One entry of one layout: the directory names from the layout's base down to the entry.

    Printed (and accepted) as ``<version>/<arch>/<key>`` for the default layout, and as
    ``<layout>:<parts>`` for the others.
    """

    layout: str
    parts: tuple[str, ...]

    @property
    def name(self) -> str:
        """The entry dir's own name (SGLang: the key)."""
        return self.parts[-1]

    @property
    def path_str(self) -> str:
        return "/".join(self.parts)

    def __str__(self) -> str:
        return self.path_str if self.layout == DEFAULT_LAYOUT_NAME else f"{self.layout}:{self.path_str}"


@dataclass(frozen=True)
class Level:
    """One directory level between a layout's base and its entries."""

    field: str  # the attribute it gives an entry: "flashinfer_version", "arch", "key"
    name: str  # what the level holds, for messages: "flashinfer version", "arch", "cache key"
    pattern: re.Pattern

    def valid(self, name: str) -> bool:
        return not name.startswith(".") and bool(self.pattern.match(name))


@dataclass(frozen=True)
class RootChoice:
    """The cache root a command works on, and where that choice came from (for messages)."""

    path: Path
    source: str  # "--cache-dir", "$SGLANG_CACHE_DIR", "the default ~/.cache/sglang"

    def describe(self) -> str:
        return f"{self.path} (from {self.source})"


@dataclass(frozen=True)
class Existing:
    """The entry already at a plan's path. ``refusal``: why it must not be replaced without
    --force (another GPU model's, or another configuration's under the same vLLM hash)."""

    refusal: str | None
    complete: bool
    quality: str | None  # the mode it was tuned in (None: by the engine or an older warm)


@dataclass(frozen=True)
class Replay:
    """``verify``'s staged copy: where the engine would read (``source``), whether it accepts the
    files, and FlashInfer's managed store root to enter (None: the files are loaded directly)."""

    source: str
    accepted: bool
    store_root: Path | None = None


@dataclass(frozen=True)
class Misplaced:
    """A directory given as a root that is not one: the root meant, and what the directory is."""

    root: Path
    what: str  # follows "--cache-dir X is": "the flashinfer/autotune dir of the sglang tree at R, not its root"
    fix: str  # what to do instead: "give --cache-dir <root>"
