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
import os
import pickle
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.registry import default_layout
from autotune_cache.tree.atime import policy_for
from autotune_cache.tree.digestindex import DigestIndex
from autotune_cache.tree.entry_scan import scan_entry
from autotune_cache.tree.layout import CacheLayout
from autotune_cache.tree.records import CacheEntry, CacheInfo, Finding
from autotune_cache.tree.walk import list_entry_dirs

__all__ = ["CacheEntry", "CacheInfo", "Finding", "PARALLEL_MIN_ENTRIES", "map_entries", "scan_cache", "scan_entry"]


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
