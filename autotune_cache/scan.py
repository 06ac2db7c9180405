"""Scanning the cache tree into frozen records, in the manner of ``huggingface_hub.scan_cache_dir``.

Nothing here writes, follows a symlink, or opens anything that is not a regular file; odd
things found in the tree become ``Finding``s, never exceptions, so ``ls`` always finishes.
"""

from __future__ import annotations

import contextlib
import gc
import operator
import os
import pickle
import stat as stat_mod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

from . import layout
from .humanize import format_age, format_size
from .layout import RankName, Topology
from .manifest import Manifest
from .rankfile import RankFile, read_regular_file


class EntryStatus:
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    DIVERGED = "diverged"
    CORRUPT = "corrupt"
    STALE = "stale"
    ALL = (COMPLETE, INCOMPLETE, DIVERGED, CORRUPT, STALE)


@dataclass(frozen=True)
class Finding:
    """Something in the tree that is not a well-formed part of an entry."""

    path: Path
    kind: str  # foreign | symlink | special | unreadable | temp | stage
    message: str
    size_on_disk: int = 0
    mtime: float = 0.0

    def to_dict(self) -> dict:
        return {"path": str(self.path), "kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class CacheEntry:
    """One key dir: ``<root>/flashinfer/autotune/<version>/<arch>/<key>``."""

    path: Path
    key: str
    flashinfer_version: str
    arch: str
    manifest: Manifest | None
    rank_files: tuple[RankFile, ...]
    topology: Topology | None
    status: str
    problems: tuple[str, ...] = ()
    engine_files: tuple[Path, ...] = ()
    temp_files: tuple[Finding, ...] = ()
    foreign: tuple[Finding, ...] = ()
    size_on_disk: int = 0
    last_modified: float = 0.0
    fingerprint: tuple = field(default=(), repr=False, compare=False)

    @property
    def id(self) -> str:
        """Unique name of the entry in a tree; the bare key may repeat across versions/arches."""
        return f"{self.flashinfer_version}/{self.arch}/{self.key}"

    @property
    def model(self) -> str | None:
        return self.manifest.model if self.manifest else None

    @property
    def expected_files(self) -> tuple[str, ...]:
        if self.manifest:
            return tuple(self.manifest.expected_files)
        return tuple(self.topology.rank_files()) if self.topology else ()

    @property
    def present_expected(self) -> int:
        names = {rf.name for rf in self.rank_files if rf.ok}
        return sum(1 for name in self.expected_files if name in names)

    @property
    def ranks_str(self) -> str:
        return f"{self.present_expected}/{len(self.expected_files)}"

    @property
    def num_configs(self) -> int:
        return max((rf.num_configs for rf in self.rank_files if rf.ok), default=0)

    @property
    def parallel_str(self) -> str:
        t = self.topology
        if t is None:
            return "-"
        ep = str(self.manifest.key_fields.ep) if self.manifest else "?"
        replicas = "" if t.dp_attention or t.dp == 1 else "r"
        return f"{t.tp}/{t.pp}/{t.dp}{replicas}/{ep}"

    @property
    def size_on_disk_str(self) -> str:
        return format_size(self.size_on_disk)

    @property
    def last_modified_str(self) -> str:
        return format_age(self.last_modified)

    @property
    def metadata(self) -> dict:
        for rf in self.rank_files:
            if rf.ok and rf.metadata:
                return rf.metadata
        return self.manifest.flashinfer_metadata if self.manifest else {}

    def to_dict(self) -> dict:
        m = self.manifest
        t = self.topology
        return {
            "id": self.id,
            "key": self.key,
            "path": str(self.path),
            "model": self.model,
            "flashinfer_version": self.flashinfer_version,
            "arch": self.arch,
            "schema": m.schema if m else None,
            "key_fields": m.key_fields.to_dict() if m else None,
            "topology": t.to_dict() if t else None,
            "ranks_present": self.present_expected,
            "ranks_expected": len(self.expected_files),
            "configs": self.num_configs,
            "size_on_disk": self.size_on_disk,
            "last_modified": self.last_modified,
            "status": self.status,
            "problems": list(self.problems),
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
        """Temp files and staging dirs anywhere in the tree (entries' and loose ones)."""
        loose = tuple(f for f in self.findings if f.kind in ("temp", "stage"))
        return loose + tuple(t for e in self.entries for t in e.temp_files)

    def find(self, ref: str) -> list[CacheEntry]:
        """Entries named by a key, a ``version/arch/key`` id, or a key dir path."""
        ref = ref.rstrip("/")
        matches = [e for e in self.entries if ref in (e.key, e.id)]
        if not matches:
            p = Path(ref)
            if p.exists():
                real = p.resolve()
                matches = [e for e in self.entries if e.path.resolve() == real]
        return matches


MetadataCheck = Callable[[dict], "dict | None"]


def _finding_for(path: Path, st: os.stat_result, kind: str | None = None, msg: str = "") -> Finding:
    if kind is None:
        if stat_mod.S_ISLNK(st.st_mode):
            kind, msg = "symlink", msg or f"symlink to {os.readlink(path)!r}, not followed"
        elif not (stat_mod.S_ISREG(st.st_mode) or stat_mod.S_ISDIR(st.st_mode)):
            kind, msg = "special", msg or "not a regular file or directory"
        else:
            kind, msg = "foreign", msg or "not part of the cache layout"
    size = st.st_size if stat_mod.S_ISREG(st.st_mode) else 0
    return Finding(path, kind, msg, size, st.st_mtime)


_BY_NAME = operator.attrgetter("name")


def _scandir(path: Path, sort: bool = True) -> tuple[list[os.DirEntry], str | None]:
    try:
        with os.scandir(path) as it:
            return (sorted(it, key=_BY_NAME) if sort else list(it)), None
    except OSError as e:
        return [], f"cannot list: {e.strerror or e}"


def _dir_size(path: Path) -> tuple[int, float, list[Path]]:
    total, newest, files = 0, 0.0, []
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in filenames:
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


def scan_entry(
    path: Path, flashinfer_version: str, arch: str, check_env: MetadataCheck | None = None
) -> CacheEntry:
    """Read one key dir. Cheap when a manifest vouches for unchanged rank files."""
    key = path.name
    children, err = _scandir(path, sort=False)
    problems: list[str] = []
    if err:
        problems.append(err)
    manifest: Manifest | None = None
    manifest_error: str | None = None
    rank_stats: list[tuple[str, os.stat_result]] = []
    engine_files: list[Path] = []
    temp: list[Finding] = []
    foreign: list[Finding] = []
    size = 0
    newest = 0.0
    fingerprint = []
    # Hot loop of ``ls`` on large trees: plain strings, Path objects only for rare findings.
    for child in children:
        name = child.name
        try:
            st = child.stat(follow_symlinks=False)
        except OSError as e:
            foreign.append(Finding(path / name, "unreadable", f"cannot stat: {e.strerror or e}"))
            continue
        is_reg = stat_mod.S_ISREG(st.st_mode)
        if is_reg:
            size += st.st_size
            if st.st_mtime > newest:
                newest = st.st_mtime
        fingerprint.append((name, st.st_size, st.st_mtime_ns, st.st_ino))
        if RankName.parse(name):
            rank_stats.append((name, st))
            continue
        p = path / name
        if name == layout.MANIFEST_NAME and is_reg:
            try:
                manifest = Manifest.from_bytes(read_regular_file(child.path))
            except (OSError, ValueError) as e:
                manifest_error = str(e)
        elif layout.TEMP_FILE_RE.match(name) and is_reg:
            temp.append(Finding(p, "temp", "temporary file of an interrupted write", st.st_size, st.st_mtime))
        elif name == layout.ENGINE_RUNS_DIRNAME and stat_mod.S_ISDIR(st.st_mode):
            run_size, run_newest, files = _dir_size(p)
            size += run_size
            newest = max(newest, run_newest)
            engine_files.extend(files)
        else:
            foreign.append(_finding_for(p, st))

    rank_stats.sort()
    records = manifest.rank_files if manifest else {}
    rank_files = []
    for name, st in rank_stats:
        rec = records.get(name)
        if rec is not None and rec.size == st.st_size and rec.mtime_ns == st.st_mtime_ns and stat_mod.S_ISREG(st.st_mode):
            rank_files.append(
                RankFile(path, name, st.st_size, st.st_mtime, st.st_mtime_ns, rec.sha256, rec.configs,
                         manifest.flashinfer_metadata)
            )
        else:
            rank_files.append(RankFile.read(path, name, st))

    if manifest is not None:
        topology: Topology | None = manifest.topology
        if manifest.key != key or manifest.flashinfer_version != flashinfer_version or manifest.arch != arch:
            manifest_error = (
                f"manifest names {manifest.flashinfer_version}/{manifest.arch}/{manifest.key}, "
                f"not this directory"
            )
    else:
        names = [RankName.parse(rf.name) for rf in rank_files]
        topology = Topology.infer([n for n in names if n is not None])

    status = _status(rank_files, topology, manifest, manifest_error, problems, check_env)
    return CacheEntry(
        path=path,
        key=key,
        flashinfer_version=flashinfer_version,
        arch=arch,
        manifest=manifest if manifest_error is None else None,
        rank_files=tuple(rank_files),
        topology=topology,
        status=status,
        problems=tuple(problems),
        engine_files=tuple(engine_files),
        temp_files=tuple(temp),
        foreign=tuple(foreign),
        size_on_disk=size,
        last_modified=newest,
        fingerprint=tuple(sorted(fingerprint)),
    )


def _status(
    rank_files: list[RankFile],
    topology: Topology | None,
    manifest: Manifest | None,
    manifest_error: str | None,
    problems: list[str],
    check_env: MetadataCheck | None,
) -> str:
    """Order of precedence: corrupt > stale > diverged > incomplete > complete."""
    bad = [rf for rf in rank_files if not rf.ok]
    for rf in bad:
        problems.append(f"{rf.name}: {rf.error}")
    if manifest_error:
        problems.append(f"{layout.MANIFEST_NAME}: {manifest_error}")
    if bad or manifest_error:
        return EntryStatus.CORRUPT
    if check_env is not None:
        for rf in rank_files:
            mismatch = check_env(rf.metadata)
            if mismatch:
                problems.append(
                    f"{rf.name}: FlashInfer here would ignore it ("
                    + ", ".join(f"{k}: {old!r} vs {new!r}" for k, (old, new) in mismatch.items())
                    + ")"
                )
                return EntryStatus.STALE
    digests = {rf.sha256 for rf in rank_files}
    if topology is not None and len(digests) > 1:  # all identical (the usual case): nothing diverged
        groups: dict[tuple, set[str]] = {}
        for rf in rank_files:
            rank = RankName.parse(rf.name)
            groups.setdefault(topology.tp_group_of(rank), set()).add(rf.sha256 or "")
        diverged = sorted(g for g, digests in groups.items() if len(digests) > 1)
        if diverged:
            problems.append(
                "rank files differ within TP group(s) "
                + ", ".join(f"pp{pp}/replica{r}" for pp, r in diverged)
                + ": SGLang would delete them and tune again"
            )
            return EntryStatus.DIVERGED
    present = {rf.name for rf in rank_files}
    expected = manifest.expected_files if manifest else (topology.rank_files() if topology else [])
    missing = [n for n in expected if n not in present]
    if missing or not rank_files:
        problems.append(f"missing {len(missing)} of {len(expected)} rank files" if expected else "no rank files")
        return EntryStatus.INCOMPLETE
    return EntryStatus.COMPLETE


def _iter_dirs(path: Path, valid: Callable[[str], bool], findings: list[Finding], what: str) -> Iterable[tuple[str, Path]]:
    children, err = _scandir(path)
    if err:
        findings.append(Finding(path, "unreadable", err))
    for child in children:
        name = child.name
        if name == layout.LOCKS_DIRNAME and what == "flashinfer version":
            continue
        # d_type answers the common case (a real directory with a valid name) without a stat.
        if valid(name) and child.is_dir(follow_symlinks=False):
            yield name, path / name
            continue
        p = path / name
        try:
            st = child.stat(follow_symlinks=False)
        except OSError as e:
            findings.append(Finding(p, "unreadable", f"cannot stat: {e.strerror or e}"))
            continue
        if layout.TEMP_FILE_RE.match(name) and stat_mod.S_ISREG(st.st_mode):
            findings.append(Finding(p, "temp", "temporary file of an interrupted write", st.st_size, st.st_mtime))
        elif layout.STAGE_DIR_RE.match(name) and stat_mod.S_ISDIR(st.st_mode):
            size, _, _ = _dir_size(p)
            findings.append(Finding(p, "stage", "staging dir of an interrupted write", size, st.st_mtime))
        else:
            findings.append(_finding_for(p, st, msg="" if not stat_mod.S_ISDIR(st.st_mode) else f"not a {what} directory"))


def _is_arch(name: str) -> bool:
    return bool(layout.ARCH_RE.match(name))


def _is_key(name: str) -> bool:
    return bool(layout.KEY_RE.match(name))


def list_key_dirs(root: Path) -> tuple[list[tuple[Path, str, str]], list[Finding]]:
    """(key dir, flashinfer version, arch) for every key dir, plus what does not belong."""
    base = layout.autotune_dir(root)
    findings: list[Finding] = []
    out: list[tuple[Path, str, str]] = []
    if not base.is_dir():
        return out, findings
    for version, vpath in _iter_dirs(base, layout.is_valid_version, findings, "flashinfer version"):
        for arch, apath in _iter_dirs(vpath, _is_arch, findings, "sm<XY> arch"):
            for _, kpath in _iter_dirs(apath, _is_key, findings, "cache key"):
                out.append((kpath, version, arch))
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
        if enabled:
            gc.enable()


def scan_cache(root: Path, check_env: MetadataCheck | None = None) -> CacheInfo:
    """Scan ``<root>/flashinfer/autotune``. A missing tree is an empty cache, not an error."""
    with _no_cyclic_gc():
        key_dirs, findings = list_key_dirs(root)
        entries = tuple(scan_entry(p, v, a, check_env) for p, v, a in key_dirs)
    return CacheInfo(Path(root), entries, tuple(findings))


T = TypeVar("T")

#: Below this many key dirs a second process costs more than it saves.
PARALLEL_MIN_ENTRIES = 1000


def map_entries(
    root: Path, fn: Callable[[CacheEntry], T], check_env: MetadataCheck | None = None, jobs: int | None = None
) -> tuple[list[T], list[Finding]]:
    """``[fn(entry) for entry in scan]``, spread over forked processes on large trees.

    Scanning is syscalls plus small-object work that one core cannot make faster; ``ls`` on a
    10,000-entry tree needs both cores to stay interactive. Children return only ``fn``'s
    (small, picklable) results; any child failure falls back to doing its share here.
    """
    with _no_cyclic_gc():
        key_dirs, findings = list_key_dirs(root)
        jobs = jobs if jobs is not None else min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
        if jobs <= 1 or len(key_dirs) < PARALLEL_MIN_ENTRIES or not hasattr(os, "fork"):
            return [fn(scan_entry(p, v, a, check_env)) for p, v, a in key_dirs], findings
        chunks = [key_dirs[i::jobs] for i in range(jobs)]
        children = []
        for chunk in chunks[1:]:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # child
                os.close(r)
                code = 0
                try:
                    with os.fdopen(w, "wb") as out:
                        pickle.dump([fn(scan_entry(p, v, a, check_env)) for p, v, a in chunk], out, protocol=pickle.HIGHEST_PROTOCOL)
                except BaseException:
                    code = 1
                os._exit(code)
            os.close(w)
            children.append((pid, r, chunk))
        results = [[fn(scan_entry(p, v, a, check_env)) for p, v, a in chunks[0]]]
        for pid, r, chunk in children:
            with os.fdopen(r, "rb") as f:
                data = f.read()
            _, status = os.waitpid(pid, 0)
            try:
                if status != 0:
                    raise ValueError("child failed")
                results.append(pickle.loads(data))
            except Exception:
                results.append([fn(scan_entry(p, v, a, check_env)) for p, v, a in chunk])
    # Interleave back to the listing order.
    ordered: list[T] = []
    for i in range(len(key_dirs)):
        ordered.append(results[i % jobs][i // jobs])
    return ordered, findings
