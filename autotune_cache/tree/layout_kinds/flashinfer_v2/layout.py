"""FlashInfer's managed store (``flashinfer.autotune_v2``): one entry per environment directory.

    <root>/v2/<env hash>/manifest.json + entries/<sha256(key)[:24]>.json

The unit fi-autotune lists, deletes and checks is the environment directory: everything
FlashInfer in one software stack on one GPU model reads. See ``store.py`` beside it for the format.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat as stat_mod
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from autotune_cache.autotuner.rankfile import MAX_RANK_FILE_BYTES, RankFile, read_regular_file, refused_by_system
from autotune_cache.tree.layout_kinds.flashinfer_v2.bundle import StagedEnv, checked_env, merge_env
from autotune_cache.tree.layout_kinds.flashinfer_v2.convert import write_entry
from autotune_cache.tree.layout_kinds.flashinfer_v2.format import (ENTRIES, MANIFEST, V2Result, default_root, entry_name, env_hash,
                                                       lacking, merge_rank_files, store_manifest, write_store)
from autotune_cache.plan.topology import Topology
from autotune_cache.errors import UsageError
from autotune_cache.tree.check_report import checkable
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId, Existing, Level, Misplaced, NameKind, Replay, RootChoice
from autotune_cache.tree.layouts.own_names import TEMP_FILE_RE
from autotune_cache.tree.records import CacheEntry, Finding, finding_for
from autotune_cache.tree.status import EntryStatus

ENV_RE = re.compile(r"^[0-9a-f]{16}\Z")
ENTRY_RE = re.compile(r"^[0-9a-f]{24}\.json\Z")
#: FlashInfer's own temp files (``_atomic_write_json``): ``.autotune_XXXX.tmp``.
FI_TEMP_RE = re.compile(r"^\.autotune_.*\.tmp\Z")


class FlashInferV2Layout(CacheLayout):
    name = "flashinfer-v2"
    engine = "FlashInfer"
    description = "FlashInfer's managed store (autotune_v2; vLLM single-rank): <root>/v2/<env hash>/entries/*.json"
    levels = (Level("env_hash", "environment hash", ENV_RE),)
    #: Bundled as on disk (``bundle.py``), merged entry by entry on import (FlashInfer writes here too).
    data_dirs = (ENTRIES,)
    writes = "store_entries"
    logged_dir_is_entry = True  # an environment dir of one file per key
    diffs_entries = False

    def entry_configs(self, counts: list[int]) -> int:
        return sum(counts)  # one key per file

    def entry_ops(self, files: list, prefer: str | None = None) -> list | None:
        return None  # one key per file: listed by show --json

    def written_files(self, names: list[str]) -> list[str]:
        return []  # each winner is published as its own store entry

    @staticmethod
    def _store_dir(plan) -> str:
        return str(plan.key_dir) if plan.bound else f"{plan.key_dir}/<the tuning GPU's environment hash>"

    def where_rows(self, plan, compact) -> list[tuple[str, str]]:
        lookups = sum(len(op.lookups()) for w in plan.workloads for op in w.ops)
        return [("Store dir", self._store_dir(plan)), ("Entries", f"{lookups} lookups, one file each under entries/")]

    def workload_title(self, plan, i: int, spans: str, ranks: tuple[str, ...], compact) -> str:
        return (f"Workload {i} (layers {spans}): each winner written to FlashInfer's managed store, "
                f"{self._store_dir(plan)}/entries/ (no rank file)")

    def written_words(self, plan) -> str:
        return ", each winner published as its own store entry"

    def checked_words(self, files: int) -> str:
        return ""

    def complete_words(self, quality: str | None) -> str:
        return " (every lookup of the startup pass has its entry in FlashInfer's managed store)"

    def default_root(self) -> RootChoice:
        path, source = default_root()
        return RootChoice(path, source)

    def base_parts(self) -> tuple[str, ...]:
        return ("v2",)

    def misplaced_root(self, path: Path) -> Misplaced | None:
        """As every layout's, but ``v2`` is a common name (a root may well be called that): a
        directory counts as this store's v2 dir only when it holds environment dirs, and as an
        environment dir only when it holds FlashInfer's ``entries`` dir."""
        found = super().misplaced_root(path)
        if found is None or found.root == Path(path):
            return found  # a nested v2/v2 is seen on disk already
        p = Path(path)
        if (p / ENTRIES).is_dir() and ENV_RE.match(p.name):
            return found
        try:
            return found if any(ENV_RE.match(c.name) and (c / ENTRIES).is_dir() for c in p.iterdir()) else None
        except OSError:
            return None

    def classify(self, name: str, is_dir: bool) -> NameKind:
        if name.startswith(ENTRIES + "/"):  # an entry file, named from the environment dir (bundles)
            return NameKind.DATA if not is_dir and ENTRY_RE.match(name[len(ENTRIES) + 1:]) else NameKind.FOREIGN
        if is_dir:
            return NameKind.ENGINE_SIDE if name == "entries" else NameKind.FOREIGN
        if name == "manifest.json":
            return NameKind.MANIFEST
        if TEMP_FILE_RE.match(name) or FI_TEMP_RE.match(name):
            return NameKind.TEMP
        return NameKind.FOREIGN

    def parse_member(self, member: str) -> tuple[EntryId, str] | None:
        """``v2/<env>/manifest.json`` and ``v2/<env>/entries/<x>.json``: the tree as it is on disk."""
        parts = PurePosixPath(member).parts
        base = self.base_parts()
        if len(parts) == len(base) + 3 and parts[: len(base)] == base and parts[-2] == ENTRIES:
            try:
                return self.make_id((parts[len(base)],)), f"{ENTRIES}/{parts[-1]}"
            except ValueError:
                return None
        return super().parse_member(member)

    def stage_bundle(self, eid: EntryId, files: dict[str, bytes]) -> StagedEnv:
        return checked_env(eid.name, files)

    def merge_bundle(self, root: Path, eid: EntryId, staged: StagedEnv, force: bool,
                     dry_run: bool = False) -> tuple[int, int, str | None]:
        return merge_env(self, root, eid, staged, force, dry_run)

    def environment_key(self, metadata: dict) -> str:
        """The directory FlashInfer in the environment ``metadata`` describes reads: its hash."""
        return env_hash(store_manifest(metadata))

    # --- a plan's entry: one environment directory, one entry per key ---------------------------
    def bind_environment(self, plan, metadata: dict):
        return replace(plan, key=self.environment_key(metadata))

    def existing(self, plan, gpu_name: str | None) -> Existing:
        """Each key stands alone: complete when every lookup of the startup pass has its entry."""
        groups = [g for w in plan.workloads for op in w.ops for g in op.lookups()]
        return Existing(None, not lacking(plan.key_dir, groups), None)

    def commit_tuning(self, plan, rank_bytes: dict[str, bytes], metadata: dict, stats: dict, extra: dict,
                      force: bool) -> str:
        """A warm's tuned files published as FlashInfer does, one entry per key, into the
        environment their ``_metadata`` names (no manifest of ours: the store has no rank files)."""
        published = self.publish_tuning(plan.cache_root, rank_bytes)
        return f"{published.env_dir}: {published.written} entries written, {published.unchanged} already there"

    def publish_tuning(self, root: Path, rank_bytes: dict[str, bytes]) -> V2Result:
        metadata, values = merge_rank_files(rank_bytes)
        return write_store(root, metadata, values)

    def stage_replay(self, key_dir: Path, ranks: list[str], tmp: Path, load, environment: dict) -> Replay:
        """A copy of the environment directory, entered as ``autotune_v2(mode="tune")`` (a miss
        then publishes into the copy); FlashInfer reads it only where this host hashes to it."""
        shutil.copytree(key_dir, tmp / key_dir.relative_to(key_dir.parent.parent))
        return Replay(str(key_dir), self.environment_key(environment) == key_dir.name, store_root=tmp)

    def replayed_tunes(self, changed: list[bytes], profiled: list[str]) -> list[str]:
        """What the pass published (new, or replaced): what it tuned."""
        return [json.loads(data)["key"] for data in changed]

    def checked_by(self, plan, reader: CacheLayout, cache_dir: str | None) -> tuple[CacheLayout, Path | None]:
        """A plan that writes this store (a single-rank vLLM) is checked in it, at its own root."""
        return self, plan.cache_root

    def check_entry(self, plan, report, fingerprint, root: Path | None, store_url: str | None, files) -> None:
        """The directory the serving environment hashes to must hold an entry for every lookup of
        the startup pass; only the serving image's fingerprint (``--env-from``) names it."""
        if fingerprint is None or store_url is not None:
            what = "a single-rank vLLM's managed store" if plan.layout_obj is self else f"--layout {self.name}"
            raise UsageError(f"{what} is checked locally against --env-from (the serving image's fingerprint names "
                             "its directory: `fi-autotune env --json > env.json` there)")
        check_environment_dir(plan, report, fingerprint, root)

    def expected_files(self, topology: Topology) -> list[str]:
        return []

    def infer_topology(self, names: list[str]) -> Topology | None:
        return None

    def identical_groups(self, names: list[str], topology: Topology | None) -> list[tuple[str, list[str]]]:
        return []

    def id_fields(self, eid: EntryId) -> dict[str, str]:
        return {"key": eid.name}

    def convert_into(self, entry, to_root: Path):
        return write_entry(entry, to_root)

    def scan_entry(self, path: Path, eid: EntryId, fingerprint, atime_trusted: bool):
        return scan_env_dir(self, path, eid, fingerprint, atime_trusted)


