"""Reading one entry directory into a ``CacheEntry``, in the manner of
``huggingface_hub.scan_cache_dir``.

Nothing here writes, follows a symlink, blocks on a FIFO, or reads more than a bounded amount;
odd things found become ``Finding``s or entry problems, never exceptions, so ``ls`` always
finishes. The shape of an entry (which names are data files) comes from its ``CacheLayout``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISDIR, S_ISREG

from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.autotuner.rankfile import RankFile, read_regular_file, refused_by_system
from autotune_cache.plan.topology import MAX_RANK_FILES, Topology
from autotune_cache.tree.layouts.memo import memo_of
from autotune_cache.tree.scanner.digestindex import DigestIndex, stats_digest
from autotune_cache.tree.crashsafe.dirs import dir_size, list_dir
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId, NameKind
from autotune_cache.tree.layouts.own_names import MANIFEST_NAME
from autotune_cache.autotuner.installed import VERSION_RE
from autotune_cache.tree.manifest import Manifest, NewerManifest
from autotune_cache.tree.records import CacheEntry, Finding, finding_for
from autotune_cache.tree.status import EntryStatus

#: Why an entry without a manifest is "unverified", not "complete".
INFERRED_NOTE = ("no manifest: the rank count is inferred from the files present, so a missing last rank "
                 "cannot be seen (rewrite it with `fi-autotune warm` to verify it)")

_new_tuple = tuple.__new__

#: An entry dir holding more names than this is not a cache entry (its files are not read).
MAX_ENTRY_CHILDREN = MAX_RANK_FILES + 64


@dataclass
class _Listing:
    """What one pass over an entry dir's names found (before any data file is read)."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    manifest: Manifest | None = None
    manifest_error: str | None = None
    manifest_unknown: bool = False  # the system would not let it be read
    data_stats: list[tuple[str, os.stat_result]] = field(default_factory=list)
    engine_files: list[Path] = field(default_factory=list)
    temp: list[Finding] = field(default_factory=list)
    foreign: list[Finding] = field(default_factory=list)
    size: int = 0
    newest: float = 0.0
    newest_atime: float = 0.0
    state: list = field(default_factory=list)


def _read_unvouched(path: Path, name: str, st: os.stat_result, parsed: dict[str, RankFile]) -> RankFile:
    """Read a data file no manifest vouches for. Files with the same bytes (every rank of a TP
    group, usually) are parsed once: engine-written trees are mostly identical copies."""
    try:
        data = read_regular_file(os.path.join(path, name))
    except OSError as e:
        return RankFile.unreadable(path, name, st, e)
    digest = hashlib.sha256(data).hexdigest()
    seen = parsed.get(digest)
    if seen is None:
        seen = parsed[digest] = RankFile.from_bytes(path, name, st, data, digest)
    else:
        seen = RankFile(path, name, st.st_size, st.st_mtime, st.st_mtime_ns, digest, seen.num_configs, seen.metadata,
                        seen.error)
    return seen


def _read_entry_files(path: Path, files: list[tuple[str, os.stat_result]], digests: DigestIndex | None) -> list[RankFile]:
    """The data files no manifest vouches for, from the digest index where it knows the entry's
    files exactly as ``stat`` shows them now (one lookup per entry), else read (and learned)."""
    key = None
    if digests is not None:
        key = stats_digest(files)
        known = digests.get_entry(key, len(files))
        if known is not None:
            # tuple.__new__ with every field: RankFile's generated __new__ is a Python frame per file
            return [_new_tuple(RankFile, (path, name, st.st_size, st.st_mtime, st.st_mtime_ns, sha, configs, meta, None,
                                                 False))
                    for (name, st), (sha, configs, meta) in zip(files, known)]
    parsed: dict[str, RankFile] = {}
    read = [_read_unvouched(path, name, st, parsed) for name, st in files]
    if key is not None and all(rf.error is None for rf in read):
        digests.learn_entry(key, [(rf.sha256, rf.num_configs, rf.metadata) for rf in read])
    return read


def manifest_names_other_entry(manifest: Manifest, ids: dict, eid: EntryId) -> bool:
    """Does the manifest name another entry than the directory it is in? Only the levels the
    layout's path has are compared (a ``vllm-dir`` entry has no version or arch level)."""
    return manifest.key != eid.name or any(
        getattr(manifest, f) != ids[f] for f in ("flashinfer_version", "arch") if f in ids)


