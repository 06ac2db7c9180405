"""Reading ``.tar.gz`` bundles back into a tree (``export.py`` writes them).

Import treats the archive as hostile: every member is checked (layout name, no absolute path,
no ``..``, regular files only, per-member, total and compression-ratio caps, JSON that is a
FlashInfer cache or our manifest, manifest consistent with its entry) while it is streamed into
staging dirs, and the whole archive is then committed all-or-nothing (``txn.Transaction``). A
layout others write into while they run (FlashInfer's managed store, ``data_dirs``) is checked
whole, then merged file by file (``_import_merged``).
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import BinaryIO, Callable

from autotune_cache.errors import FiAutotuneError, os_error_message
from autotune_cache.plan.entry_key import key_schemas
from autotune_cache.registry import layouts
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId, NameKind
from autotune_cache.tree.layouts.own_names import JOURNAL_DIRNAME, LOCKS_DIRNAME, STAGE_DIR_RE, TEMP_FILE_RE, TRASH_DIR_RE
from autotune_cache.tree.manifest import Manifest, NewerManifest
from autotune_cache.autotuner.rankfile import MAX_RANK_FILE_BYTES, parse_cache_bytes
from autotune_cache.tree.scanner.entry_scan import manifest_names_other_entry
from autotune_cache.tree.crashsafe.txn import Transaction
from autotune_cache.tree.writer import replace_policy

#: Members in one archive: 8 files per entry for ~12,000 entries.
MAX_MEMBERS = 100_000
#: Uncompressed bytes in one archive. Real entries are 0.1-1 MB (8 rank files of 15-110 KB).
MAX_TOTAL_BYTES = 4 << 30
#: Uncompressed / compressed. Real bundles compress 5-15x (JSON with repeated keys; gzip's
#: 32 KB window cannot share bytes across 100 KB rank files); whitespace bombs reach 1000x.
MAX_RATIO = 100
#: The ratio is checked once this much has been decompressed (small archives are never bombs).
RATIO_GRACE_BYTES = 8 << 20


# --- import ----------------------------------------------------------------------------------

class _Counting(io.RawIOBase):
    """Counts the compressed bytes the tar reader pulls, for the ratio cap."""

    def __init__(self, f: BinaryIO):
        self.f = f
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.f.read(len(b))
        n = len(data)
        b[:n] = data
        self.count += n
        return n


@dataclass
class ImportPlan:
    """What reading an archive found: staged entries plus members skipped with a note."""

    skipped: list[tuple[str, str]] = field(default_factory=list)
    incomplete: list[tuple[str, str]] = field(default_factory=list)
    #: Every entry this archive has a member of (``pull`` holds a bundle to the one it names).
    entries: set[EntryId] = field(default_factory=set)


@dataclass(frozen=True)
class ImportResult:
    imported: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    refused: tuple[tuple[str, str], ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()  # (member, why) left out of the archive with a note
    incomplete: tuple[tuple[str, str], ...] = ()  # (entry, what) imported though incomplete

    def to_dict(self) -> dict:
        return {
            "imported": list(self.imported),
            "unchanged": list(self.unchanged),
            "refused": [{"entry": e, "reason": r} for e, r in self.refused],
            "skipped_members": [{"member": m, "reason": r} for m, r in self.skipped],
            "incomplete": [{"entry": e, "reason": r} for e, r in self.incomplete],
        }


def _ours_to_skip(parts: tuple[str, ...], base: tuple[str, ...]) -> str | None:
    """Why a member of a plain ``tar czf x.tgz -C ROOT flashinfer`` is left out, or None."""
    rest = parts[len(base):] if parts[: len(base)] == base else ()
    if not rest:
        return None
    if rest[0] in (LOCKS_DIRNAME, JOURNAL_DIRNAME):
        return "fi-autotune's lock or journal file, not a cache file"
    if any(STAGE_DIR_RE.match(p) or TRASH_DIR_RE.match(p) for p in rest):
        return "part of an interrupted write, not a cache file"
    if TEMP_FILE_RE.match(rest[-1]):
        return "a temporary file"
    if len(rest) >= 2 and rest[-2] == "runs":
        return "the engine's per-run record, which it never reads back"
    return None


def _check_name(name: str) -> None:
    if name.startswith("/") or "\\" in name or "\x00" in name:
        raise FiAutotuneError(f"archive member {name!r}: absolute or malformed path")
    parts = PurePosixPath(name).parts
    if ".." in parts or "." in parts:
        raise FiAutotuneError(f"archive member {name!r}: path traversal")


def _checked_member(layout: CacheLayout, member: tarfile.TarInfo, name: str) -> tuple[EntryId, str, NameKind]:
    """(entry, file name, kind) of a regular member that is a data file or manifest of the
    layout, within the size bound; raises for anything else (links, foreign paths, big files)."""
    if not member.isreg():
        kind = "link" if (member.issym() or member.islnk()) else "special file"
        raise FiAutotuneError(f"archive member {name!r}: {kind}, only regular files are allowed")
    parsed = layout.parse_member(name)
    if parsed is None:
        raise FiAutotuneError(f"archive member {name!r}: not in the {layout.name} cache layout"
                              + _other_layout_hint(layout, name))
    eid, fname = parsed
    kind = layout.classify(fname, False)
    if kind not in (NameKind.DATA, NameKind.MANIFEST):
        raise FiAutotuneError(f"archive member {name!r}: not a cache file or manifest")
    if member.size > MAX_RANK_FILE_BYTES:
        raise FiAutotuneError(f"archive member {name!r}: {member.size} bytes, over the {MAX_RANK_FILE_BYTES} limit")
    return eid, fname, kind


def _keep_manifests(txn: Transaction, manifests: dict[EntryId, bytes], label: str) -> None:
    """Every manifest must come with rank files, and every entry from one archive only; the
    manifests wait in the transaction until ``finish_staged`` checks them."""
    for eid in manifests:
        if eid not in txn.staged:
            raise FiAutotuneError(f"{eid}: a manifest but no rank files")
    if not txn.staged:
        raise FiAutotuneError(f"{label}: no cache entries in the archive")
    for eid, data in manifests.items():
        if eid in txn.manifest_bytes:
            raise FiAutotuneError(f"{eid}: in two archives")
        txn.manifest_bytes[eid] = data


def archive_members(layout: CacheLayout, stream: BinaryIO, label: str, plan: ImportPlan):
    """Each data file or manifest of a hostile archive as ``(entry, file name, kind, bytes)``,
    every member checked first (a bad one raises: the caller writes nothing); what is ours to
    leave out goes to ``plan.skipped``."""
    counting = _Counting(stream)
    buffered = io.BufferedReader(counting, buffer_size=1 << 16)
    total = count = 0
    base = layout.base_parts()
    try:
        tar = tarfile.open(fileobj=buffered, mode="r|*")
    except (OSError, tarfile.TarError, EOFError) as e:
        raise FiAutotuneError(f"cannot read {label}: {e}") from None
    try:
        with tar:
            for member in tar:
                count += 1
                if count > MAX_MEMBERS:
                    raise FiAutotuneError(f"{label}: more than {MAX_MEMBERS} members")
                name = member.name[2:] if member.name.startswith("./") else member.name
                _check_name(name)
                if member.isdir():
                    continue
                skip = _ours_to_skip(PurePosixPath(name).parts, base)
                if skip is not None:
                    plan.skipped.append((name, skip))
                    continue
                eid, fname, kind = _checked_member(layout, member, name)
                plan.entries.add(eid)
                total += member.size
                if total > MAX_TOTAL_BYTES:
                    raise FiAutotuneError(f"{label}: contents exceed {MAX_TOTAL_BYTES} bytes")
                f = tar.extractfile(member)
                data = f.read(member.size + 1) if f else b""
                if len(data) != member.size:
                    raise FiAutotuneError(f"archive member {name!r}: truncated")
                if total > RATIO_GRACE_BYTES and total > MAX_RATIO * counting.count:
                    raise FiAutotuneError(
                        f"{label}: decompresses more than {MAX_RATIO}x (a real cache bundle is 5-15x): refusing it"
                    )
                yield eid, fname, kind, data
    except (tarfile.TarError, EOFError, ValueError) as e:
        raise FiAutotuneError(f"cannot read {label}: {e}") from None


def stage_archive(layout: CacheLayout, txn: Transaction, stream: BinaryIO, label: str, *, finish: bool = True) -> ImportPlan:
    """Validate the archive member by member into ``txn``'s staging dirs; raise on the first
    bad member (the caller discards the transaction: nothing reaches the tree). Manifests are
    kept in the transaction until ``finish_staged`` checks and writes them."""
    plan = ImportPlan()
    manifests: dict[EntryId, bytes] = {}
    try:
        for eid, fname, kind, data in archive_members(layout, stream, label, plan):
            if kind is NameKind.MANIFEST:
                if eid in manifests:
                    raise FiAutotuneError(f"archive member {layout.member_name(eid, fname)!r} appears twice")
                manifests[eid] = data
                continue
            try:
                parse_cache_bytes(data)
            except ValueError as e:
                raise FiAutotuneError(f"{eid}/{fname}: not a FlashInfer cache file ({str(e)[:80]})") from None
            try:
                txn.add_file(eid, fname, data)
            except FiAutotuneError as e:
                raise FiAutotuneError(f"archive member {layout.member_name(eid, fname)!r}: {e}") from None
    except OSError as e:
        raise FiAutotuneError(f"cannot import {label}: {os_error_message(e)}; nothing was written") from None

    _keep_manifests(txn, manifests, label)
    if finish:
        plan.incomplete.extend(finish_staged(layout, txn))
    return plan


def finish_staged(layout: CacheLayout, txn: Transaction) -> list[tuple[str, str]]:
    """Check each staged entry's manifest against its entry and key, write it; return the
    entries that are incomplete by their manifest."""
    incomplete = []
    for eid, s in sorted(txn.staged.items()):
        if s.finished:
            continue
        manifest = _manifest_for(eid, txn.manifest_bytes.get(eid), layout)
        txn.finish_entry(eid, manifest)
        expected = layout.expected_files(manifest.topology) if manifest else None
        if expected is not None:
            missing = [n for n in expected if n not in s.records]
            if missing:
                incomplete.append((str(eid), f"{len(expected) - len(missing)} of {len(expected)} rank files"))
    return incomplete


def _manifest_for(eid: EntryId, data: bytes | None, layout: CacheLayout) -> Manifest | None:
    if data is None:
        return None
    try:
        manifest = Manifest.from_bytes(data)
    except NewerManifest as e:
        raise FiAutotuneError(f"{eid}: manifest {e}") from None
    except ValueError as e:
        raise FiAutotuneError(f"{eid}: {e}") from None
    ids = layout.id_fields(eid)
    if manifest_names_other_entry(manifest, ids, eid):
        raise FiAutotuneError(f"{eid}: manifest describes another entry")
    schema = key_schemas().get(manifest.schema)
    if schema is not None and schema.key(manifest.key_fields) != eid.name:
        raise FiAutotuneError(f"{eid}: key does not match the manifest's key fields")
    return manifest


def import_archive(layout: CacheLayout, root, stream: BinaryIO, label: str, *, force: bool = False) -> ImportResult:
    """Import every entry of an archive, or none (see the module doc)."""
    return import_archives(layout, root, [(stream, label)], force=force)


def import_archives(layout: CacheLayout, root, sources: list[tuple[BinaryIO, str]], *, force: bool = False,
                    check: Callable[[list[ImportPlan], Transaction], None] | None = None,
                    dry_run: bool = False) -> ImportResult:
    """Import every entry of several archives (``pull``'s bundles) in one transaction: all or none.
    ``check(plans, txn)`` sees what each archive staged before anything is committed, and raises
    to refuse it all, or drops entries (``txn.drop``): ``pull`` judges the bundles' own contents
    there, not the store's records. ``dry_run``: every decision made, nothing committed; the
    result says what would be imported, unchanged and refused."""
    if layout.data_dirs:
        return _import_merged(layout, root, sources, force, check, dry_run)
    txn = Transaction(layout, root, preview_only=dry_run)
    skipped: list = []
    incomplete: list = []
    plans: list[ImportPlan] = []
    try:
        for stream, label in sources:
            plan = stage_archive(layout, txn, stream, label, finish=False)
            skipped += plan.skipped
            plans.append(plan)
        incomplete = finish_staged(layout, txn)
        if check is not None:
            check(plans, txn)
        result = (txn.preview if dry_run else txn.commit)(replace_policy(layout, root, force))
    except OSError as e:
        raise FiAutotuneError(f"cannot import {sources[0][1] if len(sources) == 1 else 'the bundles'}: "
                              f"{os_error_message(e)}; nothing was written") from None
    finally:
        txn.discard()
    return ImportResult(
        tuple(map(str, result.committed)), tuple(map(str, result.unchanged)),
        tuple((str(e), why) for e, why in result.refused), tuple(skipped), tuple(incomplete),
    )


@dataclass
class MergedStaging:
    """What a merged layout's import read and checked, per entry (``check`` sees it as ``txn``)."""

    staged: dict = field(default_factory=dict)

    def drop(self, eid: EntryId) -> None:
        del self.staged[eid]


def _import_merged(layout: CacheLayout, root, sources: list[tuple[BinaryIO, str]], force: bool,
                   check: Callable | None, dry_run: bool = False) -> ImportResult:
    """A layout whose entries others write into while they run (``data_dirs``): every bundle read
    and checked first, then each entry merged file by file (``merge_bundle``); an entry refused
    there (a conflict without --force) is left as it was and reported."""
    plans: list[ImportPlan] = []
    files: dict[EntryId, dict[str, bytes]] = {}
    for stream, label in sources:
        plan = ImportPlan()
        for eid, fname, _kind, data in archive_members(layout, stream, label, plan):
            if fname in files.setdefault(eid, {}):
                raise FiAutotuneError(f"archive member {layout.member_name(eid, fname)!r} appears twice")
            files[eid][fname] = data
        if not plan.entries:
            raise FiAutotuneError(f"{label}: no cache entries in the archive")
        plans.append(plan)
    staging = MergedStaging({eid: layout.stage_bundle(eid, f) for eid, f in sorted(files.items())})
    if check is not None:
        check(plans, staging)
    imported, unchanged, refused = [], [], []
    try:
        for eid, staged in staging.staged.items():
            written, _same, why = layout.merge_bundle(root, eid, staged, force, dry_run=dry_run)
            if why is not None:
                refused.append((str(eid), why))
            else:
                (imported if written else unchanged).append(str(eid))
    except OSError as e:
        raise FiAutotuneError(f"cannot import into {root}: {os_error_message(e)}") from None
    return ImportResult(tuple(imported), tuple(unchanged), tuple(refused), tuple(s for p in plans for s in p.skipped))


def _other_layout_hint(layout: CacheLayout, name: str) -> str:
    """'; it is in the sglang layout: --layout sglang' when another layout's archives hold it."""
    fits = [other.name for other in layouts().values()
            if other.name != layout.name and other.parse_member(name) is not None]
    return f" (it is a member of a {fits[0]} archive: --layout {fits[0]})" if fits else ""
