"""The status of a cache entry: what an engine would do with it at startup."""

from __future__ import annotations

import enum


class EntryStatus(str, enum.Enum):
    """In order of precedence (an entry gets the first that applies)."""

    #: the entry dir, or a file in it, cannot be read (permissions, I/O): what it holds is not known
    UNREADABLE = "unreadable"
    CORRUPT = "corrupt"  # a data file or our manifest cannot be parsed, or sizes beyond bounds
    STALE = "stale"  # the engine described by a fingerprint would ignore its files
    DIVERGED = "diverged"  # files that must be identical differ: SGLang deletes them and re-tunes
    INCOMPLETE = "incomplete"  # expected files are missing: those ranks tune, then all re-tune
    #: no manifest: the rank files present agree, but how many the engine expects is only inferred
    #: from them, so a missing last rank (rank_tp3 of a TP4 entry) cannot be seen. Never "complete"
    #: on a guess: push/export take it only with --include-incomplete.
    UNVERIFIED = "unverified"
    COMPLETE = "complete"  # everything present, valid, identical where it must be

    def __str__(self) -> str:
        return self.value

    @classmethod
    def names(cls) -> list[str]:
        return [s.value for s in cls]
