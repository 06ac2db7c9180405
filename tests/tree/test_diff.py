"""``fi-autotune diff``: rank files, entries, trees and stores compared lookup by lookup."""

from __future__ import annotations

import json
from pathlib import Path

from autotune_cache.tree.diff import compare_configs, token_positions
from autotune_cache.autotuner.rankfile import cache_file_bytes
from devtools.synthetic import DEFAULT_METADATA, default_fields, entry_path, fake_configs, write_fake_entry

from ..conftest import error_lines, imported_packages, run_cli

# as FlashInfer prints them: the cuBLAS runner's extras are bare dtypes (not a Python literal)
GEMM = "('fp8_gemm', 'CublasFp8GemmRunner', ((1, {m}, 8192), (1, 8192, 1024), (1,), (1,), (1, {m}, 1024)), (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16))"
GEMM_CUDNN = "('fp8_gemm', 'CudnnFp8GemmRunner', ((1, {m}, 8192), (1, 8192, 1024), (1,), (1,), (1, {m}, 1024)), ())"
MOE2 = "('trtllm::fused_moe::gemm2', 'MoERunner', (({r}, 768), (128, 2048, 768), ({m}, 8)), ())"


def configs(**tactics) -> dict:
    """m -> tactic for the GEMM (a ('cudnn', t) tuple moves it to the other runner)."""
    out = {}
    for name, t in tactics.items():
        m = int(name[1:])
        if isinstance(t, tuple):
            out[GEMM_CUDNN.format(m=m)] = ["CudnnFp8GemmRunner", t[1], ["l2_cache_policy", "hot"]]
        elif t is not None:
            out[GEMM.format(m=m)] = ["CublasFp8GemmRunner", t, ["l2_cache_policy", "hot"]]
    return out


def test_keys_with_bare_dtype_extras_parse():
    from autotune_cache.autotuner.rankfile import parse_file_key

    p = parse_file_key(GEMM.format(m=64))
    assert (p.custom_op, p.runner, p.profile[0]) == ("fp8_gemm", "CublasFp8GemmRunner", (1, 64, 8192))
    assert p.extras == ("(torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16)",)
    for bad in ("('fp8_gemm', 'R', ((1, 64),)", "('fp8_gemm', 'R', ((1, 'x'),), ())x", "nonsense"):
        assert parse_file_key(bad) is None


def test_slots_match_across_runners_and_buckets_come_from_the_varying_dimension():
    a = configs(m1=3, m2=5, m4=7, m8=1)
    b = configs(m1=3, m2=("cudnn", 2), m4=9, m16=4)
    c = compare_configs(a, b)
    assert c.counts == {"same": 1, "changed": 2, "added": 1, "dropped": 1}
    kinds = {(ch.slot.tokens, ch.kind) for ch in c.changes}
    assert kinds == {(2, "changed"), (4, "changed"), (8, "dropped"), (16, "added")}
    moe = {MOE2.format(r=8 * m, m=m): ["MoERunner", 1] for m in (1, 2, 4)}
    assert token_positions(moe) == {"trtllm::fused_moe::gemm2": (2, 0)}  # tokens, not tokens x top-k
    policy_only = dict(a)
    policy_only[GEMM.format(m=1)] = ["CublasFp8GemmRunner", 3, ["l2_cache_policy", "cold"]]
    c = compare_configs(a, policy_only)
    assert c.counts["changed"] == 1 and c.changes[0].what == "changed policy"  # the engine's lookup checks it
    assert {ch.what for ch in compare_configs(a, b).changes if ch.kind == "changed"} == {"changed runner", "changed tactic"}


def test_extras_tell_lookups_apart_and_a_second_key_for_a_lookup_is_an_addition():
    """Same op and shapes, other extras (a dtype): another lookup, never paired across. A key of
    a second runner for a lookup the other side answers once can shadow it: an addition."""
    bf16 = "('moe', 'R', ((4, 64),), (torch.bfloat16,))"
    fp16 = "('moe', 'R', ((4, 64),), (torch.float16,))"
    a = {bf16: ["R", 1], fp16: ["R", 1]}
    c = compare_configs(a, {bf16: ["R", 9], fp16: ["R", 1]})
    assert c.counts == {"same": 1, "changed": 1, "added": 0, "dropped": 0} and c.changes[0].key_a == bf16
    c = compare_configs({"('q', 'R', ((4, 64),), ('a',))": ["R", 1], "('q', 'R', ((4, 64),), ('b',))": ["R", 2]},
                        {"('q', 'R', ((4, 64),), ('a',))": ["R", 1]})
    assert c.counts == {"same": 1, "changed": 0, "added": 0, "dropped": 1}
    shadow = {**configs(m1=3, m4=7), GEMM_CUDNN.format(m=4): ["CudnnFp8GemmRunner", 2]}
    c = compare_configs(configs(m1=3, m4=7), shadow)
    assert c.counts == {"same": 2, "changed": 0, "added": 1, "dropped": 0}


