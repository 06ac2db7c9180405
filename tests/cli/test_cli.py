"""The commands as a user runs them: real processes, real files, exit codes 0/1/2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune_cache.autotuner.fingerprint import cuda_device_possible
from autotune_cache.registry import default_layout
from devtools.synthetic import DEFAULT_METADATA, default_fields, entry_path, write_fake_entry

from ..conftest import REPO, error_lines, imported_packages, run_cli, run_json

KEY_ARGS = [
    "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--pp", "1", "--dp", "8", "--ep", "1", "--dtype", "bfloat16",
    "--quantization", "fp8", "--moe-runner-backend", "flashinfer_trtllm", "--config-class", "GlmMoeDsaConfig",
    "--arch", "sm100", "--flashinfer-version", "0.7.2.post1",
]
GLM_ID = "0.7.2.post1/sm100/d99390dfa961185d"


def ids(root, *args) -> list[str]:
    proc = run_cli("ls", "-q", *args, "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def age(root, eid, days: float, atime_days: float | None = None) -> None:
    t = time.time() - days * 86400
    a = t if atime_days is None else time.time() - atime_days * 86400
    for p in entry_path(root, eid).iterdir():
        os.utime(p, (a, t))


def test_key_command_prints_key_string_and_rank_paths(root):
    out = run_json("key", *KEY_ARGS, "--cache-dir", str(root))
    assert out["key"] == "d99390dfa961185d" and out["id"] == GLM_ID
    assert out["key_string"].endswith("|GlmMoeDsaConfig|candidate_selection=v2_default|skip_ops=")
    assert out["rank_files"][7] == str(root / "flashinfer/autotune/0.7.2.post1/sm100/d99390dfa961185d/rank_tp7_pp0_dp7.json")
    q = run_cli("key", *KEY_ARGS, "-q")
    assert q.stdout.strip() == GLM_ID  # -q prints ids, as its help (and every other command) says


def test_key_quantization_none_and_replicas(root):
    out = run_json("key", "--model", "m", "--tp", "2", "--dp", "2", "--no-dp-attention", "--quantization", "None",
                   "--config-class", "LlamaConfig", "--arch", "SM90", "--flashinfer-version", "0.7.2.post1",
                   "--cache-dir", str(root))
    assert out["key_string"] == "m|torch.bfloat16|None|auto|2|1|1|1|LlamaConfig|candidate_selection=v2_default|skip_ops="
    assert [Path(p).name for p in out["rank_files"]] == [
        "rank_tp0_pp0_dp0.json", "rank_tp0_pp0_dp1.json", "rank_tp1_pp0_dp0.json", "rank_tp1_pp0_dp1.json"]


@pytest.mark.parametrize("args,needle", [
    (["key", *KEY_ARGS, "--schema", "nope"], "unknown key schema"),
    (["key", *KEY_ARGS, "--dp", "3"], "divisible"),
    (["key", *KEY_ARGS, "--tp", "-1"], "-1 is not in the range"),
    (["key", *KEY_ARGS, "--arch", "hopper"], "invalid --arch"),
    (["key", *KEY_ARGS, "--dtype", "int7"], "unknown dtype"),
    (["prune", "--keep-latest", "-1", "-y"], "--keep-latest"),
    (["prune", "--older-than", "soon", "-y"], "invalid duration"),
    (["prune", "-y"], "nothing selected"),
    (["prune", "--arch", "hopper", "-y"], "invalid arch 'hopper'"),
    (["ls", "--status", "weird"], "unknown status 'weird'"),
    (["ls", "--status", "complete,weird"], "unknown status 'weird'"),
    (["ls", "--flashinfer-version", "../x"], "invalid FlashInfer version"),
    (["ls", "--bogus"], "No such option"),
    (["show"], "Missing argument"),
    (["plan", "--model", "Qwen/Qwen3-30B-A3B", "--arch", "sm90", "--tp", "0"], "0 is not in the range"),
])
def test_usage_errors_exit_2_with_one_line(root, args, needle):
    write_fake_entry(root)
    proc = run_cli(*args, "--cache-dir", str(root))
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_bare_command_prints_help_and_succeeds():
    proc = run_cli()
    assert proc.returncode == 0 and "Commands:" in proc.stdout and proc.stderr == ""
    assert "Exit codes: 0 ok, 1 failure, 2 usage error, 130 interrupted" in " ".join(proc.stdout.split())


def test_cache_dir_that_is_a_file_is_a_usage_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    for cmd in (["ls"], ["prune", "--status", "corrupt", "-y"], ["key", *KEY_ARGS], ["rm", GLM_ID]):
        proc = run_cli(*cmd, "--cache-dir", str(f))
        assert proc.returncode == 2 and "not a directory" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_missing_root_is_an_error_naming_where_it_came_from(tmp_path):
    typo = tmp_path / "typo"
    for cmd in (["ls"], ["show", GLM_ID], ["prune", "--status", "corrupt", "-y"], ["rm", GLM_ID], ["export", "-o", str(tmp_path / "x.tgz")]):
        proc = run_cli(*cmd, "--cache-dir", str(typo))
        assert proc.returncode == 1, (cmd, proc.stderr)
        assert f"cache root {typo} does not exist (from --cache-dir)" in proc.stderr
    proc = run_cli("ls", env={"SGLANG_CACHE_DIR": str(typo)})
    assert proc.returncode == 1 and "(from $SGLANG_CACHE_DIR)" in proc.stderr
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_CACHE_DIR"}
    proc = subprocess.run([sys.executable, "-m", "fi_autotune_cli", "ls"], capture_output=True, text=True, cwd=REPO,
                          env={**env, "HOME": str(tmp_path / "home")})
    assert proc.returncode == 1 and "(from the default ~/.cache/sglang)" in proc.stderr
    # a root that exists but holds no cache yet is simply empty
    (tmp_path / "empty").mkdir()
    proc = run_cli("ls", "--cache-dir", str(tmp_path / "empty"))
    assert proc.returncode == 0 and "0 entries" in proc.stdout and "nothing cached" in proc.stdout


def test_autotune_dir_that_is_a_file_is_an_error(tmp_path):
    (tmp_path / "flashinfer").mkdir()
    (tmp_path / "flashinfer" / "autotune").write_text("")
    proc = run_cli("ls", "--cache-dir", str(tmp_path))
    assert proc.returncode == 1 and "is not a directory" in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_ls_table_filters_and_quiet(root):
    a = write_fake_entry(root)
    b = write_fake_entry(root, fields=default_fields("Qwen/Qwen3-30B-A3B", tp=2, dp=1), arch="sm90")
    c = write_fake_entry(root, flashinfer_version="0.7.1")
    proc = run_cli("ls", "--cache-dir", str(root))
    assert proc.returncode == 0
    header = proc.stdout.splitlines()[0].split()
    assert header == ["ID", "LAYOUT", "MODEL", "GPU", "PARALLEL", "RANKS", "CONFIGS", "SIZE", "MODIFIED", "USED", "STATUS"]
    row = next(line for line in proc.stdout.splitlines() if line.startswith(str(a)))
    assert "H200" in row and "tp8 dp8a ep1" in row
    assert "3 entries, 18 rank files" in proc.stdout and "(3 complete)" in proc.stdout
    assert ids(root, "--arch", "SM90") == [str(b)]
    assert ids(root, "--arch", "sm90,sm100", "--model-glob", "*glm*", "--flashinfer-version", "0.7.1") == [str(c)]
    assert sorted(ids(root, "--flashinfer-version", "0.7.1,0.7.2.post1", "--status", "complete")) == sorted(map(str, (a, b, c)))
    data = run_json("ls", "--sort", "size", "--cache-dir", str(root))
    assert [e["size_on_disk"] for e in data["entries"]] == sorted((e["size_on_disk"] for e in data["entries"]), reverse=True)
    assert data["totals"]["entries"] == 3 and {e["id"] for e in data["entries"]} == {str(a), str(b), str(c)}
    age(root, b, 40)
    assert ids(root, "--older-than", "30d") == [str(b)]
    one = run_cli("ls", "--arch", "sm90", "--cache-dir", str(root))
    assert "\n1 entry, 2 rank files" in one.stdout


def test_ls_unused_for_uses_access_time(root):
    a = write_fake_entry(root)
    b = write_fake_entry(root, flashinfer_version="0.7.1")
    age(root, a, 60, atime_days=1)  # written 60 days ago, read yesterday
    age(root, b, 60)  # written and last read 60 days ago
    assert sorted(ids(root, "--older-than", "30d")) == sorted([str(a), str(b)])
    assert ids(root, "--unused-for", "30d") == [str(b)]


def test_ls_honours_sglang_cache_dir(root):
    write_fake_entry(root)
    proc = run_cli("ls", "-q", env={"SGLANG_CACHE_DIR": str(root)})
    assert proc.stdout.split() == [GLM_ID]


def test_show_by_id_unique_key_and_path(root):
    eid = write_fake_entry(root)
    kdir = entry_path(root, eid)
    for ref in (str(eid), eid.name, str(kdir)):
        proc = run_cli("show", ref, "--cache-dir", str(root))
        assert proc.returncode == 0, proc.stderr
        assert "zai-org/GLM-5.1-FP8" in proc.stdout and "trtllm::fused_moe::gemm1" in proc.stdout
        assert "GPU       NVIDIA H200" in proc.stdout and "tp=8 pp=1 dp=8 (dp-attention)" in proc.stdout
    (doc,) = run_json("show", eid.name, "--cache-dir", str(root))["entries"]
    ops = {o["custom_op"]: o for o in doc["ops"]}
    assert ops["trtllm::fused_moe::gemm1"]["buckets"] == 21
    assert doc["metadata"]["gpu"] == "NVIDIA H200" and doc["gpu"] == "NVIDIA H200"
    missing = run_cli("show", "0000000000000000", "--cache-dir", str(root))
    assert missing.returncode == 1 and "no cache entry" in missing.stderr


def test_a_key_under_two_versions_is_ambiguous_everywhere(root, tmp_path):
    a = write_fake_entry(root)
    b = write_fake_entry(root, flashinfer_version="0.7.1")
    for cmd in (["show", a.name], ["rm", a.name, "-y"], ["export", a.name, "-o", str(tmp_path / "x.tgz")], ["verify", a.name]):
        proc = run_cli(*cmd, "--cache-dir", str(root))
        assert proc.returncode == 1, (cmd, proc.stderr)  # a lookup failure, as an unknown id is
        assert f"names 2 entries; give one id: {b}, {a}" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert sorted(ids(root)) == sorted([str(a), str(b)])  # nothing was deleted


def test_a_unique_key_prefix_names_its_entry_and_an_ambiguous_one_deletes_nothing(root):
    a = write_fake_entry(root)
    b = write_fake_entry(root, fields=default_fields("Qwen/Qwen3-30B-A3B", tp=2, dp=1))
    shared = next(n for n in range(16, 0, -1) if a.name[:n] == b.name[:n]) if a.name[0] == b.name[0] else 0
    (doc,) = run_json("show", a.name[:max(4, shared + 1)], "--cache-dir", str(root))["entries"]
    assert doc["id"] == str(a)
    (doc,) = run_json("show", f"{a.parts[0]}/{a.parts[1]}/{a.name[:max(4, shared + 1)]}", "--cache-dir", str(root))["entries"]
    assert doc["id"] == str(a)
    short = run_cli("show", a.name[:3], "--cache-dir", str(root))  # under 4 digits: not a prefix
    assert short.returncode == 1 and "no cache entry" in short.stderr
    # two entries under one prefix: refused, listing both, nothing deleted
    c = write_fake_entry(root, flashinfer_version="0.7.1")
    proc = run_cli("rm", "-y", a.name[:6], "--cache-dir", str(root))
    assert proc.returncode == 1 and f"names 2 entries; give one id: {c}, {a}" in proc.stderr, proc.stderr
    assert sorted(ids(root)) == sorted(map(str, (a, b, c)))
    gone = run_cli("rm", "-y", b.name[:8], "--cache-dir", str(root))
    assert gone.returncode == 0, gone.stderr
    assert sorted(ids(root)) == sorted(map(str, (a, c)))


def test_prune_on_a_node_without_a_cache_root_has_nothing_to_do(tmp_path):
    missing = tmp_path / "never-made"
    proc = run_cli("prune", "--older-than", "30d", "-y", "--missing-ok", "--cache-dir", str(missing))
    assert proc.returncode == 0, proc.stderr  # a cron job on a fresh node does not fail
    assert proc.stdout.strip() == f"nothing to prune: cache root {missing} does not exist (from --cache-dir)"
    assert not missing.exists()  # and it made nothing
    doc = json.loads(run_cli("prune", "--older-than", "30d", "--json", "--missing-ok", "--cache-dir", str(missing)).stdout)
    assert doc["plan"] is None and "does not exist" in doc["root_missing"]
    # without --missing-ok a missing root (a typo?) is still an error
    assert run_cli("prune", "--older-than", "30d", "-y", "--cache-dir", str(missing)).returncode == 1
    # reading commands still say the root is missing (exit 1)
    assert run_cli("ls", "--cache-dir", str(missing)).returncode == 1


def test_debug_goes_anywhere_before_the_double_dash(tmp_path):
    proc = run_cli("ls", "--cache-dir", str(tmp_path / "nope"), "--debug")
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "No such option" not in proc.stderr


def test_prune_max_size_evicts_least_recently_used_until_the_tree_fits(root):
    a = write_fake_entry(root, seed=1)
    b = write_fake_entry(root, fields=default_fields("Qwen/Qwen3-30B-A3B", tp=2, dp=1), seed=2)
    c = write_fake_entry(root, fields=default_fields("Qwen/Qwen3-30B-A3B", tp=4, dp=1), seed=3)
    age(root, a, 30, atime_days=3)  # used 3 days ago
    age(root, b, 30, atime_days=1)
    age(root, c, 30, atime_days=0.1)
    sizes = {e["id"]: e["size_on_disk"] for e in run_json("ls", "--cache-dir", str(root))["entries"]}
    total = sum(sizes.values())
    cd = ["--cache-dir", str(root)]
    # one byte over the budget once a is gone: a alone goes (the least recently used)
    plan = run_json("prune", "--max-size", f"{total - sizes[str(a)]}B", "--dry-run", *cd)
    assert [e["id"] for e in plan["plan"]["entries"]] == [str(a)]
    assert "least recently used (used 3d ago)" in plan["plan"]["entries"][0]["reasons"][-1]
    # with a filter only what it selects may go, however old the rest
    plan = run_json("prune", "--max-size", "1B", "--model", "Qwen/Qwen3-30B-A3B", "--dry-run", *cd)
    assert sorted(e["id"] for e in plan["plan"]["entries"]) == sorted([str(b), str(c)])
    # an entry the filters keep is never counted as evicted: b, the filter's least recent, goes
    plan = run_json("prune", "--max-size", f"{total - min(sizes.values())}B", "--model", "Qwen/Qwen3-30B-A3B",
                    "--dry-run", *cd)
    assert [e["id"] for e in plan["plan"]["entries"]] == [str(b)]
    # a budget the tree already fits: nothing
    assert run_json("prune", "--max-size", f"{total}B", "--dry-run", *cd)["plan"]["entries"] == []
    proc = run_cli("prune", "--max-size", f"{total - sizes[str(a)] - 1}B", "-y", *cd)
    assert proc.returncode == 0, proc.stderr
    assert sorted(ids(root)) == [str(c)]  # a, then b (older use) went; c, used last, stays
    bad = run_cli("prune", "--max-size", "50X", *cd)
    assert bad.returncode == 2 and "invalid size '50X'" in bad.stderr


def test_prune_dry_run_is_the_same_plan_and_deletes_nothing(root):
    write_fake_entry(root, flashinfer_version="0.7.1")
    keep = write_fake_entry(root)
    before = sorted(p for p in root.rglob("*"))
    dry = run_json("prune", "--flashinfer-version", "0.7.1", "--dry-run", "--cache-dir", str(root))
    assert sorted(p for p in root.rglob("*")) == before
    real = run_json("prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", str(root))
    assert [e["id"] for e in dry["plan"]["entries"]] == [e["id"] for e in real["plan"]["entries"]]
    assert real["result"]["deleted"] == [e["id"] for e in dry["plan"]["entries"]]
    assert real["result"]["freed"] == dry["plan"]["expected_freed_size"] > 0
    # empty version/arch dirs are gone, the other entry untouched
    assert not (root / "flashinfer/autotune/0.7.1").exists()
    assert ids(root) == [str(keep)]


def test_prune_says_why_in_the_users_words(root):
    eid = write_fake_entry(root)
    age(root, eid, 40)
    proc = run_cli("prune", "--older-than", "30d", "--arch", "SM100", "--dry-run", "--cache-dir", str(root))
    assert proc.returncode == 0
    assert "arch sm100; not modified for 30d" in proc.stdout and "2592000" not in proc.stdout
    assert "Would free" in proc.stdout and "(1 entry)" in proc.stdout


def test_prune_has_the_ls_filters(root):
    a = write_fake_entry(root)
    b = write_fake_entry(root, fields=default_fields("Qwen/Qwen3-30B-A3B", tp=2, dp=1), arch="sm90")
    out = run_json("prune", "--model-glob", "*qwen*", "--arch", "sm90,sm100", "-y", "--cache-dir", str(root))
    assert out["result"]["deleted"] == [str(b)]
    assert ids(root) == [str(a)]


def test_prune_refuses_to_prompt_without_tty(root):
    write_fake_entry(root)
    proc = run_cli("prune", "--status", "complete", "--cache-dir", str(root), input="y\n")
    assert proc.returncode == 2 and "-y" in proc.stderr
    assert ids(root) == [GLM_ID]


def test_keep_latest_groups_by_deployment_and_prefers_complete(root):
    """The issue's case: a complete TP8/DP8 entry and a newer incomplete EP8 one are two
    deployments (different keys): --keep-latest 1 keeps both. Within one deployment (one key
    under two FlashInfer versions) a complete entry is kept over a newer incomplete one."""
    tp8dp8 = write_fake_entry(root)
    ep8 = write_fake_entry(root, fields=default_fields(ep=8))
    (entry_path(root, ep8) / "rank_tp3_pp0_dp3.json").unlink()
    age(root, tp8dp8, 10)
    plan = run_json("prune", "--keep-latest", "1", "--dry-run", "--cache-dir", str(root))
    assert plan["plan"]["entries"] == []
    # (neither version is installed here: the installed one is kept first, whatever its status)
    older_complete = write_fake_entry(root, fields=default_fields("A", tp=2, dp=1), flashinfer_version="0.7.0")
    newer_incomplete = write_fake_entry(root, fields=default_fields("A", tp=2, dp=1), flashinfer_version="0.7.1")
    (entry_path(root, newer_incomplete) / "rank_tp1_pp0_dp0.json").unlink()
    age(root, older_complete, 20)
    plan = run_json("prune", "--keep-latest", "1", "--dry-run", "--cache-dir", str(root))
    (picked,) = plan["plan"]["entries"]
    assert picked["id"] == str(newer_incomplete)
    assert f"kept: {older_complete}" in picked["reasons"][-1]


def test_prune_keep_latest_keeps_newest_per_deployment(root):
    a = [write_fake_entry(root, fields=default_fields("A", tp=2, dp=1), flashinfer_version=v) for v in ("0.6.9", "0.7.1", "0.7.2.post1")]
    for i, eid in enumerate(a):
        age(root, eid, 30 - 10 * i)
    other = write_fake_entry(root, fields=default_fields("B", tp=2, dp=1))
    out = run_json("prune", "--keep-latest", "1", "-y", "--cache-dir", str(root))
    assert sorted(out["result"]["deleted"]) == sorted([str(a[0]), str(a[1])])
    assert sorted(ids(root)) == sorted([str(a[2]), str(other)])


def test_prune_other_versions_keeps_installed(root):
    from importlib.metadata import version

    here = version("flashinfer-python")
    write_fake_entry(root, flashinfer_version=here)
    old = write_fake_entry(root, flashinfer_version="0.6.0")
    out = run_json("prune", "--other-versions", "-y", "--cache-dir", str(root))
    assert out["result"]["deleted"] == [str(old)]


def test_rm_deletes_named_entries_only(root):
    a = write_fake_entry(root)
    b = write_fake_entry(root, flashinfer_version="0.7.1")
    dry = run_cli("rm", str(a), "--dry-run", "--cache-dir", str(root))
    assert dry.returncode == 0 and "Would free" in dry.stdout and str(a) in dry.stdout
    assert sorted(ids(root)) == sorted([str(a), str(b)])
    assert run_cli("rm", str(a), "--cache-dir", str(root), input="y\n").returncode == 2  # no tty, no -y
    out = run_json("rm", str(a), "-y", "--cache-dir", str(root))
    assert out["result"]["deleted"] == [str(a)]
    assert ids(root) == [str(b)]
    missing = run_cli("rm", str(b), "0.7.1/sm100/0000000000000000", "-y", "--cache-dir", str(root))
    assert missing.returncode == 1 and "no cache entry '0.7.1/sm100/0000000000000000'" in missing.stderr
    assert ids(root) == [str(b)]  # an unknown name stops rm before anything is deleted


LOCK_HOLDER = """
import sys, time
from pathlib import Path
from autotune_cache.registry import default_layout
from autotune_cache.tree.crashsafe.locks import entry_lock
layout = default_layout()
with entry_lock(layout, Path(sys.argv[1]), layout.parse_id(sys.argv[2])):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_prune_skips_entry_locked_by_a_running_writer(root):
    eid = write_fake_entry(root, flashinfer_version="0.7.1")
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(root), str(eid)],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "locked"
        out = run_json("prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", str(root))
        assert out["result"]["deleted"] == []
        assert out["result"]["skipped"] == [{"entry": str(eid), "reason": "locked by a running writer"}]
        assert ids(root) == [str(eid)]
    finally:
        holder.kill()
        holder.wait()


