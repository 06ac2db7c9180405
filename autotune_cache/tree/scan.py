"""Scanning a cache tree into frozen records, in the manner of ``huggingface_hub.scan_cache_dir``.

Nothing here writes, follows a symlink, blocks on a FIFO, or reads more than a bounded amount;
odd things found in the tree become ``Finding``s or entry problems, never exceptions, so ``ls``
always finishes. The shape of the tree comes from a ``CacheLayout``.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import pickle
import stat as stat_mod
from stat import S_ISDIR, S_ISREG
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from autotune_cache.tree.atime import policy_for
from autotune_cache.tree.digestindex import DigestIndex
from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.humanize import format_age, format_size
from autotune_cache.engines.layouts import LAYOUTS, CacheLayout, EntryId, NameKind, default_layout, get_layout
from autotune_cache.autotuner.installed import VERSION_RE
from autotune_cache.tree.layout import JOURNAL_DIRNAME, LOCKS_DIRNAME, MANIFEST_NAME, STAGE_DIR_RE, TEMP_FILE_RE, TRASH_DIR_RE
from autotune_cache.tree.manifest import Manifest, NewerManifest
from autotune_cache.autotuner.rankfile import RankFile, read_regular_file
from autotune_cache.tree.status import EntryStatus
from autotune_cache.plan.topology import MAX_RANK_FILES, Topology, TopologyError

#: An entry dir holding more names than this is not a cache entry (its files are not read).
MAX_ENTRY_CHILDREN = MAX_RANK_FILES + 64
#: Files walked inside an engine side directory (SGLang's runs/) before giving up on its size.
MAX_SIDE_FILES = 10_000


@dataclass(frozen=True)
class Finding:
    """Something in the tree that is not a well-formed part of an entry."""

    path: Path
    kind: str  # foreign | symlink | special | unreadable | temp | stage | trash | journal
    message: str
    size_on_disk: int = 0
    mtime: float = 0.0

    def to_dict(self) -> dict:
        return {"path": str(self.path), "kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class CacheEntry:
    """One entry: for SGLang, ``<root>/flashinfer/autotune/<version>/<arch>/<key>``."""

    id: EntryId
    path: Path
    flashinfer_version: str | None
    arch: str | None
    manifest: Manifest | None
    rank_files: tuple[RankFile, ...]
    topology: Topology | None
    status: EntryStatus
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # remarks that do not change the status ("gpu unknown here")
    engine_files: tuple[Path, ...] = ()
    temp_files: tuple[Finding, ...] = ()
    foreign: tuple[Finding, ...] = ()
    size_on_disk: int = 0
    last_modified: float = 0.0
    last_used: float | None = None  # newest access time of a data file; None: not recorded here
    state: tuple = field(default=(), repr=False, compare=False)  # stat snapshot: "changed since?"

    @property
    def key(self) -> str:
        return self.id.name

    @property
    def layout(self) -> str:
        return self.id.layout

    @property
    def model(self) -> str | None:
        return self.manifest.model if self.manifest else None

    @property
    def expected_files(self) -> tuple[str, ...]:
        topology = self.manifest.topology if self.manifest else self.topology
        return tuple(get_layout(self.id.layout).expected_files(topology)) if topology else ()

    @property
    def present_expected(self) -> int:
        names = {rf.name for rf in self.rank_files if rf.ok}
        return sum(1 for name in self.expected_files if name in names)

    @property
    def ranks_str(self) -> str:
        return f"{self.present_expected}/{len(self.expected_files)}" if self.expected_files else "-"

    @property
    def num_configs(self) -> int:
        return max((rf.num_configs for rf in self.rank_files if rf.ok), default=0)

    @property
    def ep(self) -> int | None:
        return self.manifest.key_fields.ep if self.manifest else None

    @property
    def parallel_str(self) -> str:
        return get_layout(self.id.layout).parallel_str(self.topology, self.ep)

    @property
    def metadata(self) -> dict:
        for rf in self.rank_files:
            if rf.ok and rf.metadata:
                return rf.metadata
        return self.manifest.flashinfer_metadata if self.manifest else {}

    @property
    def gpu(self) -> str | None:
        value = self.metadata.get("gpu")
        return value if isinstance(value, str) and value not in ("unknown", "None") else None

    @property
    def gpu_short(self) -> str:
        g = self.gpu
        return g.removeprefix("NVIDIA ").replace(" ", "-") if g else "-"

    @property
    def size_on_disk_str(self) -> str:
        return format_size(self.size_on_disk)

    @property
    def last_modified_str(self) -> str:
        return format_age(self.last_modified)

    @property
    def last_used_str(self) -> str:
        return format_age(self.last_used)

    @property
    def only_ours(self) -> bool:
        """Nothing in the dir but engine data files, our manifest, temp files and engine side
        dirs: it may be replaced or removed as a whole without losing anyone else's file."""
        return not self.foreign

    def to_dict(self) -> dict:
        m = self.manifest
        t = self.topology
        return {
            "id": str(self.id),
            "layout": self.layout,
            "key": self.key,
            "path": str(self.path),
            "model": self.model,
            "flashinfer_version": self.flashinfer_version,
            "arch": self.arch,
            "gpu": self.gpu,
            "schema": m.schema if m else None,
            "key_fields": m.key_fields.to_dict() if m else None,
            "topology": t.to_dict() if t else None,
            "ranks_present": self.present_expected,
            "ranks_expected": len(self.expected_files),
            "configs": self.num_configs,
            "size_on_disk": self.size_on_disk,
            "last_modified": self.last_modified,
            "last_used": self.last_used,
            "status": self.status.value,
            "problems": list(self.problems),
            "notes": list(self.notes),
            "has_manifest": m is not None,
            "rank_files": [
                {"name": rf.name, "size": rf.size_on_disk, "configs": rf.num_configs,
                 "sha256": rf.sha256, "error": rf.error}
                for rf in self.rank_files
            ],
            "foreign": [f.to_dict() for f in self.foreign],
        }