def test_tokens_are_read_per_side():
    a = {GEMM.format(m=m).replace("8192", "7168"): ["CublasFp8GemmRunner", 1] for m in (1, 2, 4)}
    b = {GEMM.format(m=m).replace("8192", "4096"): ["CublasFp8GemmRunner", 1] for m in (1, 2, 4)}
    c = compare_configs(a, b)
    assert sorted((ch.kind, ch.slot.tokens) for ch in c.changes) == [("added", 1), ("added", 2), ("added", 4),
                                                                       ("dropped", 1), ("dropped", 2), ("dropped", 4)]


def write_file(path: Path, entries: dict) -> Path:
    path.write_bytes(cache_file_bytes(DEFAULT_METADATA, entries))
    return path


def test_two_rank_files(tmp_path):
    a = write_file(tmp_path / "a.json", configs(m1=3, m2=5, m4=7))
    b = write_file(tmp_path / "b.json", configs(m1=3, m2=6, m4=7, m8=2))
    proc = run_cli("diff", str(a), str(b))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.split()[:5] == ["fp8_gemm", "2", "changed", "tactic", "CublasFp8GemmRunner:5"] for line in lines)
    assert lines[-1] == "differ: 4 lookups compared, 2 same, 1 changed, 1 added (only B), 0 dropped (only A)"
    assert run_cli("diff", str(a), str(b), "--exit-code").returncode == 1
    same = run_cli("diff", str(a), str(a), "--exit-code")
    assert same.returncode == 0 and same.stdout.startswith("identical: 3 lookups")
    data = json.loads(run_cli("diff", str(a), str(b), "--json").stdout)
    assert (data["changed"], data["added"], data["identical"]) == (1, 1, False)
    assert data["comparisons"][0]["changes"][0]["a"] == ["CublasFp8GemmRunner", 5, ["l2_cache_policy", "hot"]]


def test_entries_by_id_and_by_directory(root):
    a = write_fake_entry(root, seed=1)
    b = write_fake_entry(root, fields=default_fields("org/other"), seed=2)
    by_id = json.loads(run_cli("diff", str(a), str(b), "--cache-dir", str(root), "--json").stdout)
    n = len(fake_configs())
    assert by_id["same"] + by_id["changed"] == n and by_id["changed"] > 0
    # the ranks of one workload share one file: one comparison, not one per rank
    assert len(by_id["comparisons"]) == 1
    by_dir = json.loads(run_cli("diff", str(entry_path(root, a)), str(entry_path(root, b)), "--json").stdout)
    assert by_dir["changed"] == by_id["changed"]
    assert run_cli("diff", str(a), str(a), "--cache-dir", str(root), "--exit-code").returncode == 0


def test_trees_pair_entries_by_id(tmp_path):
    ta, tb = tmp_path / "a", tmp_path / "b"
    shared = write_fake_entry(ta, seed=1)
    write_fake_entry(tb, seed=3)  # same id, other tactics
    only_a = write_fake_entry(ta, fields=default_fields("org/a-only"))
    only_b = write_fake_entry(tb, fields=default_fields("org/b-only"))
    data = json.loads(run_cli("diff", str(ta), str(tb), "--json").stdout)
    assert data["only_a"] == [str(only_a)] and data["only_b"] == [str(only_b)]
    assert {c["entry"] for c in data["comparisons"]} == {str(shared)} and data["changed"] > 0
    human = run_cli("diff", str(ta), str(tb)).stdout
    assert f"only in A  {only_a}" in human and f"only in B  {only_b}" in human


def test_a_tree_against_a_store(tmp_path):
    tree, other = tmp_path / "tree", tmp_path / "other"
    eid = write_fake_entry(tree, seed=1)
    write_fake_entry(other, seed=1)
    store = f"file://{tmp_path / 'store'}"
    assert run_cli("push", store, "--cache-dir", str(other)).returncode == 0
    data = json.loads(run_cli("diff", str(tree), store, "--json").stdout)
    assert data["identical"] and data["comparisons"][0]["entry"] == str(eid)
    write_fake_entry(tmp_path / "changed", seed=5)  # same id, other tactics
    store2 = f"file://{tmp_path / 'store2'}"
    assert run_cli("push", store2, "--cache-dir", str(tmp_path / "changed")).returncode == 0
    assert run_cli("diff", str(tree), store2, "--exit-code").returncode == 1


