"""Work dirs: where a warm's workers save what they tuned until the entry is committed.

Each tune of an op writes its own FlashInfer cache file per worker (``<prefix>.w<worker>.json``)
and appends each saved bucket to a done file (``<prefix>.w<worker>.done``; a careful tune also
records the keys and slots it stored). An interrupted run resumes from them; the dir is
removed once the entry is written. One run holds a dir at a time (``lock_work_dir``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

from autotune_cache.autotuner.rankfile import METADATA_KEY, RESERVED_KEYS
from autotune_cache.errors import EntryLocked, FiAutotuneError
from autotune_cache.plan.tuning import TuningPlan
from autotune_cache.tune.careful.quality import QualitySettings, SlotRecord


def _work_root() -> Path:
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("fi-autotune")) / "work"


def work_dir(plan: TuningPlan, quality: QualitySettings | None = None) -> Path:
    """One target's work dir (``warm``): its workloads, its root and, if careful, the settings."""
    what: object = {"workloads": [w.to_dict() for w in plan.workloads], "root": str(plan.cache_root)}
    if quality is not None and quality.careful:  # careful tunes never mix with quick ones
        what = {**what, "quality": quality.to_dict()}
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]
    return _work_root() / f"{plan.flashinfer_version}-{plan.resolution.arch}-{plan.key}-{digest}"


def op_work_dir(plan: TuningPlan, signature: str) -> Path:
    """One call's work dir (``warm --targets``), shared by every target (and every later run) that tunes it."""
    digest = hashlib.sha256(signature.encode()).hexdigest()[:16]
    return _work_root() / "calls" / f"{plan.flashinfer_version}-{plan.resolution.arch}-{digest}"


def lock_work_dir(wd: Path) -> int:
    """Hold the work dir for this run: two warms of one target at once would take each other's
    finished buckets for their own (and delete the dir under each other). The lock file sits
    beside the dir, which is removed once the entry is written."""
    wd.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(wd.parent / f"{wd.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise EntryLocked(f"another warm is tuning this target into the same cache root right now (work dir {wd}); "
                          "wait for it, or give this one another --cache-dir") from None
    return fd


def open_work_dir(wd: Path, force: bool) -> None:
    """Make the (locked) work dir; ``--force`` starts it from nothing."""
    wd.mkdir(parents=True, exist_ok=True)
    if force:
        for p in wd.iterdir():
            p.unlink()


def tune_prefix(op: int, tune: int | None) -> str:
    """Work-dir file prefix of one tune of an op (quick mode: the op's only tune)."""
    return f"op{op}" if tune is None else f"op{op}.r{tune}"


def _done_lines(wd: Path, prefix: str):
    for p in sorted(wd.glob(f"{prefix}.w*.done")):
        for line in p.read_text().splitlines():
            bucket, _, rest = line.strip().partition(" ")
            if bucket.isdigit():
                yield int(bucket), rest


def read_done(wd: Path, prefix: str) -> set[int]:
    """Buckets a tune has saved (a done line is written only after the op's file holds them)."""
    return {b for b, _ in _done_lines(wd, prefix)}


def read_slot_records(wd: Path, prefix: str) -> dict[int, list[SlotRecord]]:
    """What a careful tune stored for each bucket (``quality.SlotRecord``), from its done lines."""
    out: dict[int, list[SlotRecord]] = {}
    for b, rest in _done_lines(wd, prefix):
        try:
            out[b] = [SlotRecord.from_dict(d) for d in json.loads(rest)] if rest else []
        except (ValueError, KeyError, TypeError):
            continue  # a torn line: that bucket offers no candidate
    return out


def _environment_diff(a: dict, b: dict) -> FiAutotuneError:
    diff = {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}
    return FiAutotuneError(f"refusing to merge tuning results from different environments: {diff}")


def merge_cache_files(paths: list[Path]) -> tuple[dict, dict]:
    """Union of tuned entries; the files must agree on ``_metadata`` (one GPU model, one image)."""
    meta: dict | None = None
    entries: dict = {}
    for p in paths:
        obj = json.loads(p.read_text())
        m = obj.get(METADATA_KEY) or {}
        if meta is None:
            meta = m
        elif m != meta:
            raise _environment_diff(meta, m)
        for k, v in obj.items():
            if k not in RESERVED_KEYS:
                entries[k] = v
    return meta or {}, entries


def merged_results(wd: Path, prefix: str) -> tuple[dict, dict]:
    """(``_metadata``, entries) of every worker's file of one tune prefix; empty if none saved."""
    files = sorted(wd.glob(f"{prefix}.w*.json"))
    return merge_cache_files(files) if files else ({}, {})


def one_metadata(metas: list[dict]) -> dict:
    """The one ``_metadata`` every file of a workload carries (one GPU model, one image)."""
    first = metas[0]
    for m in metas[1:]:
        if m != first:
            raise _environment_diff(first, m)
    return first