@dataclass(frozen=True)
class CacheInfo:
    root: Path
    layout: CacheLayout
    entries: tuple[CacheEntry, ...]
    findings: tuple[Finding, ...]

    @property
    def size_on_disk(self) -> int:
        return sum(e.size_on_disk for e in self.entries)

    @property
    def size_on_disk_str(self) -> str:
        return format_size(self.size_on_disk)

    @property
    def stale_temp(self) -> tuple[Finding, ...]:
        """Temp files anywhere in the tree (entries' and loose ones)."""
        loose = tuple(f for f in self.findings if f.kind == "temp")
        return loose + tuple(t for e in self.entries for t in e.temp_files)

    def resolve(self, refs: "list[str] | tuple[str, ...]") -> list[CacheEntry]:
        """The entries named by ids (``<version>/<arch>/<key>``), unique bare keys, or entry dir
        paths, in the order given, each once. An unknown ref fails (exit 1); a bare key that
        names several entries is a usage error listing their ids (exit 2)."""
        out: list[CacheEntry] = []
        for ref in refs:
            for e in self.find(ref):
                if e not in out:
                    out.append(e)
        return out

    def find(self, ref: str) -> list[CacheEntry]:
        text = ref.strip().rstrip("/")
        eid = self.layout.parse_id(text)
        if eid is not None:
            matches = [e for e in self.entries if e.id == eid]
            if matches:
                return matches
        if self.layout.is_entry_name(text):
            matches = [e for e in self.entries if e.key == text]
            if len(matches) > 1:
                raise UsageError(
                    f"{ref!r} names {len(matches)} entries; give one id: " + ", ".join(str(e.id) for e in matches)
                )
            if matches:
                return matches
        p = Path(ref)
        if ("/" in ref or p.is_absolute()) and os.path.lexists(p):
            real = p.resolve()
            matches = [e for e in self.entries if e.path.resolve() == real]
            if matches:
                return matches
        raise FiAutotuneError(f"no cache entry {ref!r} under {self.root}",
                              hint=tree_of_entry_dir(p) or _other_layout_id(self.layout, text)
                              or "`fi-autotune ls -q` lists the ids")


