"""Rank naming, topologies and the SGLang layout: one source of truth, pinned against SGLang 0.5.23."""

from pathlib import Path

import pytest

from autotune_cache.registry import default_layout, get_layout
from autotune_cache.tree.layouts.values import DEFAULT_LAYOUT_NAME as DEFAULT_LAYOUT, EntryId, NameKind
from autotune_cache.tree.layouts.own_names import MANIFEST_NAME
from autotune_cache.autotuner.arch import arch_from_capability
from autotune_cache.errors import UsageError
from autotune_cache.plan.topology import MAX_PARALLEL, RankName, Topology, TopologyError

SG = default_layout()


def test_dp_attention_tp8_dp8_rank_names():
    # sglang: dp_rank = attn_dp_rank = tp_rank // (tp // dp)  (compute_dp_attention_world_info)
    assert Topology(8, 1, 8).rank_files() == [f"rank_tp{t}_pp0_dp{t}.json" for t in range(8)]


def test_dp_attention_tp8_dp2_groups_four_tp_ranks_per_dp():
    names = Topology(8, 1, 2).rank_files()
    assert names[:4] == [f"rank_tp{t}_pp0_dp0.json" for t in range(4)]
    assert names[4:] == [f"rank_tp{t}_pp0_dp1.json" for t in range(4, 8)]


def test_replicas_repeat_whole_tp_group_per_dp_rank():
    t = Topology(2, 1, 3, dp_attention=False)
    assert t.rank_files() == sorted(f"rank_tp{tp}_pp0_dp{d}.json" for d in range(3) for tp in range(2))
    assert t.attn_dp_size == 1
    # each replica is its own TP group (SGLang's digest check runs per TP group)
    assert t.tp_group_of(RankName(0, 0, 2)) != t.tp_group_of(RankName(0, 0, 1))


def test_dp1_uses_dp0_and_pp_stages():
    assert Topology(2, 2, 1).rank_files() == [
        "rank_tp0_pp0_dp0.json", "rank_tp0_pp1_dp0.json", "rank_tp1_pp0_dp0.json", "rank_tp1_pp1_dp0.json",
    ]


@pytest.mark.parametrize("topo", [Topology(8, 1, 8), Topology(8, 1, 2), Topology(4, 2, 3, False), Topology(1)])
def test_infer_roundtrips(topo):
    assert Topology.infer(topo.rank_names()) == topo


def test_invalid_topologies():
    with pytest.raises(TopologyError, match="divisible"):
        Topology(8, 1, 3)
    with pytest.raises(TopologyError):
        Topology(0)
    with pytest.raises(TopologyError):
        Topology(4, -1)
    with pytest.raises(TopologyError, match="beyond"):
        Topology(10**9)


def test_sizes_from_data_are_bounded():
    """A stray rank_tp99999999 name must not make anyone build 10^8 names."""
    with pytest.raises(TopologyError, match="tp=100000000 is beyond 4096"):
        Topology.infer([RankName(99_999_999, 0, 0)])
    with pytest.raises(TopologyError, match="dp=5000 is beyond 4096"):
        Topology(1, 1, 5000, dp_attention=False)
    with pytest.raises(TopologyError, match="rank files"):
        Topology(MAX_PARALLEL, 32, 2, dp_attention=False)  # 262,144 files
    with pytest.raises(TopologyError):
        Topology.from_dict({"tp": 10**9, "pp": 1, "dp": 1, "dp_attention": True})
    with pytest.raises(TopologyError):
        Topology.from_dict({"tp": "8", "pp": 1, "dp": 1, "dp_attention": True})
    with pytest.raises(TopologyError):
        Topology.from_dict([8, 1, 1])


def test_describe_says_dp_mode_only_when_dp_matters():
    assert Topology(4).describe == "tp=4 pp=1 dp=1"
    assert Topology(8, 1, 8).describe == "tp=8 pp=1 dp=8 (dp-attention)"
    assert Topology(2, 1, 2, False).describe == "tp=2 pp=1 dp=2 (replicas)"


