"""Rank naming and root resolution: one source of truth, pinned against SGLang 0.5.23's rules."""

from pathlib import Path

import pytest

from autotune_cache import layout
from autotune_cache.layout import RankName, Topology


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
    with pytest.raises(ValueError, match="divisible"):
        Topology(8, 1, 3)
    with pytest.raises(ValueError):
        Topology(0)
    with pytest.raises(ValueError):
        Topology(4, -1)


def test_rank_name_parse_and_megamoe_suffix():
    assert RankName.parse("rank_tp3_pp0_dp1.json") == RankName(3, 0, 1)
    r = RankName.parse("rank_tp0_pp0_dp0_gpuGPU-1234-abcd.json")
    assert r.gpu == "GPU-1234-abcd" and r.filename == "rank_tp0_pp0_dp0_gpuGPU-1234-abcd.json"
    assert RankName.parse("rank_tp0_pp0.json") is None
    assert RankName.parse("rank_tp0_pp0_dp0.json.bak") is None


def test_sglang_cache_root_default_expands_home(monkeypatch, tmp_path):
    monkeypatch.delenv("SGLANG_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere/else")  # SGLang ignores XDG
    assert layout.sglang_cache_root() == tmp_path / ".cache" / "sglang"


def test_sglang_cache_root_env_is_verbatim(monkeypatch):
    monkeypatch.setenv("SGLANG_CACHE_DIR", "~/notexpanded")
    assert layout.sglang_cache_root() == Path("~/notexpanded")


def test_key_dir_layout():
    p = layout.key_dir(Path("/r"), "0.7.2.post1", "sm90", "0123456789abcdef")
    assert p == Path("/r/flashinfer/autotune/0.7.2.post1/sm90/0123456789abcdef")
    assert layout.arch_from_capability(10, 0) == "sm100"
