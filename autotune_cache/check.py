"""``check``: will the engine find, and use, its cache - decided without a GPU.

A docker build has no GPU, so it cannot run ``verify``. ``check`` answers the same question
from the files: for the serving flags (or the pasted serving command) it computes the path the
engine will compute, and checks that an entry is there (in a tree, or in a store), that it is
complete and byte-identical where SGLang demands it, that every FlashInfer key the engine's
startup pass looks up is in the files (predicted by the plan's recipes), and that the files'
``_metadata`` matches the serving image's fingerprint (``--env-from``). Each miss is one line
saying why; where the entry is absent, which key field differs from the nearest entry there is.

Nothing here imports torch or flashinfer.
"""

from __future__ import annotations

import io
import json
import tarfile

from autotune_cache import registry
from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.autotuner.lookup_keys import unrecorded_release_note
from autotune_cache.autotuner.rankfile import RESERVED_KEYS, parse_cache_bytes, read_regular_file
from autotune_cache.plan.entry_key import KeyFields
from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tree.check_report import CheckReport, checkable
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId
from autotune_cache.tree.nearest import Candidate, nearest_difference_to
from autotune_cache.tree.scanner.scan import scan_cache, scan_entry
from autotune_cache.tree.status import EntryStatus
from autotune_cache.tree.store.store import Store

def nearest_difference(plan: TuningPlan, layout: CacheLayout, candidates: list[Candidate]) -> str | None:
    """One line: which key field (or path part) differs from the entry closest to the plan's."""
    return nearest_difference_to(plan.entry_id, plan.resolution.key_fields.to_dict(), layout, candidates)


def files_of_bundle(data: bytes, layout: CacheLayout, eid: EntryId) -> dict[str, bytes]:
    """The entry's files from a (verified) bundle, in memory."""
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for m in tar:
            parsed = layout.parse_member(m.name)
            if parsed and parsed[0] == eid and m.isreg():
                out[parsed[1]] = tar.extractfile(m).read()
    return out


def check_files(plan: TuningPlan, layout: CacheLayout, report: CheckReport, files: dict[str, bytes],
                fingerprint: Fingerprint | None) -> None:
    """Completeness, identity, key coverage and environment of one entry's files."""
    for note in plan.resolution.notes:
        report.warnings.append(note)
    expected = plan.rank_files
    present = [n for n in expected if n in files]
    report.rank_files = len(present)
    missing = [n for n in expected if n not in files]
    if missing:
        report.misses.append(f"{len(missing)} of {len(expected)} rank files missing (e.g. {missing[0]}): "
                             "those ranks tune, then every rank re-tunes")
    parsed: dict[str, dict] = {}
    for name in present:
        try:
            parsed[name] = parse_cache_bytes(files[name])
        except ValueError as e:
            report.misses.append(f"{name} is not a valid FlashInfer cache ({e})")
    digests = {n: files[n] for n in present}
    for label, names in layout.identical_groups(present, plan.resolution.topology):
        if len({digests[n] for n in names}) > 1:
            report.misses.append(f"rank files of TP group {label} differ: SGLang deletes them and tunes again")
    # Key coverage: what the engine's startup pass looks up, per workload.
    for w in plan.workloads:
        rank = next((r for r in w.ranks if r in parsed), None)
        if rank is None:
            continue
        keys = {k for k in parsed[rank] if k not in RESERVED_KEYS}
        for op in w.ops:
            if not checkable(op, report):
                continue
            wanted = op.lookups()
            report.keys_checked += len(wanted)
            lacking = [group[0] for group in wanted if not any(k in keys for k in group)]
            if lacking:
                report.keys_missing += len(lacking)
                report.misses.append(f"{rank}: {len(lacking)} of {len(wanted)} {op.recipe.id} lookups of the startup "
                                     f"pass are not in the file (e.g. {lacking[0]})")
    # Environment.
    metas = {json.dumps(p.get("_metadata"), sort_keys=True): p.get("_metadata") for p in parsed.values()}
    for meta in metas.values():
        if fingerprint is None:
            gpu = (meta or {}).get("gpu", "unknown")
            report.warnings.append(f"no --env-from: _metadata not compared with the serving image (tuned on {gpu}); "
                                   "capture one with `fi-autotune env --json` there")
            break
        verdict = fingerprint.compare(meta)
        if verdict.stale:
            report.misses.append(f"FlashInfer in the serving image would ignore these files ({verdict.describe()})")
        for k, (saved, _) in verdict.unknown.items():
            report.cannot_check(f"{k}: {saved!r} cannot be checked ({fingerprint.source} does not know its value: "
                                "capture it with `fi-autotune env --json` in the serving image, on its GPU)")