def _gone_now(path: Path) -> bool:
    """Is the entry dir itself no longer there (``lstat``: no such name)? Deleted, or renamed into
    a trash dir by ``rm``/``prune``, since the walk listed it. Any other answer (there, or there
    again, or an error of its own) leaves what failed the entry's problem to report."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def _unreadable_entry(path: Path, eid: EntryId, ids: dict, err: str) -> CacheEntry:
    try:
        mtime = os.lstat(path).st_mtime
    except OSError:
        mtime = 0.0
    return CacheEntry(eid, path, ids.get("flashinfer_version"), ids.get("arch"), None, (), None,
                      EntryStatus.UNREADABLE, (err,), last_modified=mtime, state=(("<unreadable>", mtime),))


def _list_entry(layout: CacheLayout, path: Path, children: list[os.DirEntry]) -> _Listing:
    """One pass over the names of an entry dir: stats, kinds, the manifest; no data file read.
    Hot loop of ``ls`` on large trees: plain strings, Path objects only for rare findings."""
    out = _Listing()
    problems, notes, data_stats, temp, foreign, state = (out.problems, out.notes, out.data_stats, out.temp,
                                                         out.foreign, out.state)
    size, newest, newest_atime = 0, 0.0, 0.0
    data_kind = NameKind.DATA
    memo = memo_of(layout)
    file_kinds = memo.kinds(False)  # the common case (a regular file seen before) without a call
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
            kind = file_kinds.get(name) or memo.kind(name, False)
        else:
            kind = memo.kind(name, S_ISDIR(mode))
        state.append((name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
        if kind is data_kind and is_reg:
            data_stats.append((name, st))
            if st.st_atime > newest_atime:
                newest_atime = st.st_atime
        elif kind is data_kind:
            found = finding_for(path / name, st)
            foreign.append(found)
            problems.append(f"{name}: named like a data file but {found.message}")
        elif kind is NameKind.MANIFEST and is_reg:
            try:
                out.manifest = Manifest.from_bytes(read_regular_file(child.path))
            except NewerManifest as e:
                notes.append(f"{MANIFEST_NAME}: {e}; listed from its data files only")
            except (OSError, ValueError) as e:
                out.manifest_error = str(e)
                out.manifest_unknown = refused_by_system(e)
        elif kind is NameKind.TEMP and is_reg:
            temp.append(Finding(path / name, "temp", "temporary file of an interrupted write", st.st_size, st.st_mtime))
        elif kind is NameKind.ENGINE_SIDE:
            side_size, side_newest, files = dir_size(path / name)
            size += side_size
            newest = max(newest, side_newest)
            out.engine_files.extend(files)
        else:
            foreign.append(finding_for(path / name, st))
    out.size, out.newest, out.newest_atime = size, newest, newest_atime
    return out


def _rank_files(path: Path, data_stats: list, manifest: Manifest | None, digests: DigestIndex | None) -> list[RankFile]:
    """The data files, vouched for by the manifest's records where their stat is unchanged."""
    if manifest is None:
        return _read_entry_files(path, data_stats, digests) if data_stats else []
    records = manifest.rank_files
    meta = manifest.flashinfer_metadata
    rank_files: list = []
    unvouched: list[tuple[int, tuple]] = []
    for name, st in data_stats:
        rec = records.get(name)
        if rec is not None and rec.size == st.st_size and rec.mtime_ns == st.st_mtime_ns \
                and (rec.ctime_ns is None or rec.ctime_ns == st.st_ctime_ns):
            rank_files.append(RankFile(path, name, st.st_size, st.st_mtime, st.st_mtime_ns, rec.sha256, rec.configs, meta))
        else:
            unvouched.append((len(rank_files), (name, st)))
            rank_files.append(None)
    if unvouched:
        for (i, _), rf in zip(unvouched, _read_entry_files(path, [f for _, f in unvouched], digests)):
            rank_files[i] = rf
    return rank_files


def _version_from_files(rank_files: list[RankFile]) -> str | None:
    """Trees that drop the version level (vllm-dir): the files' own _metadata says it, when they agree."""
    seen_versions = {v if isinstance(v := (rf.metadata or {}).get("flashinfer_version"), str) else None
                     for rf in rank_files if rf.ok}
    if len(seen_versions) == 1 and (v := seen_versions.pop()) is not None and VERSION_RE.match(v):
        return v
    return None


