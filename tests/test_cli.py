"""The commands as a user runs them: real processes, real files, exit codes 0/1/2."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune_cache import layout
from autotune_cache.testing import default_fields, write_fake_entry

from .conftest import REPO, run_cli, run_json

KEY_ARGS = [
    "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--pp", "1", "--dp", "8", "--ep", "1", "--dtype", "bfloat16",
    "--quantization", "fp8", "--moe-runner-backend", "flashinfer_trtllm", "--config-class", "GlmMoeDsaConfig",
    "--arch", "sm100", "--flashinfer-version", "0.7.2.post1",
]


def test_key_command_prints_key_string_and_rank_paths(root):
    out = run_json("key", *KEY_ARGS, "--cache-dir", str(root))
    assert out["key"] == "d99390dfa961185d"
    assert out["key_string"].endswith("|GlmMoeDsaConfig|candidate_selection=v2_default|skip_ops=")
    assert out["rank_files"][7] == str(root / "flashinfer/autotune/0.7.2.post1/sm100/d99390dfa961185d/rank_tp7_pp0_dp7.json")
    q = run_cli("key", *KEY_ARGS, "-q")
    assert q.stdout.strip() == "d99390dfa961185d"


def test_key_quantization_none_and_replicas(root):
    out = run_json("key", "--model", "m", "--tp", "2", "--dp", "2", "--no-dp-attention", "--quantization", "None",
                   "--config-class", "LlamaConfig", "--arch", "sm90", "--flashinfer-version", "0.7.2.post1",
                   "--cache-dir", str(root))
    assert out["key_string"] == "m|torch.bfloat16|None|auto|2|1|1|1|LlamaConfig|candidate_selection=v2_default|skip_ops="
    assert [Path(p).name for p in out["rank_files"]] == [
        "rank_tp0_pp0_dp0.json", "rank_tp0_pp0_dp1.json", "rank_tp1_pp0_dp0.json", "rank_tp1_pp0_dp1.json"]


@pytest.mark.parametrize("args,needle", [
    (["key", *KEY_ARGS, "--schema", "nope"], "unknown key schema"),
    (["key", *[a if a != "8" else "8" for a in KEY_ARGS], "--dp", "3"], "divisible"),
    (["key", *KEY_ARGS, "--tp", "-1"], "must be >= 1"),
    (["key", *KEY_ARGS, "--arch", "hopper"], "invalid --arch"),
    (["key", *KEY_ARGS, "--dtype", "int7"], "unknown dtype"),
    (["prune", "--keep-latest", "-1", "-y"], "--keep-latest"),
    (["prune", "--older-than", "soon", "-y"], "invalid duration"),
    (["prune", "-y"], "nothing selected"),
    (["ls", "--status", "weird"], "unknown status"),
    (["ls", "--bogus"], "No such option"),
])
def test_usage_errors_exit_2_with_one_line(root, args, needle):
    proc = run_cli(*args, "--cache-dir", str(root))
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_cache_dir_that_is_a_file_is_a_usage_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    for cmd in (["ls"], ["prune", "--status", "corrupt", "-y"], ["key", *KEY_ARGS]):
        proc = run_cli(*cmd, "--cache-dir", str(f))
        assert proc.returncode == 2 and "not a directory" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_ls_table_filters_and_quiet(root):
    a = write_fake_entry(root)
    b = write_fake_entry(root, fields=default_fields("Qwen/Qwen3-30B-A3B", tp=2, dp=1), arch="sm90")
    c = write_fake_entry(root, flashinfer_version="0.7.1")
    proc = run_cli("ls", "--cache-dir", str(root))
    assert proc.returncode == 0
    header = proc.stdout.splitlines()[0].split()
    assert header == ["KEY", "MODEL", "FLASHINFER", "ARCH", "PARALLEL", "RANKS", "CONFIGS", "SIZE", "MODIFIED", "STATUS"]
    assert "3 entries, 18 rank files" in proc.stdout and "(3 complete)" in proc.stdout
    assert run_cli("ls", "-q", "--arch", "sm90", "--cache-dir", str(root)).stdout.split() == [b.key]
    assert run_cli("ls", "-q", "--model", "GLM", "--flashinfer-version", "0.7.1", "--cache-dir", str(root)).stdout.split() == [c.key]
    data = run_json("ls", "--sort", "size", "--cache-dir", str(root))
    assert [e["size_on_disk"] for e in data["entries"]] == sorted((e["size_on_disk"] for e in data["entries"]), reverse=True)
    assert data["totals"]["entries"] == 3 and {e["id"] for e in data["entries"]} == {str(a), str(b), str(c)}
    old = time.time() - 40 * 86400
    for p in layout.key_dir(root, b.flashinfer_version, b.arch, b.key).iterdir():
        os.utime(p, (old, old))
    assert run_cli("ls", "-q", "--older-than", "30d", "--cache-dir", str(root)).stdout.split() == [b.key]


def test_ls_on_missing_root_is_empty_and_ok(tmp_path):
    proc = run_cli("ls", "--cache-dir", str(tmp_path / "none"))
    assert proc.returncode == 0 and "0 entries" in proc.stdout


def test_ls_honours_sglang_cache_dir(root):
    write_fake_entry(root)
    proc = run_cli("ls", "-q", env={"SGLANG_CACHE_DIR": str(root)})
    assert proc.stdout.split() == ["d99390dfa961185d"]


def test_show_by_key_id_and_path(root):
    eid = write_fake_entry(root)
    kdir = layout.key_dir(root, eid.flashinfer_version, eid.arch, eid.key)
    for ref in (eid.key, str(eid), str(kdir)):
        proc = run_cli("show", ref, "--cache-dir", str(root))
        assert proc.returncode == 0, proc.stderr
        assert "zai-org/GLM-5.1-FP8" in proc.stdout and "trtllm::fused_moe::gemm1" in proc.stdout
    (doc,) = run_json("show", eid.key, "--cache-dir", str(root))
    ops = {o["custom_op"]: o for o in doc["ops"]}
    assert ops["trtllm::fused_moe::gemm1"]["buckets"] == 21
    assert doc["metadata"]["gpu"] == "NVIDIA H200"
    missing = run_cli("show", "0000000000000000", "--cache-dir", str(root))
    assert missing.returncode == 1 and "no cache entry" in missing.stderr


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
    assert run_cli("ls", "-q", "--cache-dir", str(root)).stdout.split() == [keep.key]


def test_prune_refuses_to_prompt_without_tty(root):
    write_fake_entry(root)
    proc = run_cli("prune", "--status", "complete", "--cache-dir", str(root), input="y\n")
    assert proc.returncode == 2 and "-y" in proc.stderr
    assert run_cli("ls", "-q", "--cache-dir", str(root)).stdout.split() == ["d99390dfa961185d"]


def test_prune_keep_latest_per_model(root):
    ids = []
    for i, tp in enumerate((2, 4, 8)):
        eid = write_fake_entry(root, fields=default_fields("A", tp=tp, dp=1))
        t = time.time() - 1000 + i * 100
        for p in layout.key_dir(root, eid.flashinfer_version, eid.arch, eid.key).iterdir():
            os.utime(p, (t, t))
        ids.append(eid)
    other = write_fake_entry(root, fields=default_fields("B", tp=2, dp=1))
    out = run_json("prune", "--keep-latest", "1", "-y", "--cache-dir", str(root))
    assert sorted(out["result"]["deleted"]) == sorted([str(ids[0]), str(ids[1])])
    assert sorted(run_cli("ls", "-q", "--cache-dir", str(root)).stdout.split()) == sorted([ids[2].key, other.key])


def test_prune_other_versions_keeps_installed(root):
    from importlib.metadata import version

    here = version("flashinfer-python")
    write_fake_entry(root, flashinfer_version=here)
    old = write_fake_entry(root, flashinfer_version="0.6.0")
    out = run_json("prune", "--other-versions", "-y", "--cache-dir", str(root))
    assert out["result"]["deleted"] == [str(old)]


LOCK_HOLDER = """
import sys, time
from pathlib import Path
from autotune_cache.atomic import key_lock
with key_lock(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_prune_skips_entry_locked_by_a_running_writer(root):
    eid = write_fake_entry(root, flashinfer_version="0.7.1")
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(root), eid.flashinfer_version, eid.arch, eid.key],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "locked"
        out = run_json("prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", str(root))
        assert out["result"]["deleted"] == []
        assert out["result"]["skipped"] == [{"entry": str(eid), "reason": "locked by a running writer"}]
        assert run_cli("ls", "-q", "--cache-dir", str(root)).stdout.split() == [eid.key]
    finally:
        holder.kill()
        holder.wait()


