"""Finding the entries ids name, across the trees a command reads (``show``, ``rm``, ``diff``); a writer finishes killed writers' transactions first."""

from __future__ import annotations


from autotune_cache.errors import AmbiguousEntry, FiAutotuneError
from autotune_cache.registry import layouts as known_layouts
from autotune_cache.tree.crashsafe.recovery import recover_journals
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.tree.refs import exact_ref

from .params import flatten
from .roots import trees


def scan_trees(cache_dir, layouts, refs, fingerprint=None, gone=None, recovered: list[str] | None = None):
    """Scan the trees the ids name (a ``<layout>:`` prefix names its layout; ``--layout`` or
    ``--cache-dir`` otherwise) and resolve the ids there: [(entry, CacheInfo)]. ``gone(ref,
    infos)``: True for a ref found nowhere that is accounted for anyway (``rm``: an entry a
    killed rm had deleted); it is left out instead of failing. ``recovered``: the command
    writes (``rm``), so it first finishes the transactions killed writers left, once, and notes
    what it finished there; a reader (``show``), None, reads the tree as it is."""
    for ref in refs:
        exact_ref(ref)  # before anything is scanned: a stray newline is a slip, not a missing entry
    names = list(flatten(layouts))
    for ref in refs:
        prefix, sep, _ = ref.partition(":")
        if sep and prefix in known_layouts() and prefix not in names and (cache_dir is None or not flatten(layouts)):
            names.append(prefix)
    targets = trees(cache_dir, tuple(names))
    infos = []
    for layout, root in targets:
        if recovered is not None:
            recovered += recover_journals(layout, root.path)
        infos.append(scan_cache(root.path, layout, fingerprint))
    found = []
    for ref in refs:
        matches, last_error = [], None
        for info in infos:
            try:
                matches += [(e, info) for e in info.find(ref)]
            except AmbiguousEntry:
                raise  # never a guess, whatever the other trees hold
            except FiAutotuneError as e:
                last_error = e
        if not matches:
            if gone is not None and gone(ref, infos):
                continue
            raise last_error
        for m in matches:
            if m[0] not in [f[0] for f in found]:
                found.append(m)
    return found