def _other_layout_id(layout: CacheLayout, text: str) -> str | None:
    """A hint when ``text`` is the id of another layout's entry (``vllm:...`` given to an sglang tree)."""
    prefix, sep, _ = text.partition(":")
    if not sep or prefix == layout.name:
        return None
    other = LAYOUTS.get(prefix)
    if other is None or other.parse_id(text) is None:
        return None
    return (f"it is an id of the {prefix} layout and this command works on the {layout.name} tree: "
            f"give --layout {prefix} where the command takes it")


def tree_of_entry_dir(path: Path) -> str | None:
    """For a directory that is an entry of some layout's tree (a vLLM entry handed to a command
    looking in the SGLang tree): which flags name it, or None. The most specific layout wins
    (a vLLM entry dir also looks like a bare ``vllm-dir`` hash dir one level up)."""
    from autotune_cache.engines.layouts import LAYOUTS

    try:
        if not path.is_dir():
            return None
        real = path.resolve()
    except OSError:
        return None
    for other in sorted(LAYOUTS.values(), key=lambda lay: -(len(lay.base_parts()) + len(lay.levels))):
        depth = len(other.base_parts()) + len(other.levels)
        if len(real.parts) <= depth:
            continue
        root = Path(*real.parts[:-depth])
        if other.parse_member("/".join((*real.parts[-depth:], "x"))) is not None:
            return f"it is an entry of the {other.name} tree at {root}: --layout {other.name} --cache-dir {root}"
    return None


def _finding_for(path: Path, st: os.stat_result, msg: str = "") -> Finding:
    if stat_mod.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        kind, msg = "symlink", msg or f"symlink to {target!r}, not followed"
    elif not (stat_mod.S_ISREG(st.st_mode) or stat_mod.S_ISDIR(st.st_mode)):
        kind, msg = "special", msg or "not a regular file or directory"
    else:
        kind, msg = "foreign", msg or "not part of the cache layout"
    size = st.st_size if stat_mod.S_ISREG(st.st_mode) else 0
    return Finding(path, kind, msg, size, st.st_mtime)


def _scandir(path: Path, sort: bool = True) -> tuple[list[os.DirEntry], str | None]:
    try:
        with os.scandir(path) as it:
            children = list(it)
    except OSError as e:
        return [], f"cannot list: {e.strerror or e}"
    if sort:
        children.sort(key=lambda c: c.name)
    return children, None


def _dir_size(path: Path, limit: int = MAX_SIDE_FILES) -> tuple[int, float, list[Path]]:
    total, newest, files = 0, 0.0, []
    for dirpath, _dirnames, filenames in os.walk(path, followlinks=False):
        for name in filenames:
            if len(files) >= limit:
                return total, newest, files
            p = Path(dirpath) / name
            try:
                st = p.lstat()
            except OSError:
                continue
            if stat_mod.S_ISREG(st.st_mode):
                total += st.st_size
                newest = max(newest, st.st_mtime)
                files.append(p)
    return total, newest, files


def _read_unvouched(path: Path, name: str, st: os.stat_result, parsed: dict[str, RankFile],
                    digests: DigestIndex | None) -> RankFile:
    """Read a data file no manifest vouches for, unless the digest index already knows its
    bytes. Files with the same bytes (every rank of a TP group, usually) are parsed once:
    engine-written trees are mostly identical copies."""
    if digests is not None:
        known = digests.get(st)
        if known is not None:
            sha, configs, meta = known
            return RankFile(path, name, st.st_size, st.st_mtime, st.st_mtime_ns, sha, configs, meta)
    try:
        data = read_regular_file(os.path.join(path, name))
    except OSError as e:
        return RankFile.unreadable(path, name, st, e.strerror or str(e))
    digest = hashlib.sha256(data).hexdigest()
    seen = parsed.get(digest)
    if seen is None:
        seen = parsed[digest] = RankFile.from_bytes(path, name, st, data, digest)
    else:
        seen = RankFile(path, name, st.st_size, st.st_mtime, st.st_mtime_ns, digest, seen.num_configs, seen.metadata,
                        seen.error)
    if digests is not None and seen.error is None:
        digests.learn(st, digest, seen.num_configs, seen.metadata)
    return seen