def test_export_import_roundtrip(root, tmp_path):
    a = write_fake_entry(root)
    b = write_fake_entry(root, fields=default_fields("m2", tp=2, dp=2), arch="sm90", with_manifest=False)
    archive = tmp_path / "caches.tar.gz"
    proc = run_cli("export", "-o", str(archive), "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    dest = tmp_path / "image-cache"
    out = run_json("import", str(archive), "--cache-dir", str(dest))
    assert sorted(out["imported"]) == sorted([str(a), str(b)])
    for eid in (a, b):
        src = layout.key_dir(root, eid.flashinfer_version, eid.arch, eid.key)
        dst = layout.key_dir(dest, eid.flashinfer_version, eid.arch, eid.key)
        for p in src.glob("rank_*.json"):
            assert (dst / p.name).read_bytes() == p.read_bytes()
    listed = run_json("ls", "--cache-dir", str(dest))
    assert {e["status"] for e in listed["entries"]} == {"complete"}
    # again: nothing changes
    again = run_json("import", str(archive), "--cache-dir", str(dest))
    assert again["imported"] == [] and sorted(again["unchanged"]) == sorted([str(a), str(b)])


def test_import_refuses_different_complete_entry_without_force(root, tmp_path):
    write_fake_entry(root, seed=1)
    archive = tmp_path / "a.tar.gz"
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(root)).returncode == 0
    dest = tmp_path / "dest"
    eid = write_fake_entry(dest, seed=2)
    dst = layout.key_dir(dest, eid.flashinfer_version, eid.arch, eid.key)
    before = {p.name: p.read_bytes() for p in dst.iterdir()}
    proc = run_cli("import", str(archive), "--cache-dir", str(dest))
    assert proc.returncode == 1 and "--force" in proc.stderr
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before
    forced = run_cli("import", str(archive), "--force", "--cache-dir", str(dest))
    assert forced.returncode == 0, forced.stderr
    src = layout.key_dir(root, eid.flashinfer_version, eid.arch, eid.key)
    assert (dst / "rank_tp0_pp0_dp0.json").read_bytes() == (src / "rank_tp0_pp0_dp0.json").read_bytes()


