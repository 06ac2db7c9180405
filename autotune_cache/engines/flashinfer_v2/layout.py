"""FlashInfer's managed store (``flashinfer.autotune_v2``): one entry per environment directory.

    <root>/v2/<env hash>/manifest.json + entries/<sha256(key)[:24]>.json

The unit fi-autotune lists, deletes and checks is the environment directory: everything
FlashInfer in one software stack on one GPU model reads. See ``v2store.py`` for the format.
"""

from __future__ import annotations

import json
import os
import re
import stat as stat_mod
from pathlib import Path

from autotune_cache.plan.topology import Topology
from autotune_cache.tree.layout import TEMP_FILE_RE, CacheLayout, EntryId, Level, NameKind, RootChoice

ENV_RE = re.compile(r"^[0-9a-f]{16}$")
ENTRY_RE = re.compile(r"^[0-9a-f]{24}\.json$")
#: FlashInfer's own temp files (``_atomic_write_json``): ``.autotune_XXXX.tmp``.
FI_TEMP_RE = re.compile(r"^\.autotune_.*\.tmp$")


class FlashInferV2Layout(CacheLayout):
    name = "flashinfer-v2"
    engine = "FlashInfer"
    env_keyed = True
    description = "FlashInfer's managed store (autotune_v2; vLLM single-rank): <root>/v2/<env hash>/entries/*.json"
    levels = (Level("env_hash", "environment hash", ENV_RE),)
    archivable = False  # entries/ holds the data: made by `convert` (or warm) where it is read

    def default_root(self) -> RootChoice:
        from autotune_cache.engines.flashinfer_v2.store import default_root

        path, source = default_root()
        return RootChoice(path, source)

    def base_parts(self) -> tuple[str, ...]:
        return ("v2",)

    def classify(self, name: str, is_dir: bool) -> NameKind:
        if is_dir:
            return NameKind.ENGINE_SIDE if name == "entries" else NameKind.FOREIGN
        if name == "manifest.json":
            return NameKind.MANIFEST
        if TEMP_FILE_RE.match(name) or FI_TEMP_RE.match(name):
            return NameKind.TEMP
        return NameKind.FOREIGN

    def expected_files(self, topology: Topology) -> list[str]:
        return []

    def infer_topology(self, names: list[str]) -> Topology | None:
        return None

    def identical_groups(self, names: list[str], topology: Topology | None) -> list[tuple[str, list[str]]]:
        return []

    def id_fields(self, eid: EntryId) -> dict[str, str]:
        return {"key": eid.name}

    def scan_entry(self, path: Path, eid: EntryId, fingerprint, atime_trusted: bool):
        return scan_env_dir(self, path, eid, fingerprint, atime_trusted)


def scan_env_dir(layout: FlashInferV2Layout, path: Path, eid: EntryId, fingerprint, atime_trusted: bool):
    """One environment directory as a ``CacheEntry``: its entries are the data files."""
    from autotune_cache.autotuner.rankfile import MAX_RANK_FILE_BYTES, RankFile, read_regular_file
    from autotune_cache.tree.scan import CacheEntry, Finding, _finding_for
    from autotune_cache.tree.status import EntryStatus
    from autotune_cache.engines.flashinfer_v2.store import ENTRIES, MANIFEST, env_hash, entry_name

    problems, notes, foreign, temp = [], [], [], []
    state = []
    size, newest, newest_atime = 0, 0.0, 0.0
    manifest: dict | None = None
    try:
        children = list(os.scandir(path))
    except OSError as e:
        return CacheEntry(eid, path, None, None, None, (), None, EntryStatus.UNREADABLE, (f"cannot list: {e.strerror}",))
    files: list[RankFile] = []
    for child in children:
        st = child.stat(follow_symlinks=False)
        state.append((child.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
        kind = layout.classify(child.name, stat_mod.S_ISDIR(st.st_mode))
        if kind is NameKind.MANIFEST and stat_mod.S_ISREG(st.st_mode):
            size += st.st_size
            try:
                manifest = json.loads(read_regular_file(child.path, limit=1 << 20))
                if not isinstance(manifest, dict):
                    raise ValueError("not an object")
            except (OSError, ValueError, RecursionError) as e:
                problems.append(f"{MANIFEST}: {str(e)[:80]}")
                manifest = None
        elif kind is NameKind.ENGINE_SIDE:
            entries_dir = path / ENTRIES
            for e in sorted(os.scandir(entries_dir), key=lambda d: d.name):
                est = e.stat(follow_symlinks=False)
                state.append((f"{ENTRIES}/{e.name}", est.st_size, est.st_mtime_ns, est.st_ctime_ns, est.st_ino))
                if FI_TEMP_RE.match(e.name) or TEMP_FILE_RE.match(e.name):
                    temp.append(Finding(entries_dir / e.name, "temp", "temporary file of an interrupted write",
                                        est.st_size, est.st_mtime))
                    continue
                if not (ENTRY_RE.match(e.name) and stat_mod.S_ISREG(est.st_mode)):
                    foreign.append(_finding_for(entries_dir / e.name, est))
                    continue
                size += est.st_size
                newest = max(newest, est.st_mtime)
                newest_atime = max(newest_atime, est.st_atime)
                error = None
                try:
                    entry = json.loads(read_regular_file(e.path, limit=MAX_RANK_FILE_BYTES))
                    if not (isinstance(entry, dict) and isinstance(entry.get("key"), str)
                            and isinstance(entry.get("runner"), str) and "tactic" in entry):
                        raise ValueError("not a FlashInfer v2 entry")
                    if entry_name(entry["key"]) != e.name:
                        raise ValueError("its embedded key does not hash to its name (FlashInfer would skip it)")
                except (OSError, ValueError, RecursionError) as ex:
                    error = str(ex)[:100]
                files.append(RankFile(entries_dir, e.name, est.st_size, est.st_mtime, est.st_mtime_ns, None,
                                      0 if error else 1, {}, error))
        elif kind is NameKind.TEMP:
            temp.append(Finding(path / child.name, "temp", "temporary file of an interrupted write", st.st_size, st.st_mtime))
        else:
            foreign.append(_finding_for(path / child.name, st))
    metadata = {k: v for k, v in (manifest or {}).items() if k != "cache_schema"}
    if manifest is None and not problems:
        problems.append(f"no {MANIFEST}")
    elif manifest is not None and env_hash(manifest) != eid.name:
        problems.append(f"{MANIFEST} hashes to {env_hash(manifest)}, not to its directory: FlashInfer never looks here")
    problems.extend(f"{f.name}: {f.error}" for f in files if f.error)
    status = EntryStatus.CORRUPT if problems else EntryStatus.COMPLETE
    if not problems and not files:
        notes.append("no entries yet")
    if status == EntryStatus.COMPLETE and fingerprint is not None:
        verdict = fingerprint.compare(metadata)
        if verdict.stale:
            problems.append(f"FlashInfer in {fingerprint.source} would look elsewhere ({verdict.describe()})")
            status = EntryStatus.STALE
    files = [f._replace(metadata=metadata) for f in files]
    return CacheEntry(
        id=eid, path=path, flashinfer_version=metadata.get("flashinfer_version"), arch=None, manifest=None,
        rank_files=tuple(files), topology=None, status=status, problems=tuple(problems), notes=tuple(notes),
        temp_files=tuple(temp), foreign=tuple(foreign), size_on_disk=size, last_modified=newest,
        last_used=(newest_atime or None) if atime_trusted else None, state=tuple(sorted(state)),
    )