def manifest_names_other_entry(manifest: Manifest, ids: dict, eid: EntryId) -> bool:
    """Does the manifest name another entry than the directory it is in? Only the levels the
    layout's path has are compared (a ``vllm-dir`` entry has no version or arch level)."""
    return manifest.key != eid.name or any(
        getattr(manifest, f) != ids[f] for f in ("flashinfer_version", "arch") if f in ids)


def scan_entry(
    layout: CacheLayout,
    path: Path,
    eid: EntryId,
    fingerprint: Fingerprint | None = None,
    atime_trusted: bool = True,
    digests: DigestIndex | None = None,
) -> CacheEntry:
    """Read one entry dir. Cheap when a manifest (or the digest index) vouches for unchanged
    data files. A layout whose entries are not rank files scans them itself."""
    own = getattr(layout, "scan_entry", None)
    if own is not None:
        return own(path, eid, fingerprint, atime_trusted)
    ids = layout.id_fields(eid)
    version, arch = ids.get("flashinfer_version"), ids.get("arch")
    children, err = _scandir(path, sort=False)
    if err:
        try:
            mtime = os.lstat(path).st_mtime
        except OSError:
            mtime = 0.0
        return CacheEntry(eid, path, version, arch, None, (), None, EntryStatus.UNREADABLE, (err,),
                          last_modified=mtime, state=(("<unreadable>", mtime),))
    problems: list[str] = []
    notes: list[str] = []
    if len(children) > MAX_ENTRY_CHILDREN:
        problems.append(f"holds {len(children)} names, more than any cache entry (limit {MAX_ENTRY_CHILDREN}): not read")
        children = []
    manifest: Manifest | None = None
    manifest_error: str | None = None
    data_stats: list[tuple[str, os.stat_result]] = []
    engine_files: list[Path] = []
    temp: list[Finding] = []
    foreign: list[Finding] = []
    size = 0
    newest = 0.0
    state = []
    newest_atime = 0.0
    classify, data_kind = layout.classify, NameKind.DATA
    # Hot loop of ``ls`` on large trees: plain strings, Path objects only for rare findings.
    for child in children:
        name = child.name
        try:
            st = child.stat(follow_symlinks=False)
        except OSError as e:
            foreign.append(Finding(path / name, "unreadable", f"cannot stat: {e.strerror or e}"))
            continue
        mode = st.st_mode
        is_reg = S_ISREG(mode)
        if is_reg:
            size += st.st_size
            if st.st_mtime > newest:
                newest = st.st_mtime
        state.append((name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
        kind = classify(name, S_ISDIR(mode))
        if kind is data_kind and is_reg:
            data_stats.append((name, st))
            if st.st_atime > newest_atime:
                newest_atime = st.st_atime
        elif kind is data_kind:
            found = _finding_for(path / name, st)
            foreign.append(found)
            problems.append(f"{name}: named like a data file but {found.message}")
        elif kind is NameKind.MANIFEST and is_reg:
            try:
                manifest = Manifest.from_bytes(read_regular_file(child.path))
            except NewerManifest as e:
                notes.append(f"{MANIFEST_NAME}: {e}; listed from its data files only")
            except (OSError, ValueError) as e:
                manifest_error = str(e)
        elif kind is NameKind.TEMP and is_reg:
            temp.append(Finding(path / name, "temp", "temporary file of an interrupted write", st.st_size, st.st_mtime))
        elif kind is NameKind.ENGINE_SIDE:
            side_size, side_newest, files = _dir_size(path / name)
            size += side_size
            newest = max(newest, side_newest)
            engine_files.extend(files)
        else:
            foreign.append(_finding_for(path / name, st))

    data_stats.sort()
    if len(data_stats) > MAX_RANK_FILES:
        problems.append(f"{len(data_stats)} data files, more than any topology fi-autotune accepts")
        data_stats = []
    records = manifest.rank_files if manifest else {}
    rank_files = []
    parsed: dict[str, RankFile] = {}
    meta = manifest.flashinfer_metadata if manifest else None
    for name, st in data_stats:
        rec = records.get(name)
        if rec is not None and rec.size == st.st_size and rec.mtime_ns == st.st_mtime_ns \
                and (rec.ctime_ns is None or rec.ctime_ns == st.st_ctime_ns):
            rank_files.append(RankFile(path, name, st.st_size, st.st_mtime, st.st_mtime_ns, rec.sha256, rec.configs, meta))
        else:
            rank_files.append(_read_unvouched(path, name, st, parsed, digests))

    topology: Topology | None = None
    if manifest is not None:
        topology = manifest.topology
        if manifest_names_other_entry(manifest, ids, eid):
            manifest_error = (
                f"manifest names {manifest.flashinfer_version}/{manifest.arch}/{manifest.key}, not this directory"
            )
    else:
        try:
            topology = layout.infer_topology([rf.name for rf in rank_files])
        except TopologyError as e:
            problems.append(f"rank file names beyond the bounds: {e}")

    if version is None:
        # Trees that drop the version level (vllm-dir): the files' own _metadata says it, when they agree.
        seen_versions = {v if isinstance(v := (rf.metadata or {}).get("flashinfer_version"), str) else None
                         for rf in rank_files if rf.ok}
        if len(seen_versions) == 1 and (v := seen_versions.pop()) is not None and VERSION_RE.match(v):
            version = v
    status = _status(layout, rank_files, topology, manifest, manifest_error, problems, notes, fingerprint)
    last_used = (newest_atime or None) if atime_trusted else None
    return CacheEntry(
        id=eid,
        path=path,
        flashinfer_version=version,
        arch=arch,
        manifest=manifest if manifest_error is None else None,
        rank_files=tuple(rank_files),
        topology=topology,
        status=status,
        problems=tuple(problems),
        notes=tuple(notes),
        engine_files=tuple(engine_files),
        temp_files=tuple(temp),
        foreign=tuple(foreign),
        size_on_disk=size,
        last_modified=newest,
        last_used=last_used,
        state=tuple(sorted(state)),
    )


def _status(
    layout: CacheLayout,
    rank_files: list[RankFile],
    topology: Topology | None,
    manifest: Manifest | None,
    manifest_error: str | None,
    problems: list[str],
    notes: list[str],
    fingerprint: Fingerprint | None,
) -> EntryStatus:
    """Order of precedence: corrupt > stale > diverged > incomplete > complete."""
    bad = [rf for rf in rank_files if not rf.ok]
    for rf in bad:
        problems.append(f"{rf.name}: {rf.error}")
    if manifest_error:
        problems.append(f"{MANIFEST_NAME}: {manifest_error}")
    if bad or manifest_error or problems:
        return EntryStatus.CORRUPT
    if fingerprint is not None:
        seen: set[int] = set()
        for rf in rank_files:
            if id(rf.metadata) in seen:
                continue  # identical files share one parsed metadata object
            seen.add(id(rf.metadata))
            verdict = fingerprint.compare(rf.metadata)
            if verdict.stale:
                problems.append(f"{rf.name}: FlashInfer in {fingerprint.source} would ignore it ({verdict.describe()})")
                return EntryStatus.STALE
            for k, (saved, _) in verdict.unknown.items():
                note = f"{k}: {saved!r} cannot be checked ({fingerprint.source} does not know its own value)"
                if note not in notes:
                    notes.append(note)
    if topology is not None and len({rf.sha256 for rf in rank_files}) > 1:
        by_name = {rf.name: rf.sha256 for rf in rank_files}
        diverged = [label for label, names in layout.identical_groups(list(by_name), topology)
                    if len({by_name[n] for n in names}) > 1]
        if diverged:
            problems.append(
                f"rank files differ within TP group(s) {', '.join(diverged)}: SGLang would delete them and tune again"
            )
            return EntryStatus.DIVERGED
    disagreement = layout.disagreement(rank_files, notes)
    if disagreement:
        problems.append(disagreement)
        return EntryStatus.DIVERGED
    present = {rf.name for rf in rank_files}
    expected = layout.expected_files(topology) if topology else []
    missing = [n for n in expected if n not in present]
    if missing or not rank_files:
        problems.append(f"missing {len(missing)} of {len(expected)} rank files" if expected else "no rank files")
        return EntryStatus.INCOMPLETE
    return EntryStatus.COMPLETE


# --- walking the tree -----------------------------------------------------------------------

def check_base(layout: CacheLayout, root: Path) -> Path | None:
    """The layout's managed subtree, None if absent; an error if something else is in its place."""
    path = Path(root)
    for part in layout.base_parts():
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise FiAutotuneError(f"cannot read {path}: {e.strerror or e}") from None
        if stat_mod.S_ISLNK(st.st_mode):
            raise FiAutotuneError(f"{path} is a symlink inside the cache tree; fi-autotune does not follow it "
                                  "(point --cache-dir at the real tree)")
        if not stat_mod.S_ISDIR(st.st_mode):
            raise FiAutotuneError(f"{path} is not a directory: this is not a cache tree (it should hold "
                                  f"{'/'.join(layout.base_parts())}/<version>/...)")
    return path


def _tree_level_finding(path: Path, child: os.DirEntry) -> Finding | None:
    """Our own hidden names found between entries."""
    name = child.name
    try:
        st = child.stat(follow_symlinks=False)
    except OSError as e:
        return Finding(path / name, "unreadable", f"cannot stat: {e.strerror or e}")
    p = path / name
    is_dir = stat_mod.S_ISDIR(st.st_mode)
    if TEMP_FILE_RE.match(name) and stat_mod.S_ISREG(st.st_mode):
        return Finding(p, "temp", "temporary file of an interrupted write", st.st_size, st.st_mtime)
    if STAGE_DIR_RE.match(name) and is_dir:
        size, _, _ = _dir_size(p)
        return Finding(p, "stage", "staging dir of a running or interrupted write", size, st.st_mtime)
    if TRASH_DIR_RE.match(name) and is_dir:
        size, _, _ = _dir_size(p)
        return Finding(p, "trash", "an entry being deleted (or whose deletion was interrupted)", size, st.st_mtime)
    return None


def list_entry_dirs(layout: CacheLayout, root: Path) -> tuple[list[tuple[Path, EntryId]], list[Finding]]:
    """(entry dir, id) for every entry of ``layout`` under ``root``, plus what does not belong."""
    findings: list[Finding] = []
    out: list[tuple[Path, EntryId]] = []
    base = check_base(layout, root)
    if base is None:
        return out, findings

    def walk(path: Path, depth: int, parts: tuple[str, ...]) -> None:
        level = layout.levels[depth]
        children, err = _scandir(path)
        if err:
            findings.append(Finding(path, "unreadable", err))
        for child in children:
            name = child.name
            if depth == 0 and (name == LOCKS_DIRNAME or name in layout.skip_names):
                continue
            if depth == 0 and name == JOURNAL_DIRNAME:
                jchildren, _ = _scandir(path / name)
                for j in jchildren:
                    if j.name.endswith(".json"):
                        findings.append(Finding(path / name / j.name, "journal",
                                                "commit record of an interrupted multi-entry write"))
                continue
            # d_type answers the common case (a real directory with a valid name) without a stat.
            if level.valid(name) and child.is_dir(follow_symlinks=False):
                if depth + 1 == len(layout.levels):
                    out.append((path / name, EntryId(layout.name, (*parts, name))))
                else:
                    walk(path / name, depth + 1, (*parts, name))
                continue
            found = _tree_level_finding(path, child)
            if found is None:
                try:
                    st = child.stat(follow_symlinks=False)
                except OSError as e:
                    found = Finding(path / name, "unreadable", f"cannot stat: {e.strerror or e}")
                else:
                    found = _finding_for(path / name, st, "" if not stat_mod.S_ISDIR(st.st_mode) else f"not a {level.name} directory")
            findings.append(found)

    walk(base, 0, ())
    return out, findings


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Scanning allocates many small long-lived objects; the cyclic GC would re-walk them again
    and again (a third of the time on a 10,000-entry tree) without ever finding a cycle."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # What the scan made lives until the command ends: move it out of the collector's sight
        # rather than have the first collection after this walk all of it.
        gc.freeze()
        if enabled:
            gc.enable()


def scan_cache(
    root: Path, layout: CacheLayout | None = None, fingerprint: Fingerprint | None = None
) -> CacheInfo:
    """Scan one layout's tree under ``root``. A missing tree is an empty cache here; commands
    decide whether a missing *root* is an error (``cli.params``)."""
    layout = layout or default_layout()
    trusted = policy_for(root).trusted
    with _no_cyclic_gc():
        entry_dirs, findings = list_entry_dirs(layout, root)
        digests = DigestIndex.for_root(root, layout.name) if entry_dirs else None
        entries = tuple(scan_entry(layout, p, eid, fingerprint, trusted, digests) for p, eid in entry_dirs)
    if digests is not None:
        digests.save()
    return CacheInfo(Path(root), layout, entries, tuple(findings))


T = TypeVar("T")

#: Below this many entries a second process costs more than it saves.
PARALLEL_MIN_ENTRIES = 1000


def map_entries(
    root: Path,
    fn: Callable[[CacheEntry], T],
    layout: CacheLayout | None = None,
    fingerprint: Fingerprint | None = None,
    jobs: int | None = None,
) -> tuple[list[T], list[Finding]]:
    """``[fn(entry) for entry in scan]``, spread over forked processes on large trees.

    Scanning is syscalls plus small-object work that one core cannot make faster; ``ls`` on a
    10,000-entry tree needs both cores to stay interactive. Children return only ``fn``'s
    (small, picklable) results; any child failure falls back to doing its share here.
    """
    layout = layout or default_layout()
    trusted = policy_for(root).trusted
    digests: DigestIndex | None = None

    def run(chunk):
        return [fn(scan_entry(layout, p, eid, fingerprint, trusted, digests)) for p, eid in chunk]

    with _no_cyclic_gc():
        entry_dirs, findings = list_entry_dirs(layout, root)
        digests = DigestIndex.for_root(root, layout.name) if entry_dirs else None
        if jobs is None:
            jobs = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
        if jobs <= 1 or len(entry_dirs) < PARALLEL_MIN_ENTRIES or not hasattr(os, "fork"):
            results = run(entry_dirs)
            if digests is not None:
                digests.save()
            return results, findings
        chunks = [entry_dirs[i::jobs] for i in range(jobs)]
        children = []
        for chunk in chunks[1:]:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # child
                os.close(r)
                code = 0
                try:
                    with os.fdopen(w, "wb") as out:
                        part = run(chunk)
                        pickle.dump((part, digests.delta() if digests else None), out, protocol=pickle.HIGHEST_PROTOCOL)
                except BaseException:
                    code = 1
                os._exit(code)
            os.close(w)
            children.append((pid, r, chunk))
        results = [run(chunks[0])]
        for pid, r, chunk in children:
            with os.fdopen(r, "rb") as f:
                data = f.read()
            _, status = os.waitpid(pid, 0)
            try:
                if status != 0:
                    raise ValueError("child failed")
                part, delta = pickle.loads(data)
                if digests is not None and delta is not None:
                    digests.merge(delta)
                results.append(part)
            except Exception:
                results.append(run(chunk))
    if digests is not None:
        digests.save()
    # Interleave back to the listing order.
    ordered: list[T] = []
    for i in range(len(entry_dirs)):
        ordered.append(results[i % jobs][i // jobs])
    return ordered, findings