def test_tree_commands_do_not_import_torch_or_flashinfer(root, tmp_path):
    write_fake_entry(root)
    archive = tmp_path / "x.tar.gz"
    cmds = [
        ["ls"], ["ls", "--json"], ["show", "d99390dfa961185d"], ["prune", "--status", "corrupt", "--dry-run"],
        ["key", *KEY_ARGS], ["export", "-o", str(archive)], ["import", str(archive)],
    ]
    for cmd in cmds:
        proc = run_cli(*cmd, "--cache-dir", str(root), env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert proc.returncode == 0, (cmd, proc.stderr[-2000:])
        imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if line.startswith("import time:")}
        assert "click" in imported  # the probe works
        assert not imported & {"torch", "flashinfer", "numpy"}, (cmd, imported & {"torch", "flashinfer", "numpy"})


def test_gpu_commands_without_a_gpu_are_usage_errors(root):
    """warm and verify on a machine with no GPU: one line, exit 2, nothing written."""
    proc = run_cli("warm", "--model", "nvidia/Llama-3.1-70B-Instruct-FP8", "--tp", "4", "--cache-dir", str(root))
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr and "fi-autotune plan" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not any(root.rglob("*"))
    proc = run_cli("verify", "--cache-dir", str(root))
    assert proc.returncode == 2 and "KEY" in proc.stderr
    write_fake_entry(root, with_manifest=False)
    proc = run_cli("verify", "d99390dfa961185d", "--cache-dir", str(root))
    assert proc.returncode == 2 and "not written by fi-autotune warm" in proc.stderr
    # with the server's flags the entry is found by its key even without a manifest; the GPU is next
    proc = run_cli("verify", "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--dp", "8", "--arch", "sm100",
                   "--quantization", "fp8", "--cache-dir", str(root))
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr, proc.stderr