def test_rank_name_parse_and_megamoe_suffix():
    assert RankName.parse("rank_tp3_pp0_dp1.json") == RankName(3, 0, 1)
    r = RankName.parse("rank_tp0_pp0_dp0_gpuGPU-1234-abcd.json")
    assert r.gpu == "GPU-1234-abcd" and r.filename == "rank_tp0_pp0_dp0_gpuGPU-1234-abcd.json"
    assert RankName.parse("rank_tp0_pp0.json") is None
    assert RankName.parse("rank_tp0_pp0_dp0.json.bak") is None
    assert RankName.parse("rank_tp" + "9" * 40 + "_pp0_dp0.json") is None  # digits are bounded too


def test_sglang_cache_root_default_expands_home(monkeypatch, tmp_path):
    monkeypatch.delenv("SGLANG_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere/else")  # SGLang ignores XDG
    choice = SG.default_root()
    assert choice.path == tmp_path / ".cache" / "sglang" and choice.source == "the default ~/.cache/sglang"


def test_sglang_cache_root_env_is_verbatim(monkeypatch):
    monkeypatch.setenv("SGLANG_CACHE_DIR", "~/notexpanded")
    choice = SG.default_root()
    assert choice.path == Path("~/notexpanded") and choice.source == "$SGLANG_CACHE_DIR"


def test_entry_dir_ids_and_archive_members():
    eid = SG.make_id(("0.7.2.post1", "sm90", "0123456789abcdef"))
    assert SG.entry_dir(Path("/r"), eid) == Path("/r/flashinfer/autotune/0.7.2.post1/sm90/0123456789abcdef")
    assert str(eid) == "0.7.2.post1/sm90/0123456789abcdef"  # the default layout prints no prefix
    assert SG.parse_id("0.7.2.post1/sm90/0123456789abcdef") == eid
    assert SG.parse_id("sglang:0.7.2.post1/sm90/0123456789abcdef") == eid
    assert SG.parse_id("0123456789abcdef") is None  # a bare key is resolved against a tree, not parsed
    assert SG.parse_id("0.7.2.post1/SM90/0123456789abcdef") is None
    assert SG.id_fields(eid) == {"flashinfer_version": "0.7.2.post1", "arch": "sm90", "key": "0123456789abcdef"}
    member = SG.member_name(eid, "rank_tp0_pp0_dp0.json")
    assert member == "flashinfer/autotune/0.7.2.post1/sm90/0123456789abcdef/rank_tp0_pp0_dp0.json"
    assert SG.parse_member(member) == (eid, "rank_tp0_pp0_dp0.json")
    assert SG.parse_member("flashinfer/autotune/0.7.2.post1/sm90/notakey/rank_tp0_pp0_dp0.json") is None
    assert SG.parse_member("other/autotune/0.7.2.post1/sm90/0123456789abcdef/x.json") is None
    assert SG.lock_path(Path("/r"), eid) == Path("/r/flashinfer/autotune/.fi-autotune-locks/0.7.2.post1/sm90/0123456789abcdef.lock")
    with pytest.raises(ValueError):
        SG.make_id(("0.7.2.post1", "sm90"))
    assert arch_from_capability(10, 0) == "sm100"


def test_classify_names_in_an_entry():
    assert SG.classify("rank_tp0_pp0_dp0.json", False) is NameKind.DATA
    assert SG.classify(MANIFEST_NAME, False) is NameKind.MANIFEST
    assert SG.classify(".autotuner_x.tmp", False) is NameKind.TEMP
    assert SG.classify(".fi-autotune-rank.json.ab12.tmp", False) is NameKind.TEMP
    assert SG.classify("runs", True) is NameKind.ENGINE_SIDE
    assert SG.classify("runs", False) is NameKind.FOREIGN
    assert SG.classify("notes.txt", False) is NameKind.FOREIGN


def test_identical_groups_follow_tp_groups():
    topo = Topology(2, 1, 2, dp_attention=False)
    groups = dict(SG.identical_groups(topo.rank_files(), topo))
    assert groups == {"pp0/replica0": ["rank_tp0_pp0_dp0.json", "rank_tp1_pp0_dp0.json"],
                      "pp0/replica1": ["rank_tp0_pp0_dp1.json", "rank_tp1_pp0_dp1.json"]}
    attn = Topology(8, 1, 8)
    assert len(SG.identical_groups(attn.rank_files(), attn)) == 1


def test_layout_registry():
    assert get_layout(DEFAULT_LAYOUT) is SG
    with pytest.raises(UsageError, match="known: flashinfer-v2, sglang"):
        get_layout("nope")
    assert EntryId("vllm", ("a", "b", "c")).__str__() == "vllm:a/b/c"