@dataclass
class _EnvDir:
    """What one pass over an environment directory found."""

    problems: list[str] = field(default_factory=list)
    foreign: list[Finding] = field(default_factory=list)
    temp: list[Finding] = field(default_factory=list)
    state: list = field(default_factory=list)
    files: list[RankFile] = field(default_factory=list)
    manifest: dict | None = None
    unknown: bool = False  # a file the system would not let us read: what the directory holds is not known
    size: int = 0
    newest: float = 0.0
    newest_atime: float = 0.0


def _read_manifest(found: _EnvDir, path: str) -> None:
    try:
        manifest = json.loads(read_regular_file(path, limit=1 << 20))
        if not isinstance(manifest, dict):
            raise ValueError("not an object")
        found.manifest = manifest
    except (OSError, ValueError, RecursionError) as e:
        found.problems.append(f"{MANIFEST}: {str(e)[:80]}")
        found.unknown |= refused_by_system(e)


def _entry_error(path: str, name: str) -> tuple[str | None, bool]:
    """(why FlashInfer would not use this entry file, or None; whether that is because the
    system would not let it be read, which leaves its contents unknown)."""
    try:
        entry = json.loads(read_regular_file(path, limit=MAX_RANK_FILE_BYTES))
        if not (isinstance(entry, dict) and isinstance(entry.get("key"), str)
                and isinstance(entry.get("runner"), str) and "tactic" in entry):
            raise ValueError("not a FlashInfer v2 entry")
        if entry_name(entry["key"]) != name:
            raise ValueError("its embedded key does not hash to its name (FlashInfer would skip it)")
    except (OSError, ValueError, RecursionError) as ex:
        return str(ex)[:100], refused_by_system(ex)
    return None, False


