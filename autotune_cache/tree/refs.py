"""Names typed by a user (ids, keys, key prefixes, entry paths) are taken exactly as given, and
resolved by one set of rules wherever entries are named: a local tree's (``CacheInfo.find``) and a
store's listing (``rm URL``, ``pull URL``) alike.

Nothing is stripped: ``rm "$key"$'\\n'`` from a script, a key pasted with a trailing space or a
CRLF file's ``\\r`` would otherwise delete the real ``<key>`` - even where a look-alike
directory named ``<key>\\n`` exists, which is the one meant. Such a name is refused instead
(a usage error, exit 2), before any tree is scanned or anything is planned."""

from __future__ import annotations

import re
import unicodedata
from typing import Iterable, Sequence, TypeVar

from autotune_cache.errors import AmbiguousEntry, UsageError
from autotune_cache.tree.layouts.base import CacheLayout

#: The shortest key prefix taken for a whole key (git's default abbreviation is 7; docker takes any).
MIN_PREFIX = 4
PREFIX_RE = re.compile(r"[0-9a-f]{%d,}" % MIN_PREFIX)

#: Anything with an ``id`` (an ``EntryId``): a tree's ``CacheEntry``, a store's record.
Named = TypeVar("Named")


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


def named_by(ref: str, entries: Sequence[Named], layouts: Iterable[CacheLayout], where: str = "") -> list[Named]:
    """The ``entries`` ``ref`` names: an id of one of ``layouts``, a key, or a unique key prefix
    (at least ``MIN_PREFIX`` hex digits, alone or at the end of an id, as docker and git take).
    Empty when it names none (the caller says so, or tries a path); a key or prefix that names
    several is refused, listing their ids (``AmbiguousEntry``, exit 1): never a guess. ``where``
    (`` in s3://...``) tells the message which entries were meant."""
    text = exact_ref(ref).rstrip("/")
    layouts = tuple(layouts)
    eids = {eid for lay in layouts if (eid := lay.parse_id(text)) is not None}
    matches = [e for e in entries if e.id in eids]
    if matches:
        return _one(ref, matches, where)
    if any(lay.is_entry_name(text) for lay in layouts):
        matches = [e for e in entries if e.id.name == text]
        if matches:
            return _one(ref, matches, where)
    head, _, tail = text.rpartition("/")
    if PREFIX_RE.fullmatch(tail):
        matches = [e for e in entries if e.id.name.startswith(tail) and (not head or str(e.id).startswith(text))]
        if matches:
            return _one(ref, matches, where)
    return []


def _one(ref: str, matches: list[Named], where: str) -> list[Named]:
    if len(matches) > 1:
        raise AmbiguousEntry(f"{ref!r} names {len(matches)} entries{where}; give one id: "
                             + ", ".join(str(e.id) for e in matches))
    return matches