def test_what_the_engine_would_notice_is_never_identical(tmp_path, root):
    """Missing rank files, another environment's _metadata, unreadable files: all differences."""
    import shutil

    eid = write_fake_entry(root, seed=1)
    other = tmp_path / "other"
    shutil.copytree(root, other)
    for p in list(entry_path(other, eid).glob("rank_*.json"))[:3]:
        p.unlink()
    proc = run_cli("diff", str(root), str(other), "--exit-code")
    assert proc.returncode == 1 and proc.stdout.count("only in A  ") == 3 and "3 only in A" in proc.stdout, proc.stdout
    a = write_file(tmp_path / "a.json", configs(m1=3))
    meta = json.loads(a.read_text())
    meta["_metadata"]["gpu"] = "NVIDIA H100 80GB HBM3"
    b = tmp_path / "b.json"
    b.write_bytes(cache_file_bytes(meta["_metadata"], configs(m1=3)))
    proc = run_cli("diff", str(a), str(b), "--exit-code")
    assert proc.returncode == 1 and "metadata   gpu:" in proc.stdout and "_metadata differs in 1" in proc.stdout
    broken = tmp_path / "broken"
    shutil.copytree(root, broken)
    victim = sorted(entry_path(broken, eid).glob("rank_*.json"))[0]
    victim.write_text("{")
    proc = run_cli("diff", str(root), str(broken), "--json")
    data = json.loads(proc.stdout)
    assert proc.returncode == 0 and not data["identical"] and len(data["notes"]) == 1 and data["comparisons"]


def test_a_file_against_an_entry_whose_ranks_differ(tmp_path):
    from autotune_cache.registry import default_layout
    from devtools.synthetic import make_manifest
    from autotune_cache.plan.topology import Topology
    from autotune_cache.tree.writer import commit_entry

    fields = default_fields("org/m", tp=2, dp=1)
    topo = Topology(tp=2, pp=1, dp=1)
    names = topo.rank_files()
    files = {names[0]: cache_file_bytes(DEFAULT_METADATA, configs(m1=1)), names[1]: cache_file_bytes(DEFAULT_METADATA, configs(m1=2))}
    layout = default_layout()
    m = make_manifest(fields, topo, "0.7.2.post1", "sm90", metadata=DEFAULT_METADATA)
    eid = layout.make_id(("0.7.2.post1", "sm90", m.key))
    root = tmp_path / "root"
    commit_entry(layout, root, eid, files, m)
    rank0 = entry_path(root, eid) / names[0]
    data = json.loads(run_cli("diff", str(rank0), str(entry_path(root, eid)), "--json").stdout)
    assert [c["label"] for c in data["comparisons"]] == [f"vs {names[0]}", f"vs {names[1]}"]
    assert [c["same"] for c in data["comparisons"]] == [1, 0]


def test_usage_errors(tmp_path, root):
    a = write_fake_entry(root)
    write_file(tmp_path / "x.json", configs(m1=1))
    proc = run_cli("diff", str(root), str(tmp_path / "x.json"))
    assert proc.returncode == 2 and "compare a tree or store with a tree, a store or an entry id" in proc.stderr
    proc = run_cli("diff", "0.7.2.post1/sm90/ffffffffffffffff", str(a), "--cache-dir", str(root))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (tmp_path / "junk.json").write_text("{not json")
    proc = run_cli("diff", str(tmp_path / "junk.json"), str(tmp_path / "x.json"))
    assert proc.returncode == 1 and "not a readable FlashInfer cache file" in proc.stderr
    proc = run_cli("diff", str(tmp_path / "x.json"), str(tmp_path / "x.json"), "--measure")
    assert proc.returncode == 0  # identical: nothing to measure
    write_file(tmp_path / "y.json", configs(m1=2))
    proc = run_cli("diff", str(tmp_path / "x.json"), str(tmp_path / "y.json"), "--measure", env={"PYTHONPROFILEIMPORTTIME": "1"})
    errors = error_lines(proc.stderr)
    assert proc.returncode == 2 and "recorded" in errors[0] and len(errors) == 1
    imported = imported_packages(proc.stderr)
    assert "click" in imported and "torch" not in imported  # nothing to measure: said without importing torch
    proc = run_cli("diff", str(tmp_path / "missing.json"), str(tmp_path / "x.json"))
    assert proc.returncode == 1 and "missing.json: no such file or directory" in proc.stderr
    proc = run_cli("diff", str(tmp_path / "junk.json"), str(tmp_path / "x.json"), "--exit-code")
    assert proc.returncode == 2  # with --exit-code, 1 means "they differ": trouble is 2
    assert run_cli("diff", "", str(tmp_path / "x.json")).returncode == 2
    (tmp_path / "link.json").symlink_to(tmp_path / "x.json")
    assert run_cli("diff", str(tmp_path / "link.json"), str(tmp_path / "x.json"), "--exit-code").returncode == 0
