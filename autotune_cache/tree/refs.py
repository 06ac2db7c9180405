"""Names typed by a user (ids, keys, key prefixes, entry paths) are taken exactly as given.

Nothing is stripped: ``rm "$key"$'\\n'`` from a script, a key pasted with a trailing space or a
CRLF file's ``\\r`` would otherwise delete the real ``<key>`` - even where a look-alike
directory named ``<key>\\n`` exists, which is the one meant. Such a name is refused instead
(a usage error, exit 2), before any tree is scanned or anything is planned."""

from __future__ import annotations

import unicodedata

from autotune_cache.errors import UsageError


def _stray(ch: str) -> bool:
    """A control, format or line/paragraph separator character: never part of an entry's name."""
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")


def exact_ref(ref: str) -> str:
    """``ref`` unchanged, or a UsageError when it holds a control character anywhere or begins
    or ends with whitespace (a path may hold an inner space; no id, key or prefix does)."""
    if ref != ref.strip() or any(_stray(ch) for ch in ref):
        raise UsageError(f"{ref!r} is not an entry id: it has whitespace or a control character "
                         "(nothing is stripped; `fi-autotune ls -q` lists the ids)")
    return ref