def run_check(plan: TuningPlan, reader: CacheLayout, store_url: str | None, fingerprint: Fingerprint | None,
              cache_dir: str | None, strict: bool = False) -> CheckReport:
    """One target's check, as ``reader`` (a layout) would read it: the tree at the plan's root, a
    store, or - for a layout whose directories the serving environment names (FlashInfer's
    managed store) - that environment's directory."""
    if not plan.bound and fingerprint is not None:  # FlashInfer's store: the serving environment names its directory
        plan = plan.for_environment(fingerprint.fields)
    where = plan.id_str
    report = CheckReport(where, str(plan.key_dir) if store_url is None else f"{store_url} {where}", plan.autotunes,
                         strict=strict)
    if not plan.autotunes:
        return report
    reader, root = plan.layout_obj.checked_by(plan, reader, cache_dir)
    reader.check_entry(plan, report, fingerprint, root, store_url, RankFileChecks())
    if note := unrecorded_release_note(plan.flashinfer_version):  # the keys checked were another release's
        report.cannot_check(note)
    if fingerprint is None and plan.request is not None:  # no serving image: its engine's stock FlashInfer
        request = plan.request
        if note := registry.get_engine(request.engine.name).pin_note(request.engine_release, plan.flashinfer_version):
            report.warnings.append(note)
    return report


class RankFileChecks:
    """The checks of an entry of rank files, handed to a layout's ``check_entry``: in the tree
    at the plan's path, or in a store."""

    def in_tree(self, plan: TuningPlan, layout: CacheLayout, report: CheckReport, fingerprint: Fingerprint | None) -> None:
        check_tree(plan, layout, report, fingerprint)

    def in_store(self, plan: TuningPlan, layout: CacheLayout, report: CheckReport, fingerprint: Fingerprint | None,
                 url: str) -> None:
        check_store(plan, layout, report, fingerprint, url)


def check_tree(plan: TuningPlan, layout: CacheLayout, report: CheckReport, fingerprint: Fingerprint | None) -> None:
    kdir = plan.key_dir
    if not kdir.is_dir():
        root = plan.cache_root
        info = scan_cache(root) if root.exists() else None
        candidates = [Candidate(e.id, e.manifest.key_fields if e.manifest else None, e.gpu)
                      for e in (info.entries if info else ())]
        why = nearest_difference(plan, layout, candidates)
        report.misses.append(f"no entry at {kdir}" + (f": {why}" if why else " (and no other entry to compare with)"))
        return
    report.found = True
    files = {}
    for name in plan.rank_files:
        try:
            files[name] = read_regular_file(kdir / name)
        except OSError:
            continue
    check_files(plan, layout, report, files, fingerprint)
    shipped_as_is(plan, layout, report)


def shipped_as_is(plan: TuningPlan, layout: CacheLayout, report: CheckReport) -> None:
    """A live tree's entry the engine reads but ``export`` and ``push`` skip (no manifest: written
    by the engine itself; or incomplete): a warning, never a miss - the engine here uses it - but
    a gate run on this tree would not have checked what an image built by ``export`` holds."""
    entry = scan_entry(layout, plan.key_dir, plan.entry_id)
    if entry.status == EntryStatus.COMPLETE:
        return
    why = ("it has no fi-autotune manifest (written by the engine itself)" if entry.status == EntryStatus.UNVERIFIED
           else f"it is {entry.status}")
    report.warnings.append(f"{plan.entry_id}: {why}: `export` and `push` skip it, so an image built from this tree "
                           "lacks it; run `check` on the extracted bundle to gate what ships")


def check_store(plan: TuningPlan, layout: CacheLayout, report: CheckReport, fingerprint: Fingerprint | None,
                url: str) -> None:
    store = Store(url)
    rec = store.record(layout.name, plan.entry_id)
    if rec is None:
        report.misses.append(store_miss(plan, layout, store))
        return
    report.found = True
    check_files(plan, layout, report, files_of_bundle(store.fetch(rec), layout, plan.entry_id), fingerprint)


def store_miss(plan: TuningPlan, layout: CacheLayout, store: Store) -> str:
    """The line a store without the plan's entry reads, with how the nearest entry there differs
    (``check --store`` and ``pull`` by serving flags say it alike)."""
    candidates = []
    try:
        records = store.records(layout.name)
    except Exception:  # noqa: BLE001 - an HTTP store may not list; the miss stands without a neighbour
        records = []
    for r in records:
        kf = None
        if r.key_fields:
            try:
                kf = KeyFields.from_dict(r.key_fields)
            except ValueError:
                kf = None
        candidates.append(Candidate(r.id, kf, r.gpu))
    why = nearest_difference(plan, layout, candidates)
    return f"no entry {plan.entry_id} in {store}" + (f": {why}" if why else "")