def scan_entry(
    layout: CacheLayout,
    path: Path,
    eid: EntryId,
    fingerprint: Fingerprint | None = None,
    atime_trusted: bool = True,
    digests: DigestIndex | None = None,
    skip_gone: bool = False,
) -> CacheEntry | None:
    """Read one entry dir. Cheap when a manifest (or the digest index) vouches for unchanged
    data files. A layout whose entries are not rank files scans them itself.

    ``skip_gone`` (a scan of the tree, whose walk listed this dir a moment ago): None if the entry
    dir no longer exists (a concurrent ``rm``/``prune`` took it), rather than an entry that is
    unreadable. Without it (one named entry) such an entry is ``unreadable``."""
    own = layout.scan_entry(path, eid, fingerprint, atime_trusted)
    if own is not None:
        return own
    ids = layout.id_fields(eid)
    children, err = list_dir(path, sort=False)
    if err:
        if skip_gone and _gone_now(path):
            return None
        return _unreadable_entry(path, eid, ids, err)
    if len(children) > MAX_ENTRY_CHILDREN:
        found = _Listing(problems=[f"holds {len(children)} names, more than any cache entry "
                                   f"(limit {MAX_ENTRY_CHILDREN}): not read"])
    else:
        found = _list_entry(layout, path, children)
    problems, manifest, manifest_error = found.problems, found.manifest, found.manifest_error
    data_stats = sorted(found.data_stats)
    if len(data_stats) > MAX_RANK_FILES:
        problems.append(f"{len(data_stats)} data files, more than any topology fi-autotune accepts")
        data_stats = []
    rank_files = _rank_files(path, data_stats, manifest, digests)
    topology: Topology | None = None
    if manifest is not None:
        topology = manifest.topology
        if manifest_names_other_entry(manifest, ids, eid):
            manifest_error = (
                f"manifest names {manifest.flashinfer_version}/{manifest.arch}/{manifest.key}, not this directory"
            )
    else:
        topology, beyond = memo_of(layout).topology(tuple([rf.name for rf in rank_files]))
        if beyond is not None:
            problems.append(f"rank file names beyond the bounds: {beyond}")
    version = ids.get("flashinfer_version") or _version_from_files(rank_files)
    status = entry_status(layout, rank_files, topology, manifest, manifest_error, problems, found.notes, fingerprint,
                          inferred=manifest is None, unknown=found.manifest_unknown)
    if skip_gone and (status is not EntryStatus.COMPLETE or found.foreign) and _gone_now(path):
        # renamed away by rm/prune while its names were read: what failed inside was the move
        return None
    return CacheEntry.scanned(
        id=eid, path=path, flashinfer_version=version, arch=ids.get("arch"),
        manifest=manifest if manifest_error is None else None, rank_files=tuple(rank_files), topology=topology,
        status=status, problems=tuple(problems), notes=tuple(found.notes), engine_files=tuple(found.engine_files),
        temp_files=tuple(found.temp), foreign=tuple(found.foreign), size_on_disk=found.size,
        last_modified=found.newest, last_used=(found.newest_atime or None) if atime_trusted else None,
        state=tuple(sorted(found.state)),
    )


def entry_status(
    layout: CacheLayout,
    rank_files: list[RankFile],
    topology: Topology | None,
    manifest: Manifest | None,
    manifest_error: str | None,
    problems: list[str],
    notes: list[str],
    fingerprint: Fingerprint | None,
    inferred: bool = False,
    unknown: bool = False,
) -> EntryStatus:
    """Order of precedence: unreadable > corrupt > stale > diverged > incomplete > unverified >
    complete.

    ``inferred``: the topology was guessed from the file names (no manifest). The files present
    may then all agree and still be short of what the engine reads, so the entry is unverified.
    ``unknown``: the manifest could not be read (permissions, I/O); with a data file the same,
    the entry is unreadable, never corrupt: ``prune`` deletes corrupt entries, and a file this
    user may not read (an engine's 0600 file, a cron job of another user) may be whole."""
    bad = [rf for rf in rank_files if rf.error is not None]  # not ``rf.ok``: a property call per file
    for rf in bad:
        problems.append(f"{rf.name}: {rf.error}")
    if manifest_error:
        problems.append(f"{MANIFEST_NAME}: {manifest_error}")
    if unknown or any(rf.unknown for rf in bad):
        return EntryStatus.UNREADABLE
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
    expected = memo_of(layout).expected(topology) if topology else ()
    missing = [n for n in expected if n not in present]
    if missing or not rank_files:
        problems.append(f"missing {len(missing)} of {len(expected)} rank files" if expected else "no rank files")
        return EntryStatus.INCOMPLETE
    if inferred:
        notes.append(INFERRED_NOTE)
        return EntryStatus.UNVERIFIED
    return EntryStatus.COMPLETE