def test_prune_leaves_an_entry_changed_since_the_plan(root):
    """The plan is what was shown; an entry re-tuned between plan and execution stays."""
    from autotune_cache.tree.delete import plan_prune
    from autotune_cache.tree.select import EntryFilter
    from autotune_cache.tree.scanner.scan import scan_cache
    from autotune_cache.tree.status import EntryStatus

    eid = write_fake_entry(root)
    plan = plan_prune(scan_cache(root), EntryFilter(statuses=(EntryStatus.COMPLETE,)))
    write_fake_entry(root, seed=7)  # a writer replaced it meanwhile
    result = plan.execute()
    assert result.deleted == () and result.skipped == ((str(eid), "changed since the plan was made"),)
    assert ids(root) == [str(eid)]


def test_export_import_roundtrip(root, tmp_path):
    a = write_fake_entry(root)
    b = write_fake_entry(root, fields=default_fields("m2", tp=2, dp=2), arch="sm90", with_manifest=False)
    archive = tmp_path / "caches.tar.gz"
    proc = run_cli("export", "-o", str(archive), "--cache-dir", str(root))
    assert proc.returncode == 0 and f"skipping {b}: unverified" in proc.stderr, proc.stderr
    proc = run_cli("export", "--include-incomplete", "-o", str(archive), "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    dest = tmp_path / "image-cache"
    out = run_json("import", str(archive), "--cache-dir", str(dest))
    assert sorted(out["imported"]) == sorted([str(a), str(b)])
    for eid in (a, b):
        for p in entry_path(root, eid).glob("rank_*.json"):
            assert (entry_path(dest, eid) / p.name).read_bytes() == p.read_bytes()
    listed = run_json("ls", "--cache-dir", str(dest))
    assert {e["id"]: e["status"] for e in listed["entries"]} == {str(a): "complete", str(b): "unverified"}
    again = run_json("import", str(archive), "--cache-dir", str(dest))
    assert again["imported"] == [] and sorted(again["unchanged"]) == sorted([str(a), str(b)])


def test_export_is_reproducible_and_streams(root, tmp_path):
    write_fake_entry(root)
    write_fake_entry(root, fields=default_fields("m2", tp=2, dp=1), arch="sm90")
    one, two = tmp_path / "1.tgz", tmp_path / "2.tgz"
    assert run_cli("export", "-o", str(one), "--cache-dir", str(root)).returncode == 0
    time.sleep(1.1)  # a timestamp anywhere in the archive would now differ
    assert run_cli("export", "-o", str(two), "--cache-dir", str(root)).returncode == 0
    assert one.read_bytes() == two.read_bytes()
    piped = subprocess.run([sys.executable, "-m", "fi_autotune_cli", "export", "-o", "-", "--cache-dir", str(root)],
                           capture_output=True, cwd=REPO)
    assert piped.returncode == 0 and piped.stdout == one.read_bytes()
    dest = tmp_path / "dest"
    proc = subprocess.run([sys.executable, "-m", "fi_autotune_cli", "import", "-", "--cache-dir", str(dest)],
                          input=piped.stdout, capture_output=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert len(ids(dest)) == 2


def test_export_takes_only_complete_entries_unless_asked(root, tmp_path):
    done = write_fake_entry(root)
    partial = write_fake_entry(root, flashinfer_version="0.7.1")
    for name in ("rank_tp6_pp0_dp6.json", "rank_tp7_pp0_dp7.json"):
        (entry_path(root, partial) / name).unlink()
    archive = tmp_path / "x.tgz"
    proc = run_cli("export", "-o", str(archive), "--cache-dir", str(root))
    assert proc.returncode == 0 and f"skipping {partial}: incomplete (6/8 rank files" in proc.stderr
    assert ids(_imported(archive, tmp_path / "d1")) == [str(done)]
    proc = run_cli("export", "--include-incomplete", "-o", str(archive), "--cache-dir", str(root))
    assert proc.returncode == 0 and "warning: exporting" in proc.stderr
    imp = run_cli("import", str(archive), "--cache-dir", str(tmp_path / "d2"))
    assert imp.returncode == 0 and "incomplete (6 of 8 rank files)" in imp.stderr
    # filters as ls has them
    proc = run_cli("export", "--flashinfer-version", "0.7.2.post1", "--arch", "SM100", "-o", str(archive), "--cache-dir", str(root))
    assert proc.returncode == 0 and ids(_imported(archive, tmp_path / "d3")) == [str(done)]
    proc = run_cli("export", "--status", "corrupt", "-o", str(archive), "--cache-dir", str(root))
    assert proc.returncode == 1 and "nothing to export" in proc.stderr


def _imported(archive: Path, dest: Path) -> Path:
    proc = run_cli("import", str(archive), "--cache-dir", str(dest))
    assert proc.returncode == 0, proc.stderr
    return dest


def test_a_refused_import_taking_its_empty_tree_away_does_not_break_a_concurrent_one(root, tmp_path, monkeypatch):
    """Two imports into one new root: the refused one made the tree and takes it away again just
    as the other has made it too (between its mkdirs and its owner lock). The other must make it
    again and import, not fail with 'cannot write to the cache tree'."""
    from autotune_cache.tree.crashsafe import txn
    from autotune_cache.tree.store.archive import import_archive

    eid = write_fake_entry(root)
    archive = tmp_path / "a.tgz"
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(root)).returncode == 0
    dest = tmp_path / "new" / "root"
    refused = txn.Transaction(default_layout(), dest)  # made new/root/flashinfer/autotune/...
    assert refused.created == tmp_path / "new"
    real = txn.hold_owner_lock

    def late(base, *args):
        if refused.staged is not None and (tmp_path / "new").exists():
            refused.discard()  # as the refused import ends: its (still empty) tree goes
            assert not (tmp_path / "new").exists()
        return real(base, *args)

    monkeypatch.setattr(txn, "hold_owner_lock", late)
    with open(archive, "rb") as f:
        result = import_archive(default_layout(), dest, f, "a.tgz")
    assert [str(e) for e in result.imported] == [str(eid)]
    assert (entry_path(dest, eid) / "rank_tp0_pp0_dp0.json").is_file()


def test_import_refuses_different_complete_entry_without_force(root, tmp_path):
    write_fake_entry(root, seed=1)
    archive = tmp_path / "a.tar.gz"
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(root)).returncode == 0
    dest = tmp_path / "dest"
    eid = write_fake_entry(dest, seed=2)
    dst = entry_path(dest, eid)
    before = {p.name: p.read_bytes() for p in dst.iterdir()}
    proc = run_cli("import", str(archive), "--cache-dir", str(dest))
    assert proc.returncode == 1 and "--force" in proc.stderr
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before
    forced = run_cli("import", str(archive), "--force", "--cache-dir", str(dest))
    assert forced.returncode == 0, forced.stderr
    src = entry_path(root, eid)
    assert (dst / "rank_tp0_pp0_dp0.json").read_bytes() == (src / "rank_tp0_pp0_dp0.json").read_bytes()


