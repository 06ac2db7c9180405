"""Per-layout memos of what a layout answers from names and sizes alone: what a name in an entry
dir is (``classify``), the topology a set of rank file names implies (``infer_topology``), the
rank files a topology expects (``expected_files``) and ``ls``'s PARALLEL cell (``parallel_str``).

Why: on a large tree the same few names recur in every entry (the 8 ``rank_tp*_pp0_dp*.json``
of 100,000 entries), and asking the layout again costs a regex or an lru lookup keyed by
dataclasses per file, per entry - a tenth of ``ls``'s time on an engine-written tree. These
answers depend on their arguments only (a layout is a stateless singleton, ``CacheLayout``), so a
dict lookup keyed by the names (strings hash once, in C) gives the same answer.

Bounded: a hostile tree of unique names must not grow memory with the tree, so past
``MAX_MEMO`` keys a memo stops learning and the layout is asked directly.
"""

from __future__ import annotations

from autotune_cache.plan.topology import Topology, TopologyError
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import NameKind

#: Keys one memo holds at most (per layout and question).
MAX_MEMO = 4096


class LayoutMemo:
    """One layout's memos; ``memo_of`` gives the shared one."""

    def __init__(self, layout: CacheLayout):
        self.layout = layout
        self._files: dict[str, NameKind] = {}
        self._dirs: dict[str, NameKind] = {}
        self._topologies: dict[tuple[str, ...], tuple[Topology | None, str | None]] = {}
        self._expected: dict[Topology, tuple[str, ...]] = {}
        self._parallel: dict[tuple, str] = {}
        # the last answers, by the topology object itself (a hash of a Topology is a Python call)
        self._last_expected: tuple = (object(), ())
        self._last_parallel: tuple = (object(), None, None, "")

    def kinds(self, is_dir: bool) -> dict[str, NameKind]:
        """The memo of ``classify(name, is_dir)`` (look up with ``.get(name)``; fill with ``kind``)."""
        return self._dirs if is_dir else self._files

    def kind(self, name: str, is_dir: bool) -> NameKind:
        memo = self._dirs if is_dir else self._files
        found = memo.get(name)
        if found is None:
            found = self.layout.classify(name, is_dir)
            if len(memo) < MAX_MEMO:
                memo[name] = found
        return found

    def topology(self, names: tuple[str, ...]) -> tuple[Topology | None, str | None]:
        """(``infer_topology(names)``, None), or (None, the ``TopologyError``'s text)."""
        found = self._topologies.get(names)
        if found is None:
            try:
                found = (self.layout.infer_topology(list(names)), None)
            except TopologyError as e:
                found = (None, str(e))
            if len(self._topologies) < MAX_MEMO:
                self._topologies[names] = found
        return found

    def expected(self, topology: Topology) -> tuple[str, ...]:
        """``expected_files(topology)``, as a tuple (shared: never mutated)."""
        last = self._last_expected
        if last[0] is topology:  # the entries of a tree mostly share one topology object
            return last[1]
        found = self._expected.get(topology)
        if found is None:
            found = tuple(self.layout.expected_files(topology))
            if len(self._expected) < MAX_MEMO:
                self._expected[topology] = found
        self._last_expected = (topology, found)
        return found

    def parallel(self, topology: Topology | None, ep: int | None, inferred: bool) -> str:
        """``parallel_str(topology, ep, inferred=inferred)``."""
        last = self._last_parallel
        if last[0] is topology and last[1] == ep and last[2] is inferred:
            return last[3]
        key = (topology, ep, inferred)
        found = self._parallel.get(key)
        if found is None:
            found = self.layout.parallel_str(topology, ep, inferred=inferred)
            if len(self._parallel) < MAX_MEMO:
                self._parallel[key] = found
        self._last_parallel = (*key, found)
        return found


_MEMOS: dict[int, LayoutMemo] = {}


def memo_of(layout: CacheLayout) -> LayoutMemo:
    """The memo of ``layout`` (by identity: a layout registered anew gets a fresh one; the forked
    scanners inherit what the parent learned)."""
    memo = _MEMOS.get(id(layout))
    if memo is None or memo.layout is not layout:
        memo = _MEMOS[id(layout)] = LayoutMemo(layout)
    return memo
