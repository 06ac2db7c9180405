"""What ``diff`` compares, read into ``CacheUnit``s: an entry of a scanned tree, an entry
directory read as it is, every entry of a tree, or a store pulled into a scratch tree through the
same verified import as ``pull``. Only the layouts whose entries are directories of whole cache
files take part (FlashInfer's managed store is compared by converting an entry into it)."""

from __future__ import annotations

import io
from pathlib import Path

from autotune_cache.autotuner.rankfile import parse_cache_bytes, read_regular_file
from autotune_cache.errors import FiAutotuneError
from autotune_cache.registry import default_layout, layouts
from autotune_cache.tree.diff import CacheUnit
from autotune_cache.tree.layouts.own_names import MANIFEST_NAME
from autotune_cache.tree.layouts.values import NameKind
from autotune_cache.tree.manifest import Manifest
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.tree.store.archive import import_archives
from autotune_cache.tree.store.store import Store


def diffed_layouts() -> tuple:
    """The layouts whose entries diff reads as directories of whole cache files."""
    return tuple(layout for layout in layouts().values() if layout.diffs_entries)


def unit_of_entry(e) -> CacheUnit:
    """An entry's rank files; one that cannot be read is noted (and makes the sides differ), not
    fatal: the rest of a tree is still compared."""
    files, notes = {}, []
    for rf in e.rank_files:
        try:
            files[rf.name] = rf.load()
        except (OSError, ValueError) as err:
            notes.append(f"{e.id}/{rf.name} is unreadable ({err})")
    return CacheUnit(str(e.id), files, e.manifest, notes=tuple(notes))


def read_cache_file(p: Path, text: str) -> dict:
    try:
        # A file named on the command line may be a symlink (read where it points).
        return parse_cache_bytes(read_regular_file(p.resolve()))
    except (OSError, ValueError) as err:
        raise FiAutotuneError(f"{text}: not a readable FlashInfer cache file ({err})") from None


def unit_of_dir(path: Path) -> CacheUnit | None:
    """An entry directory read as it is (not under a tree we scan): its rank files, its manifest.
    Whose it is (SGLang's ``rank_*.json``, vLLM's ``autotune_configs_*.json``) the names say."""
    names = [(p, p.is_dir()) for p in sorted(path.iterdir())]
    layout = next((lo for lo in diffed_layouts() if any(lo.classify(p.name, d) is NameKind.DATA for p, d in names)),
                  default_layout())
    files, manifest = {}, None
    for p, is_dir in names:
        kind = layout.classify(p.name, is_dir)
        if kind is NameKind.DATA:
            files[p.name] = read_cache_file(p, str(p))
        elif kind is NameKind.MANIFEST and p.name == MANIFEST_NAME:
            try:
                manifest = Manifest.from_bytes(read_regular_file(p))
            except (OSError, ValueError):
                manifest = None
    return CacheUnit(str(path), files, manifest) if files else None


def tree_units(root: Path) -> list[CacheUnit]:
    """Every entry of every flat layout under ``root`` (an SGLang root, a vLLM root, ...)."""
    return [unit_of_entry(e) for layout in diffed_layouts() for e in scan_cache(root, layout).entries]


def store_units(url: str, scratch: Path) -> tuple[str, list[CacheUnit], bool]:
    """A store, pulled into a scratch tree through the same verified import as ``pull``."""
    store = Store(url)
    root = scratch / f"store{len(list(scratch.iterdir()))}"
    root.mkdir()
    for layout in diffed_layouts():
        records = store.records(layout.name)
        if records:
            import_archives(layout, root, [(io.BytesIO(store.fetch(r)), f"{store} {r.id}") for r in records])
    return str(store), tree_units(root), True