def test_import_refuses_to_replace_another_gpu_models_cache(root, tmp_path):
    """H100 and H200 share sm90/<key>: an H200 archive must not silently evict an H100 cache."""
    fields = default_fields("m", tp=2, dp=1)
    write_fake_entry(root, fields=fields, arch="sm90", metadata={"gpu": "NVIDIA H200"})
    archive = tmp_path / "h200.tgz"
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(root)).returncode == 0
    dest = tmp_path / "dest"
    eid = write_fake_entry(dest, fields=fields, arch="sm90", metadata={"gpu": "NVIDIA H100 80GB HBM3"})
    (entry_path(dest, eid) / "rank_tp1_pp0_dp0.json").unlink()  # even an incomplete one
    proc = run_cli("import", str(archive), "--cache-dir", str(dest))
    assert proc.returncode == 1
    assert "holds a cache tuned on NVIDIA H100 80GB HBM3, not NVIDIA H200" in proc.stderr and "--force" in proc.stderr
    assert run_json("ls", "--cache-dir", str(dest))["entries"][0]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert run_cli("import", str(archive), "--force", "--cache-dir", str(dest)).returncode == 0
    assert run_json("ls", "--cache-dir", str(dest))["entries"][0]["gpu"] == "NVIDIA H200"


def test_export_to_an_unwritable_path_is_one_line(root):
    write_fake_entry(root)
    proc = run_cli("export", "-o", "/proc/self/x.tar.gz", "--cache-dir", str(root))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "cannot write /proc/self/x.tar.gz" in proc.stderr


