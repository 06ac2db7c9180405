"""FlashInfer's managed store in bundles (``export``/``import``, ``push``/``pull``): one
environment directory per bundle, members exactly as on disk under the root::

    v2/<env hash>/manifest.json
    v2/<env hash>/entries/<sha256(key)[:24]>.json

An import never replaces the directory: FlashInfer processes publish into it while they run
(each entry stands alone), so a bundle is *merged* entry by entry, each written atomically, under
the directory's writer lock. Everything is checked before anything is written - the manifest
hashes to its directory's name, every entry embeds a key that hashes to its file's name (what
FlashInfer's ``lookup`` requires) - and an entry already there with other bytes is a conflict:
the whole import is refused unless ``--force`` (then the bundle's tactic wins), so a store
pulled twice, or a tuning from another host, never silently replaces a local one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from autotune_cache.autotuner.rankfile import read_regular_file
from autotune_cache.tree.layout_kinds.flashinfer_v2.format import ENTRIES, MANIFEST, SCHEMA, entry_name, env_hash
from autotune_cache.errors import FiAutotuneError
from autotune_cache.tree.crashsafe.atomic import atomic_write_bytes, ensure_tree_dirs
from autotune_cache.tree.crashsafe.locks import entry_lock


@dataclass(frozen=True)
class BundledFile:
    size: int


@dataclass
class StagedEnv:
    """One environment directory read from bundles, checked, not yet written (the shape ``pull``
    judges a staged entry by: its environment and its data files)."""

    files: dict[str, bytes]
    metadata: dict
    records: dict[str, BundledFile] = field(default_factory=dict)
    manifest: None = None
    mixed_metadata: bool = False


def checked_env(name: str, files: dict[str, bytes]) -> StagedEnv:
    """``files`` (``manifest.json`` and ``entries/<x>.json``) of the environment ``name``, as
    FlashInfer would accept them; raises FiAutotuneError naming the first that it would not."""
    if MANIFEST not in files:
        raise FiAutotuneError(f"flashinfer-v2:{name}: no {MANIFEST} in the bundle")
    try:
        manifest = json.loads(files[MANIFEST])
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("cache_schema") != SCHEMA or env_hash(manifest) != name:
        raise FiAutotuneError(f"flashinfer-v2:{name}: its {MANIFEST} does not hash to its directory "
                              "(FlashInfer would never look there)")
    records = {}
    for fname, data in files.items():
        if fname == MANIFEST:
            continue
        try:
            entry = json.loads(data)
        except ValueError:
            entry = None
        if not (isinstance(entry, dict) and isinstance(entry.get("key"), str) and isinstance(entry.get("runner"), str)
                and "tactic" in entry):
            raise FiAutotuneError(f"flashinfer-v2:{name}/{fname}: not a FlashInfer v2 entry")
        if f"{ENTRIES}/{entry_name(entry['key'])}" != fname:
            raise FiAutotuneError(f"flashinfer-v2:{name}/{fname}: its embedded key does not hash to its name "
                                  "(FlashInfer would skip it)")
        records[fname] = BundledFile(len(data))
    if not records:
        raise FiAutotuneError(f"flashinfer-v2:{name}: no entries in the bundle")
    metadata = {k: v for k, v in manifest.items() if k != "cache_schema"}
    return StagedEnv(files, metadata, records)


def _current(path: Path) -> bytes | None:
    """What is at ``path`` now: None for nothing; anything not readable as a file of ours (a
    directory, a FIFO, a file over the size cap) counts as other content (b"")."""
    try:
        return read_regular_file(path)
    except FileNotFoundError:
        return None
    except OSError:
        return b""


def _merge_refusal(current: dict[str, bytes | None], staged: StagedEnv, force: bool) -> str | None:
    """Why merging ``staged`` over the files ``current`` holds is refused, or None."""
    for fname, here in sorted(current.items()):
        if here is None or here == staged.files[fname]:
            continue
        if fname == MANIFEST:
            return f"its {MANIFEST} differs from the bundle's"
        if not force:
            return (f"{fname} is already there with other content (another tuning of the same key): "
                    "--force replaces it")
    return None


def merge_env(layout, root: Path, eid, staged: StagedEnv, force: bool,
              dry_run: bool = False) -> tuple[int, int, str | None]:
    """(written, unchanged, refusal) of merging one checked environment into the store at
    ``root``; with a refusal nothing of it was written. ``dry_run``: the same decisions as the
    store is now, nothing written and no lock taken (a preview neither waits nor leaves one)."""
    env_dir = layout.entry_dir(root, eid)
    if dry_run:
        current = {fname: _current(env_dir / fname) for fname in staged.files}
        why = _merge_refusal(current, staged, force)
        changed = sum(1 for f in staged.files if f != MANIFEST and current[f] != staged.files[f])
        return (0, 0, why) if why else (changed, len(staged.files) - (MANIFEST in staged.files) - changed, None)
    Path(root).mkdir(parents=True, exist_ok=True)
    ensure_tree_dirs(Path(root), layout.base_parts())  # where the lock lives
    with entry_lock(layout, root, eid, timeout=120):
        # as it is now, under the lock every writer of this directory but FlashInfer takes
        current = {fname: _current(env_dir / fname) for fname in staged.files}
        why = _merge_refusal(current, staged, force)
        if why:
            return 0, 0, why
        ensure_tree_dirs(Path(root), layout.base_parts() + eid.parts + (ENTRIES,))
        written = unchanged = 0
        for fname in sorted(staged.files, key=lambda f: f != MANIFEST):  # the manifest first, as FlashInfer
            if current[fname] == staged.files[fname]:
                unchanged += fname != MANIFEST
                continue
            atomic_write_bytes(env_dir / fname, staged.files[fname])
            written += fname != MANIFEST
        return written, unchanged, None
