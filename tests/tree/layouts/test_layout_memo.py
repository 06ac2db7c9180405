"""The per-layout memos (``tree/layouts/memo.py``) that ``ls`` asks instead of the layout: each
answer must be the layout's own, for every registered layout, including a topology error; and
a tree of unique names must not grow them without bound."""

from __future__ import annotations

import pytest

from autotune_cache.plan.topology import Topology, TopologyError
from autotune_cache.registry import layouts
from autotune_cache.tree.layouts import memo as layout_memo
from autotune_cache.tree.layouts.memo import MAX_MEMO, LayoutMemo, memo_of

NAMES = ("rank_tp0_pp0_dp0.json", "rank_tp1_pp0_dp0.json", "rank_tp1_pp0_dp1.json", "fi-autotune.manifest.json",
         ".fi-autotune.x.tmp", "runs", "README", "rank_0_0.json", "rank_dp0_0.json", "rank_tp99999999_pp0_dp0.json")


@pytest.mark.parametrize("name", sorted(layouts()))
def test_every_answer_is_the_layouts_own(name):
    layout = layouts()[name]
    memo = LayoutMemo(layout)
    for _ in range(2):  # the second round answers from the memo
        for n in NAMES:
            for is_dir in (False, True):
                assert memo.kind(n, is_dir) is layout.classify(n, is_dir)
        for names in [NAMES[:2], NAMES[:3], NAMES[7:9], NAMES[9:], ()]:
            try:
                own = (layout.infer_topology(list(names)), None)
            except TopologyError as e:
                own = (None, str(e))
            assert memo.topology(tuple(names)) == own
        for topo in (Topology(2, 1, 1), Topology(4, 1, 2, dp_attention=False), Topology(8, 2, 8)):
            assert memo.expected(topo) == tuple(layout.expected_files(topo))
            for ep, inferred in ((None, True), (1, False)):
                assert memo.parallel(topo, ep, inferred) == layout.parallel_str(topo, ep, inferred=inferred)


def test_a_topology_error_is_remembered_as_its_message():
    layout = layouts()["sglang"]
    memo = LayoutMemo(layout)
    names = ("rank_tp99999999_pp0_dp0.json",)
    with pytest.raises(TopologyError) as err:
        layout.infer_topology(list(names))
    assert memo.topology(names) == (None, str(err.value)) == memo.topology(names)


def test_unique_names_stop_being_learned_past_the_bound():
    memo = LayoutMemo(layouts()["sglang"])
    for i in range(MAX_MEMO + 100):
        memo.kind(f"stray-{i}", False)
        memo.topology((f"rank_tp{i}_pp0_dp0.json",))
    assert len(memo.kinds(False)) == MAX_MEMO and len(memo._topologies) == MAX_MEMO
    assert memo.kind("stray-999999", False) is memo.layout.classify("stray-999999", False)


def test_one_memo_per_layout_object():
    layout = layouts()["sglang"]
    assert memo_of(layout) is memo_of(layout) and memo_of(layout).layout is layout
    other = type(layout)()  # a layout registered anew is another object: its own memo
    assert memo_of(other) is not memo_of(layout) and memo_of(other).layout is other
    layout_memo._MEMOS.pop(id(other), None)