def test_debug_shows_the_traceback(root):
    write_fake_entry(root)
    proc = run_cli("--debug", "export", "-o", "/proc/self/x.tar.gz", "--cache-dir", str(root))
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "cannot write /proc/self/x.tar.gz" in proc.stderr


def test_tree_commands_do_not_import_torch_or_flashinfer(root, tmp_path):
    write_fake_entry(root)
    archive = tmp_path / "x.tar.gz"
    env_file = tmp_path / "env.json"
    env_file.write_text(json.dumps({"fingerprint": DEFAULT_METADATA}))
    cmds = [
        ["ls"], ["ls", "--json"], ["ls", "--env-from", str(env_file)], ["show", GLM_ID],
        ["prune", "--status", "corrupt", "--dry-run"], ["prune", "--status", "stale", "--env-from", str(env_file), "--dry-run"],
        ["rm", GLM_ID, "--dry-run"], ["key", *KEY_ARGS], ["export", "-o", str(archive)], ["import", str(archive)],
        ["diff", GLM_ID, GLM_ID], ["show", GLM_ID, "--buckets"],
        ["doctor", str(REPO / "tests/data/engine_logs/sglang-hit.log")],
        ["doctor", str(REPO / "tests/data/engine_logs/vllm-tp2-hit.log")],
    ]
    for cmd in cmds:
        proc = run_cli(*cmd, "--cache-dir", str(root), env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert proc.returncode == 0, (cmd, proc.stderr[-2000:])
        imported = imported_packages(proc.stderr)
        assert "click" in imported  # the probe works
        assert not imported & {"torch", "flashinfer", "numpy"}, (cmd, imported & {"torch", "flashinfer", "numpy"})


# --- environments -----------------------------------------------------------------------------

@pytest.mark.xdist_group("host-env")
def test_env_prints_flashinfers_own_fields(host_env):
    assert host_env.returncode == 0, host_env.stderr
    data = json.loads(host_env.stdout)
    assert set(data["fingerprint"]) == {"flashinfer_version", "cuda_version", "cublas_version", "cudnn_version",
                                        "cudnn_frontend_version", "cutlass_dsl_version", "gpu"}
    from importlib.metadata import version

    assert data["fingerprint"]["flashinfer_version"] == version("flashinfer-python")
    human = run_cli("env")
    assert "flashinfer_version" in human.stdout
    assert human.returncode == (1 if data["unknown"] else 0)


@pytest.mark.xdist_group("host-env")
def test_env_where_the_gpu_or_cuda_cannot_be_read_is_no_fingerprint(tmp_path, host_env):
    """A gate must never pass on an unknown: `env --json > env.json` on a host without a GPU exits
    1 and prints no JSON (the redirect leaves a file --env-from refuses); --allow-unknown writes
    it, its unknown fields listed."""
    assert host_env.returncode == 0, host_env.stderr
    marked = json.loads(host_env.stdout)
    if not marked["unknown"]:
        pytest.skip("this host reads every field")
    assert marked["format"] == "fi-autotune.env/1" and "gpu" in marked["unknown"]
    proc = run_cli("env", "--json")
    assert proc.returncode == 1 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert "cannot read" in proc.stderr and "gpu" in proc.stderr and "--allow-unknown" in proc.stderr
    saved = tmp_path / "env.json"
    saved.write_text(proc.stdout)
    refused = run_cli("check", "--strict", "--env-from", str(saved), "--model", "Qwen/Qwen3-30B-A3B", "--arch", "sm90")
    assert refused.returncode == 2 and "not JSON" in refused.stderr


@pytest.mark.xdist_group("host-env")
def test_no_gpu_host_never_calls_a_cache_stale(root, tmp_path, host_env):
    """The CI host has no GPU: its fingerprint reads gpu 'unknown'. It is no serving environment."""
    assert host_env.returncode == 0, host_env.stderr
    if json.loads(host_env.stdout)["fingerprint"]["gpu"] not in ("unknown", None):
        assert cuda_device_possible()
        pytest.skip("this host has a GPU")
    write_fake_entry(root)
    # Where CUDA can reach no device (FlashInfer's own fingerprint above says "unknown" there), the
    # verdict needs neither torch nor flashinfer: the import-time lines show whether they came in.
    no_device = not cuda_device_possible()
    env = {"PYTHONPROFILEIMPORTTIME": "1"}
    proc = run_cli("ls", "--check-env", "--cache-dir", str(root), env=env)
    assert proc.returncode == 0 and "complete" in proc.stdout and "stale" not in proc.stdout.split("\n")[2]
    assert "this host has no GPU" in proc.stderr and "--env-from" in proc.stderr
    imported = imported_packages(proc.stderr)
    assert "click" in imported and imported.isdisjoint({"torch", "flashinfer"}) == no_device, imported
    proc = run_cli("prune", "--status", "stale", "-y", "--cache-dir", str(root), env=env)
    errors = error_lines(proc.stderr)
    assert proc.returncode == 2 and "this host has no GPU" in errors[0] and len(errors) == 1
    imported = imported_packages(proc.stderr)
    assert "click" in imported and imported.isdisjoint({"torch", "flashinfer"}) == no_device, imported
    assert ids(root) == [GLM_ID]


def test_env_from_judges_staleness_anywhere(root, tmp_path):
    write_fake_entry(root)  # tuned on an H200
    h200, h100 = tmp_path / "h200.json", tmp_path / "h100.json"
    h200.write_text(json.dumps({"format": 1, "fingerprint": DEFAULT_METADATA}))
    h100.write_text(json.dumps({"fingerprint": {**DEFAULT_METADATA, "gpu": "NVIDIA H100 80GB HBM3"}}))
    assert run_json("ls", "--env-from", str(h200), "--cache-dir", str(root))["entries"][0]["status"] == "complete"
    stale = run_json("ls", "--env-from", str(h100), "--cache-dir", str(root))["entries"][0]
    assert stale["status"] == "stale" and "H100" in stale["problems"][0]
    shown = run_cli("show", GLM_ID, "--env-from", str(h100), "--cache-dir", str(root))
    assert "Status    stale" in shown.stdout
    out = run_json("prune", "--status", "stale", "--env-from", str(h100), "-y", "--cache-dir", str(root))
    assert out["result"]["deleted"] == [GLM_ID]
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpu": "x"}')
    proc = run_cli("ls", "--env-from", str(bad), "--cache-dir", str(root))
    assert proc.returncode == 2 and "not a fingerprint" in proc.stderr


def test_gpu_commands_without_a_gpu_are_usage_errors(root):
    """warm and verify on a machine with no GPU (on a GPU host, CUDA_VISIBLE_DEVICES="" makes one):
    one line, exit 2, nothing written."""
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""}
    proc = run_cli("warm", "--model", "nvidia/Llama-3.1-70B-Instruct-FP8", "--tp", "4", "--cache-dir", str(root),
                   env=no_gpu)
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr and "fi-autotune plan" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not any(root.rglob("*"))
    proc = run_cli("verify", "--cache-dir", str(root), env=no_gpu)
    assert proc.returncode == 2 and "entry ID" in proc.stderr
    write_fake_entry(root, with_manifest=False)
    proc = run_cli("verify", GLM_ID, "--cache-dir", str(root), env=no_gpu)
    assert proc.returncode == 2 and "not written by fi-autotune warm" in proc.stderr
    # with the server's flags the entry is found by its key even without a manifest; the GPU is next
    proc = run_cli("verify", "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--dp", "8", "--arch", "sm100",
                   "--quantization", "fp8", "--cache-dir", str(root), env=no_gpu)
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr, proc.stderr


