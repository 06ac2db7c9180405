"""FlashInfer's own managed autotune store (``flashinfer.autotune_v2``), written and read exactly
as FlashInfer 0.7.2.post1 does (``flashinfer/autotune_cache.py``)::

    <root>/v2/<env hash>/manifest.json
    <root>/v2/<env hash>/entries/<sha256(key)[:24]>.json

* ``<root>``: ``$FLASHINFER_AUTOTUNE_CACHE_DIR``, else ``$FLASHINFER_WORKSPACE_BASE`` (or ``~``)
  ``/.cache/flashinfer/autotune`` (``get_default_cache_root``).
* The environment hash is ``sha256`` of the canonical JSON (sorted keys, ``","`` / ``":"``) of
  the manifest: FlashInfer's seven ``_metadata`` fields, the non-default measurement-policy
  fields, and ``"cache_schema": "v2"``; first 16 hex digits. A process whose environment
  differs in any field looks in another directory: the identity *is* the path.
* An entry is ``{"key", "runner", "tactic", "profiling_policy"?, "key_fields"?}``, indented 2,
  keys sorted, no trailing newline; ``lookup`` requires the embedded ``key`` to equal the one
  looked up, ``preload`` that ``key_fields`` round-trips to it.
* Entries are published one by one, each atomically (temp file + rename), with no lock and no
  notion of a complete set: each lookup stands alone. fi-autotune writes them the same way.

The tactics come from the same tuning run as the SGLang rank files (the same measurements): a
v1 value ``[runner, tactic, policy]`` becomes an entry with ``profiling_policy = policy``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from autotune_cache.tree.crashsafe.atomic import atomic_write_bytes, ensure_tree_dirs, fsync_dir, remove_our_temps
from autotune_cache.tree.crashsafe.dirs import remove_tree
from autotune_cache.tree.crashsafe.faults import crashpoint
from autotune_cache.tree.layouts.own_names import stage_name
from autotune_cache.errors import FiAutotuneError
from autotune_cache.autotuner.lookup_keys import encode_key_fields, parse_key
from autotune_cache.autotuner.fingerprint import FIELDS
from autotune_cache.autotuner.rankfile import RESERVED_KEYS, read_regular_file
from autotune_cache.registry import get_layout
from autotune_cache.tree.crashsafe.locks import entry_lock, hold_owner_lock
from autotune_cache.tree.crashsafe.recovery import sweep_leftovers

SCHEMA = "v2"
ENV_HASH_CHARS = 16
ENTRY_HASH_CHARS = 24
MANIFEST = "manifest.json"
ENTRIES = "entries"


def canonical_json(obj) -> str:
    """FlashInfer's ``_canonical_json``."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def store_manifest(metadata: dict, measurement_fields: dict | None = None) -> dict:
    """The manifest of the environment that produced ``metadata`` (a rank file's ``_metadata``)."""
    missing = [f for f in FIELDS if not isinstance(metadata.get(f), str)]
    if missing:
        raise FiAutotuneError(f"the tuned files' _metadata lacks {', '.join(missing)}: cannot name a v2 environment")
    manifest = {f: metadata[f] for f in FIELDS}
    manifest.update(measurement_fields or {})
    manifest["cache_schema"] = SCHEMA
    return manifest


def env_hash(manifest: dict) -> str:
    return hashlib.sha256(canonical_json(manifest).encode()).hexdigest()[:ENV_HASH_CHARS]


def entry_name(file_key: str) -> str:
    return hashlib.sha256(file_key.encode()).hexdigest()[:ENTRY_HASH_CHARS] + ".json"


def entry_bytes(file_key: str, value: list) -> bytes:
    """One entry as ``ManagedAutotuneCache.publish`` writes it, from a v1 value."""
    entry = {"key": file_key, "runner": value[0], "tactic": value[1]}
    if len(value) > 2 and value[2] is not None:
        entry["profiling_policy"] = list(value[2])
    fields = parse_key(file_key)
    if fields is not None:
        entry["key_fields"] = encode_key_fields(fields)
    return json.dumps(entry, indent=2, sort_keys=True).encode()


def holds(env_dir: Path, file_key: str) -> bool:
    """Whether FlashInfer's ``lookup`` of ``file_key`` hits in ``env_dir``: the entry the key
    hashes to exists and embeds exactly that key (anything else is a miss to FlashInfer)."""
    try:
        entry = json.loads(read_regular_file(env_dir / ENTRIES / entry_name(file_key), limit=1 << 20))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(entry, dict) and entry.get("key") == file_key and isinstance(entry.get("runner"), str)


