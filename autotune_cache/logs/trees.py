"""A cache path from a server's log, found in our trees: which entry it is, and is it there.

The server printed the path it read (``.../flashinfer/autotune/<version>/<arch>/<key>/rank_tp0_pp0_dp0.json``,
``.../autotune_configs_dp0_rank0.json``, FlashInfer's ``<root>/v2/<env hash>``). Whatever root it
sits under on the server, the path's tail names the entry in each layout (``CacheLayout.parse_member``);
we then look for that entry in the tree a user points at (``--cache-dir``) or the layouts' own roots.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from autotune_cache.registry import layouts
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId, NameKind
from autotune_cache.tree.nearest import Candidate
from autotune_cache.tree.records import CacheEntry, CacheInfo
from autotune_cache.tree.scanner.scan import scan_cache


@dataclass(frozen=True)
class Located:
    layout: CacheLayout
    id: EntryId
    file: str | None  # the rank file's name; None for a managed store's env dir


def locate(path: str) -> Located | None:
    """The entry a server's cache path is in, by the most specific layout whose tail it fits."""
    parts = PurePosixPath(path).parts
    for lay in sorted(layouts().values(), key=lambda x: -(len(x.base_parts()) + len(x.levels))):
        depth = len(lay.base_parts()) + len(lay.levels)
        if not lay.base_parts():
            continue  # a bare hash dir (``vllm-dir``) fits any path: never a guess
        for tail, name in ((parts[-depth - 1:], parts[-1]), ((*parts[-depth:], "x"), None)):
            if len(parts) < len(tail) - (name is None):
                continue
            found = lay.parse_member("/".join(tail))
            if found is None:
                continue
            if name is not None and lay.classify(name, False) is not NameKind.DATA:
                continue
            if name is None and not lay.logged_dir_is_entry:
                continue  # a directory names an entry only in a store of one file per key
            return Located(lay, found[0], name)
    return None


class Trees:
    """Our trees, scanned on first use. ``roots`` (``--cache-dir``, repeatable: an SGLang root and a
    FlashInfer store root differ): for each layout the first that holds its tree; none given:
    each layout's own root, as the engine computes it here."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots
        self._infos: dict[str, CacheInfo | None] = {}

    def root(self, layout: CacheLayout) -> Path:
        if not self.roots:
            return layout.default_root().path
        return next((r for r in self.roots if layout.base(r).is_dir()), self.roots[0])

    def info(self, layout: CacheLayout) -> CacheInfo | None:
        if layout.name not in self._infos:
            root = self.root(layout)
            self._infos[layout.name] = scan_cache(root, layout) if layout.base(root).is_dir() else None
        return self._infos[layout.name]

    def entry(self, loc: Located) -> CacheEntry | None:
        info = self.info(loc.layout)
        return next((e for e in info.entries if e.id == loc.id), None) if info else None

    def candidates(self, layout: CacheLayout) -> list[Candidate]:
        info = self.info(layout)
        return [Candidate(e.id, e.manifest.key_fields if e.manifest else None, e.gpu)
                for e in (info.entries if info else ())]


def root_of(path: str, loc: Located) -> str:
    """The server's root for this layout (the part of its path above the layout's base)."""
    parts = PurePosixPath(path).parts
    depth = len(loc.layout.base_parts()) + len(loc.layout.levels) + (1 if loc.file else 0)
    return str(PurePosixPath(*parts[:-depth])) if len(parts) > depth else "/"