def test_plan_for_a_model_sglang_would_not_tune_names_no_key_dir(root):
    proc = run_cli("plan", "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--arch", "sm90", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert "Key dir     none: the server would not autotune" in proc.stdout and "Rank files" not in proc.stdout
    assert "(dp-attention)" not in proc.stdout  # dp=1: the dp mode means nothing


def test_flashinfer_not_importable_is_one_line_exit_2(root):
    """A Python without flashinfer (blocked the way Python itself blocks an import): env, and
    --check-env where a GPU could be, say so in one line, exit 2; plan and the tree commands do not
    need it."""
    write_fake_entry(root)
    code = ("import sys; sys.modules['flashinfer'] = None\n"
            "from fi_autotune_cli.main import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    # where a GPU could be (a device node; a stand-in here, where none is), --check-env needs FlashInfer
    maybe_gpu = code.replace("from fi_autotune_cli", "import autotune_cache.autotuner.fingerprint as f; "
                             "f.cuda_device_possible = lambda: True\nfrom fi_autotune_cli")
    for prog, args in ((code, ["env"]), (maybe_gpu, ["ls", "--check-env"]), (code, ["ls", "--check-env"])):
        proc = subprocess.run([sys.executable, "-c", prog, *args, *(["--cache-dir", str(root)] if args[0] != "env" else [])],
                              capture_output=True, text=True, cwd=REPO)
        if prog is code and args[0] == "ls" and not cuda_device_possible():  # no GPU can be here: FlashInfer or not
            assert proc.returncode == 0 and GLM_ID in proc.stdout and "this host has no GPU" in proc.stderr, proc.stderr
            continue
        assert proc.returncode == 2, (args, proc.stderr)
        assert "flashinfer is not importable" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    proc = subprocess.run([sys.executable, "-c", code, "ls", "--cache-dir", str(root)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and GLM_ID in proc.stdout
    proc = subprocess.run([sys.executable, "-c", code, "plan", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2",
                           "--moe-runner-backend", "flashinfer_cutlass", "--arch", "sm90", "--cache-dir", str(root)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and "Profiles    42" in proc.stdout, proc.stderr


def test_export_names_an_empty_entry_as_empty_not_as_vanished(root, tmp_path):
    a = write_fake_entry(root)
    empty = entry_path(root, a).parent / "0123456789abcdef"
    empty.mkdir()
    proc = run_cli("export", "--include-incomplete", "-o", str(tmp_path / "x.tgz"), "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert f"skipped {a.parts[0]}/{a.parts[1]}/0123456789abcdef: it holds no rank file" in proc.stderr
    assert "deleted or replaced" not in proc.stderr