def lacking(env_dir: Path, groups: list[list[str]]) -> list[str]:
    """Of ``groups`` (per lookup, the keys it may be stored under: one per candidate runner), the
    first key of each that no entry in ``env_dir`` serves."""
    return [group[0] for group in groups if not any(holds(env_dir, k) for k in group)]


def json_bytes(obj) -> bytes:
    """``_atomic_write_json``'s format: indent 2, sorted keys, no trailing newline."""
    return json.dumps(obj, indent=2, sort_keys=True).encode()


@dataclass(frozen=True)
class V2Result:
    env_dir: Path
    env_hash: str
    written: int
    unchanged: int
    without_key_fields: int

    def to_dict(self) -> dict:
        return {"env_dir": str(self.env_dir), "env_hash": self.env_hash, "written": self.written,
                "unchanged": self.unchanged, "without_key_fields": self.without_key_fields}


def merge_rank_files(files: dict[str, bytes]) -> tuple[dict, dict]:
    """(metadata, key -> value) of an entry's rank files; their ``_metadata`` must agree, and a
    key tuned twice (two TP groups) must have one tactic."""
    metadata = None
    values: dict = {}
    for name, data in sorted(files.items()):
        obj = json.loads(data)
        meta = obj.get("_metadata") or {}
        if metadata is None:
            metadata = meta
        elif meta != metadata:
            raise FiAutotuneError(f"{name}: its _metadata differs from the other rank files: one environment per store")
        for k, v in obj.items():
            if k in RESERVED_KEYS:
                continue
            if k in values and values[k][:2] != v[:2]:
                raise FiAutotuneError(f"two rank files disagree on {k[:100]}: not one tuning")
            values[k] = v
    return metadata or {}, values


def write_store(root: Path, metadata: dict, values: dict, measurement_fields: dict | None = None) -> V2Result:
    """Publish ``values`` (key -> v1 value) into the environment ``metadata`` names under
    ``root``. Idempotent: an entry already holding the same bytes is left alone."""
    manifest = store_manifest(metadata, measurement_fields)
    h = env_hash(manifest)
    layout = get_layout("flashinfer-v2")
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        base = ensure_tree_dirs(Path(root), (SCHEMA,))
        env_dir = base / h
        sweep_leftovers(layout, root)  # a killed writer's staging dir
        written = unchanged = bare = 0
        with entry_lock(layout, root, layout.make_id((h,)), timeout=120):
            if not os.path.lexists(env_dir):
                # A new environment appears whole: its manifest is written in a staging dir
                # (ours: the next writer removes it once we are dead), then renamed into place.
                stage = base / stage_name(hold_owner_lock(base), h)
                remove_tree(stage)
                atomic_write_bytes(ensure_tree_dirs(base, (stage.name, ENTRIES)).parent / MANIFEST, json_bytes(manifest))
                crashpoint("v2.staged")
                os.rename(stage, env_dir)
                fsync_dir(base)
            entries_dir = ensure_tree_dirs(env_dir, (ENTRIES,))
            # under the lock every writer of this environment holds: our temp files here are a killed run's
            remove_our_temps(env_dir)
            remove_our_temps(entries_dir)
            if not (env_dir / MANIFEST).exists():
                atomic_write_bytes(env_dir / MANIFEST, json_bytes(manifest))
            for key in sorted(values):
                data = entry_bytes(key, values[key])
                if b'"key_fields"' not in data:
                    bare += 1
                path = entries_dir / entry_name(key)
                try:  # never a blocking open: a FIFO or device here is replaced, not waited on
                    if read_regular_file(path, limit=len(data)) == data:
                        unchanged += 1
                        continue
                except OSError:
                    pass
                atomic_write_bytes(path, data)
                written += 1
    except OSError as e:
        raise FiAutotuneError(f"cannot write the v2 store under {root}: {e.strerror or e}") from None
    return V2Result(env_dir, h, written, unchanged, bare)


def default_root() -> tuple[Path, str]:
    """FlashInfer's ``get_default_cache_root()``, and where it came from."""
    value = os.environ.get("FLASHINFER_AUTOTUNE_CACHE_DIR")
    if value:
        return Path(value), "$FLASHINFER_AUTOTUNE_CACHE_DIR"
    base = os.environ.get("FLASHINFER_WORKSPACE_BASE")
    if base:
        return Path(base) / ".cache" / "flashinfer" / "autotune", "$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/autotune"
    return Path.home() / ".cache" / "flashinfer" / "autotune", "the default ~/.cache/flashinfer/autotune"