def _read_entries(found: _EnvDir, entries_dir: Path) -> None:
    """The ``entries/`` dir: each FlashInfer entry is one data file of the environment."""
    for e in sorted(os.scandir(entries_dir), key=lambda d: d.name):
        est = e.stat(follow_symlinks=False)
        found.state.append((f"{ENTRIES}/{e.name}", est.st_size, est.st_mtime_ns, est.st_ctime_ns, est.st_ino))
        if FI_TEMP_RE.match(e.name) or TEMP_FILE_RE.match(e.name):
            found.temp.append(Finding(entries_dir / e.name, "temp", "temporary file of an interrupted write",
                                      est.st_size, est.st_mtime))
            continue
        if not (ENTRY_RE.match(e.name) and stat_mod.S_ISREG(est.st_mode)):
            found.foreign.append(finding_for(entries_dir / e.name, est))
            continue
        found.size += est.st_size
        found.newest = max(found.newest, est.st_mtime)
        found.newest_atime = max(found.newest_atime, est.st_atime)
        error, unknown = _entry_error(e.path, e.name)
        found.files.append(RankFile(entries_dir, e.name, est.st_size, est.st_mtime, est.st_mtime_ns, None,
                                    0 if error else 1, {}, error, unknown))


def _list_env_dir(layout: FlashInferV2Layout, path: Path, children: list[os.DirEntry]) -> _EnvDir:
    found = _EnvDir()
    for child in children:
        st = child.stat(follow_symlinks=False)
        found.state.append((child.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
        kind = layout.classify(child.name, stat_mod.S_ISDIR(st.st_mode))
        if kind is NameKind.MANIFEST and stat_mod.S_ISREG(st.st_mode):
            found.size += st.st_size
            _read_manifest(found, child.path)
        elif kind is NameKind.ENGINE_SIDE:
            _read_entries(found, path / ENTRIES)
        elif kind is NameKind.TEMP:
            found.temp.append(Finding(path / child.name, "temp", "temporary file of an interrupted write",
                                      st.st_size, st.st_mtime))
        else:
            found.foreign.append(finding_for(path / child.name, st))
    return found


def scan_env_dir(layout: FlashInferV2Layout, path: Path, eid: EntryId, fingerprint, atime_trusted: bool):
    """One environment directory as a ``CacheEntry``: its entries are the data files."""
    try:
        children = list(os.scandir(path))
    except OSError as e:
        return CacheEntry(eid, path, None, None, None, (), None, EntryStatus.UNREADABLE, (f"cannot list: {e.strerror}",))
    found = _list_env_dir(layout, path, children)
    problems, notes, manifest, files = found.problems, [], found.manifest, found.files
    metadata = {k: v for k, v in (manifest or {}).items() if k != "cache_schema"}
    if manifest is None and not problems:
        problems.append(f"no {MANIFEST}")
    elif manifest is not None and env_hash(manifest) != eid.name:
        problems.append(f"{MANIFEST} hashes to {env_hash(manifest)}, not to its directory: FlashInfer never looks here")
    problems.extend(f"{f.name}: {f.error}" for f in files if f.error)
    unknown = found.unknown or any(f.unknown for f in files)
    status = EntryStatus.UNREADABLE if unknown else EntryStatus.CORRUPT if problems else EntryStatus.COMPLETE
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
        temp_files=tuple(found.temp), foreign=tuple(found.foreign), size_on_disk=found.size,
        last_modified=found.newest, last_used=(found.newest_atime or None) if atime_trusted else None,
        state=tuple(sorted(found.state)),
    )


def check_environment_dir(plan, report, fingerprint, root: Path) -> None:
    """``check`` of FlashInfer's managed store: the serving environment's directory, every lookup
    of the startup pass with an entry (each stands alone: no rank files)."""
    unknown = [k for k, v in fingerprint.fields.items() if not isinstance(v, str) or v in ("unknown", "None")]
    if unknown:
        report.cannot_check(f"{', '.join(unknown)} unknown in {fingerprint.source}: FlashInfer there hashes exactly "
                            "those values, so the directory below is only right if the serving image reads them the same way")
    env_dir = Path(root) / "v2" / env_hash(store_manifest(fingerprint.fields))
    report.where = str(env_dir)
    if not env_dir.is_dir():
        report.misses.append(f"no store for the serving environment at {env_dir}")
        return
    report.found = True
    for w in plan.workloads:
        for op in w.ops:
            if not checkable(op, report):
                continue
            wanted = op.lookups()
            report.keys_checked += len(wanted)
            missing = lacking(env_dir, wanted)
            if missing:
                report.keys_missing += len(missing)
                report.misses.append(f"{len(missing)} of {len(wanted)} {op.recipe.id} lookups have no entry "
                                     f"(e.g. {missing[0]})")


#: The one instance: the managed-store source and the registry (``KNOWN_LAYOUTS``) hand out this object.
LAYOUT = FlashInferV2Layout()
