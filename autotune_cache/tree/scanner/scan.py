"""Scanning a cache tree into frozen records, in the manner of ``huggingface_hub.scan_cache_dir``:
the walk (``walk``) finds the entry dirs, each is read (``entry_scan``) into a ``CacheEntry``
(``records``); on large trees the reading is spread over forked processes.

Nothing here writes, follows a symlink, blocks on a FIFO, or reads more than a bounded amount;
odd things found in the tree become ``Finding``s or entry problems, never exceptions, so ``ls``
always finishes. The shape of the tree comes from a ``CacheLayout``.

``CacheEntry``, ``CacheInfo``, ``Finding`` and ``scan_entry`` are re-exported here: this module
is where commands and other floors get a scan from.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import pickle
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.registry import default_layout
from autotune_cache.tree.scanner.atime import policy_for
from autotune_cache.tree.scanner.digestindex import DigestIndex
from autotune_cache.tree.scanner.entry_scan import scan_entry
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.records import CacheEntry, CacheInfo, Finding
from autotune_cache.tree.scanner.walk import iter_entry_dirs, list_entry_dirs

__all__ = ["CacheEntry", "CacheInfo", "Finding", "PARALLEL_MIN_ENTRIES", "STREAM_BATCH", "iter_entries", "map_entries", "scan_cache", "scan_entry"]


@contextlib.contextmanager
def _no_cyclic_gc(freeze: bool = True) -> Iterator[None]:
    """Scanning allocates many small long-lived objects; the cyclic GC would re-walk them again
    and again (a third of the time on a 10,000-entry tree) without ever finding a cycle.

    ``freeze``: what the scan made lives until the command ends, so move it out of the
    collector's sight rather than have the first collection after this walk all of it. A
    streamed scan (``iter_entries``) drops each batch instead: frozen, its garbage would stay.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
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
        entries = tuple(e for p, eid in entry_dirs
                        if (e := scan_entry(layout, p, eid, fingerprint, trusted, digests, skip_gone=True)) is not None)
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
    """``[fn(entry) for entry in scan]``, spread over forked processes on large trees."""
    results: list[T] = []
    batches, findings = iter_entries(root, fn, layout, fingerprint, jobs, batch=None)
    for part in batches:
        results += part
    return results, findings


#: Entries scanned per batch when streaming: large enough that the fork pays, small enough that
#: memory does not grow with the tree (``ls -q``/``--json`` on 100,000 entries).
STREAM_BATCH = 4096


def iter_entries(
    root: Path,
    fn: Callable[[CacheEntry], T],
    layout: CacheLayout | None = None,
    fingerprint: Fingerprint | None = None,
    jobs: int | None = None,
    batch: int | None = STREAM_BATCH,
) -> tuple[Iterator[list[T]], list[Finding]]:
    """``fn(entry)`` for every entry, in the walk's order (by id, part by part), in batches of
    ``batch`` (all at once with ``None``), plus what the walk found that does not belong (filled
    as the walk goes: complete once the batches are consumed).

    Scanning is syscalls plus small-object work that one core cannot make faster; ``ls`` on a
    10,000-entry tree needs both cores to stay interactive, so each batch is spread over forked
    processes once it is large enough. Children return only ``fn``'s (small, picklable) results;
    any child failure falls back to doing its share here. The children of the next batch scan
    while the caller consumes this one (at most two batches alive), so what the caller keeps
    decides the memory, not the tree.
    """
    layout = layout or default_layout()
    trusted = policy_for(root).trusted
    findings: list[Finding] = []
    if batch is None:
        walked = iter([list_entry_dirs_into(layout, root, findings)])
    else:
        dirs = iter_entry_dirs(layout, root, findings)
        walked = iter(lambda: list(itertools.islice(dirs, batch)), [])
    if jobs is None:
        jobs = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))

    def batches() -> Iterator[list[T]]:
        digests: DigestIndex | None = None

        def run(chunk):
            # an entry dir gone since the walk listed it (a concurrent rm took it) is not listed
            return [fn(e) for p, eid in chunk
                    if (e := scan_entry(layout, p, eid, fingerprint, trusted, digests, skip_gone=True)) is not None]

        # The children of the next batch are forked before this one is handed over: they scan
        # while the caller consumes (formats, prints) this one, and the parent takes the smaller
        # share of every batch (it also reads the children's results and serves the caller).
        # The collector stays off for the whole stream, the walk between batches included: with it
        # on there, every batch's walk set off collections that went over all the caller had kept
        # so far (100,000 entries: 600 collections, 1.6 s of ``ls``).
        started = None
        try:
            with _no_cyclic_gc(freeze=batch is None):
                for entry_dirs in walked:
                    if not entry_dirs:
                        break
                    if digests is None:
                        digests = DigestIndex.for_root(root, layout.name)
                    done = None
                    if started is not None:
                        done, started = _finish_chunk(run, started, digests), None
                    started = _start_chunk(run, entry_dirs, jobs, digests)
                    if done is not None:
                        yield done
                    if batch is None:
                        break
                if started is not None:
                    done, started = _finish_chunk(run, started, digests), None
                    yield done
            if digests is not None:
                digests.save()
        finally:
            if started is not None:  # the caller stopped early: end the children started for it
                _abandon_chunk(started)

    return batches(), findings


#: The parent's share of a batch against one child's (it also reads the children's results and
#: serves the caller while the children of the next batch scan).
PARENT_SHARE = 0.75


def _start_chunk(run: Callable[[list], list[T]], entry_dirs: list, jobs: int, digests: DigestIndex | None) -> tuple:
    """Fork the children's shares of ``entry_dirs`` (contiguous parts; the parent's, the first,
    is scanned by ``_finish_chunk``) when that pays."""
    if jobs <= 1 or len(entry_dirs) < PARALLEL_MIN_ENTRIES or not hasattr(os, "fork"):
        return entry_dirs, []
    own = max(1, int(len(entry_dirs) * PARENT_SHARE / (PARENT_SHARE + jobs - 1)))
    rest = entry_dirs[own:]
    per = -(-len(rest) // (jobs - 1))
    children = []
    for k in range(0, len(rest), per):
        chunk = rest[k:k + per]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(r)
            code = 0
            if digests is not None:
                digests.start_delta()
            try:
                with os.fdopen(w, "wb") as out:
                    part = run(chunk)
                    pickle.dump((part, digests.delta() if digests is not None else None), out,
                                protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException:
                code = 1
            os._exit(code)
        os.close(w)
        children.append((pid, r, chunk))
    return entry_dirs[:own], children


def _finish_chunk(run: Callable[[list], list[T]], started: tuple, digests: DigestIndex | None) -> list[T]:
    """The parent's share scanned here, then each child's results in order; any child failure
    falls back to doing its share here."""
    own, children = started
    results = run(own)
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
            results += part
        except Exception:
            results += run(chunk)
    return results


def _abandon_chunk(started: tuple) -> None:
    for pid, r, _ in started[1]:
        with contextlib.suppress(OSError):
            os.close(r)  # the child's write fails: it exits
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)


def list_entry_dirs_into(layout: CacheLayout, root: Path, findings: list[Finding]) -> list:
    """``list_entry_dirs``, its findings added to ``findings``."""
    dirs, found = list_entry_dirs(layout, root)
    findings += found
    return dirs
