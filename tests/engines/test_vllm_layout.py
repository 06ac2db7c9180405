"""vLLM's per-rank tree (layouts/vllm.py): paths checked against vLLM's own functions where an
interpreter with vLLM is at hand, the tree commands on entries written the way vLLM writes them."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from autotune_cache.registry import get_layout
from autotune_cache.engines.vllm.layout import VllmRankName, arch_dir
from devtools.synthetic import write_vllm_entry

from ..conftest import REPO, run_cli, run_json

H1 = "a" * 64
H2 = "0123456789abcdef" * 4
VLLM_PYTHON = os.environ.get("FI_AUTOTUNE_VLLM_PYTHON")


def vllm_env(root: Path) -> dict:
    return {"VLLM_CACHE_ROOT": str(root)}


# --- paths, checked against vLLM -------------------------------------------------------------

def test_golden_names_of_vllm_0_33():
    """What vLLM 0.33's flashinfer_autotune_filename / flashinfer_autotune_root printed (see the
    next test, which asks vLLM itself when it is installed)."""
    layout = get_layout("vllm")
    assert VllmRankName(1, 5).filename == "autotune_configs_dp1_rank5.json"
    assert [arch_dir(a) for a in ("sm90", "sm100", "sm103", "sm120", "sm80")] == ["90a", "100a", "103a", "120f", "80"]
    root = Path("/r")
    eid = layout.make_id(("0.7.2.post1", "90a", H1))
    assert layout.entry_dir(root, eid) == Path(f"/r/flashinfer_autotune_cache/0.7.2.post1/90a/{H1}")
    assert str(eid) == f"vllm:0.7.2.post1/90a/{H1}"
    assert layout.parse_id(f"0.7.2.post1/90a_100a/{H1}") is not None  # a mixed-arch host
    assert layout.parse_id(f"0.7.2.post1/sm90/{H1}") is None  # SGLang's arch form is not vLLM's
    # DP rank d of world size W holds world ranks d*W .. d*W+W-1.
    from autotune_cache.plan.topology import Topology

    assert layout.expected_files(Topology(tp=2, pp=1, dp=2, dp_attention=False)) == [
        "autotune_configs_dp0_rank0.json", "autotune_configs_dp0_rank1.json",
        "autotune_configs_dp1_rank2.json", "autotune_configs_dp1_rank3.json"]


@pytest.mark.skipif(not VLLM_PYTHON, reason="optional live check against vLLM itself: set FI_AUTOTUNE_VLLM_PYTHON to a Python with vLLM 0.33 (CI compares with its recorded goldens)")
@pytest.mark.parametrize("archs,expect_dir", [("9.0", "90a"), ("10.0", "100a"), ("9.0 10.0", "90a_100a")])
def test_paths_are_vllms_own(tmp_path, archs, expect_dir):
    layout = get_layout("vllm")
    pairs = [(0, 0), (0, 1), (1, 2), (3, 31)]
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vroot"), "FLASHINFER_CUDA_ARCH_LIST": archs,
           "CUDA_VISIBLE_DEVICES": ""}
    env.pop("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", None)
    out = subprocess.run([VLLM_PYTHON, str(REPO / "tests" / "oracle" / "vllm_paths.py"), json.dumps(pairs)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    assert theirs["vllm"].startswith("0.33")
    version = Path(theirs["root"]).parent.name
    assert Path(theirs["root"]) == layout.base(tmp_path / "vroot") / version / expect_dir
    assert layout.parse_id(f"{version}/{Path(theirs['root']).name}/{H1}") is not None
    assert theirs["files"] == [VllmRankName(d, r).filename for d, r in pairs]
    assert theirs["v2_root"] is None
    # With the override, the hash dirs sit directly in it (our vllm-dir layout), and so does v2.
    env["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] = str(tmp_path / "shared")
    out = subprocess.run([VLLM_PYTHON, str(REPO / "tests" / "oracle" / "vllm_paths.py"), "[]"], env=env,
                         capture_output=True, text=True, timeout=300)
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    assert theirs["root"] == str(tmp_path / "shared") == theirs["v2_root"]
    assert get_layout("vllm-dir").base(tmp_path / "shared") == tmp_path / "shared"


# --- the tree commands on vLLM-written entries -----------------------------------------------

def test_ls_lists_a_vllm_tree_with_its_ranks(tmp_path):
    root = tmp_path / "vllm"
    write_vllm_entry(root, H1, world=2, dp=2)
    write_vllm_entry(root, H2, world=4, dp=1, arch_dir="100a")
    data = run_json("ls", "--layout", "vllm", env=vllm_env(root))
    by_id = {e["id"]: e for e in data["entries"]}
    a, b = by_id[f"vllm:0.7.2.post1/90a/{H1}"], by_id[f"vllm:0.7.2.post1/100a/{H2}"]
    # vLLM writes no manifest: the world size is read off the files present, a lower bound
    assert (a["status"], a["ranks_present"], a["ranks_expected"]) == ("unverified", 4, None)
    assert (b["status"], b["ranks_present"], b["ranks_expected"]) == ("unverified", 4, None)
    table = run_cli("ls", "--layout", "vllm", env=vllm_env(root)).stdout
    assert "ranks2+ dp2" in table and "ranks4+" in table and "4/?" in table
    # --arch takes sm<XY>, as for SGLang's tree: 90a is FlashInfer's name for sm90.
    assert run_cli("ls", "--layout", "vllm", "--arch", "sm90", "-q", env=vllm_env(root)).stdout.split() == [a["id"]]


def test_ls_without_layout_lists_vllm_beside_sglang(tmp_path, root):
    from devtools.synthetic import write_fake_entry

    write_fake_entry(root)
    vroot = tmp_path / "vllm"
    write_vllm_entry(vroot, H1)
    ids = run_cli("ls", "-q", env={"SGLANG_CACHE_DIR": str(root), **vllm_env(vroot)}).stdout.split()
    assert f"vllm:0.7.2.post1/90a/{H1}" in ids and len(ids) == 2


def test_missing_rank_is_incomplete_and_a_bad_one_corrupt(tmp_path):
    root = tmp_path / "vllm"
    path = write_vllm_entry(root, H1, world=2, dp=2)
    (path / "autotune_configs_dp0_rank1.json").unlink()
    e = run_json("ls", "--layout", "vllm", env=vllm_env(root))["entries"][0]
    assert (e["status"], e["ranks_present"], e["ranks_expected"]) == ("incomplete", 3, 4)
    (path / "autotune_configs_dp0_rank0.json").write_text("{not json")
    assert run_json("ls", "--layout", "vllm", env=vllm_env(root))["entries"][0]["status"] == "corrupt"


def test_vllm_temp_files_are_temp_not_data(tmp_path):
    root = tmp_path / "vllm"
    path = write_vllm_entry(root, H1, world=1)
    (path / ".autotune_configs_dp0_rank0.json.k3j2.tmp").write_text("{")
    from autotune_cache.tree.scanner.scan import scan_entry

    layout = get_layout("vllm")
    e = scan_entry(layout, path, layout.make_id(("0.7.2.post1", "90a", H1)))
    assert e.status.value == "unverified" and [f.path.name for f in e.temp_files] == [
        ".autotune_configs_dp0_rank0.json.k3j2.tmp"]
    shown = run_cli("show", f"vllm:0.7.2.post1/90a/{H1}", env=vllm_env(root)).stdout
    assert "1 rank per DP rank (tp x pp x pcp), dp=1" in shown


def test_rm_and_prune_delete_vllm_entries_whole(tmp_path):
    root = tmp_path / "vllm"
    keep = write_vllm_entry(root, H1, world=2)
    gone = write_vllm_entry(root, H2, world=2, dp=2)
    (gone / "autotune_configs_dp0_rank1.json").unlink()
    proc = run_cli("prune", "--layout", "vllm", "--status", "incomplete", "-y", env=vllm_env(root))
    assert proc.returncode == 0, proc.stderr
    assert keep.is_dir() and not gone.exists()
    # a vLLM entry's path given where the SGLang tree is searched: the error names the flags
    proc = run_cli("rm", str(keep), "-y", "--cache-dir", str(tmp_path))
    assert proc.returncode == 1 and keep.is_dir()
    assert f"it is an entry of the vllm tree at {root}: --layout vllm --cache-dir {root}" in proc.stderr
    proc = run_cli("rm", str(keep), "-y", "--layout", "vllm", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert not keep.exists()


def test_export_import_round_trip(tmp_path):
    root = tmp_path / "vllm"
    path = write_vllm_entry(root, H1, world=2, dp=2)
    archive = tmp_path / "v.tgz"
    proc = run_cli("export", "--layout", "vllm", "-o", str(archive), env=vllm_env(root))
    assert proc.returncode == 1 and "unverified" in proc.stderr, proc.stderr  # no manifest counts its files
    proc = run_cli("export", "--layout", "vllm", "--include-incomplete", "-o", str(archive), env=vllm_env(root))
    assert proc.returncode == 0 and "unverified" in proc.stderr, proc.stderr
    with tarfile.open(archive) as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
    assert f"flashinfer_autotune_cache/0.7.2.post1/90a/{H1}/autotune_configs_dp1_rank3.json" in names
    dest = tmp_path / "image-vllm"
    proc = run_cli("import", str(archive), "--layout", "vllm", "--cache-dir", str(dest))
    assert proc.returncode == 0, proc.stderr
    copied = dest / "flashinfer_autotune_cache" / "0.7.2.post1" / "90a" / H1
    assert sorted(p.name for p in copied.iterdir()) == sorted(p.name for p in path.iterdir())
    assert all((copied / p.name).read_bytes() == p.read_bytes() for p in path.iterdir())


def test_an_archive_of_the_other_layout_is_refused_with_the_right_flag_and_leaves_no_tree(tmp_path):
    root = tmp_path / "vllm"
    write_vllm_entry(root, H1, world=2)
    archive = tmp_path / "v.tgz"
    assert run_cli("export", "--layout", "vllm", "--include-incomplete", "-o", str(archive),
                   env=vllm_env(root)).returncode == 0
    dest = tmp_path / "new" / "sglang-root"  # neither it nor its parent exists yet
    proc = run_cli("import", str(archive), "--cache-dir", str(dest))  # the default layout: sglang
    assert proc.returncode == 1 and "not in the sglang cache layout" in proc.stderr
    assert "--layout vllm" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "new").exists()  # a refused import leaves no empty tree behind
    (tmp_path / "kept").mkdir()  # a root that existed stays, and so does what was in it
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    assert run_cli("import", str(archive), "--cache-dir", str(tmp_path / "kept")).returncode == 1
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["notes.txt"]
    (tmp_path / "empty").mkdir()  # an empty dir that existed stays, however the path reaches it
    assert run_cli("import", str(archive), "--cache-dir", str(tmp_path / "gone" / ".." / "empty")).returncode == 1
    assert (tmp_path / "empty").is_dir()
    good = run_cli("import", str(archive), "--layout", "vllm", "--cache-dir", str(dest))
    assert good.returncode == 0 and (dest / "flashinfer_autotune_cache" / "0.7.2.post1" / "90a" / H1).is_dir()


def test_vllm_dir_layout_follows_the_override_and_leaves_v2_alone(tmp_path):
    shared = tmp_path / "shared"
    write_vllm_entry(shared, H1, world=2, override_dir=True)
    (shared / "v2" / "0123456789abcdef" / "entries").mkdir(parents=True)
    env = {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(shared)}
    data = run_json("ls", "--layout", "vllm-dir", env=env)
    assert [e["id"] for e in data["entries"]] == [f"vllm-dir:{H1}"]
    assert data["entries"][0]["status"] == "unverified"
    assert not data.get("findings"), data.get("findings")
    proc = run_cli("ls", "--layout", "vllm-dir")
    assert proc.returncode == 2 and "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR, which is not set" in proc.stderr
    assert "Traceback" not in proc.stderr
    # A bare hash names it wherever it is unique.
    shown = run_json("show", H1, "--layout", "vllm-dir", env=env)["entries"][0]
    assert shown["id"] == f"vllm-dir:{H1}"


def test_push_and_pull_by_id_through_a_store(tmp_path):
    root = tmp_path / "vllm"
    path = write_vllm_entry(root, H1, world=2)
    store = f"file://{tmp_path / 'store'}"
    proc = run_cli("push", store, "--layout", "vllm", env=vllm_env(root))
    assert proc.returncode == 1 and "unverified" in proc.stderr, proc.stderr  # never published as complete
    proc = run_cli("push", store, "--layout", "vllm", "--include-incomplete", env=vllm_env(root))
    assert proc.returncode == 0, proc.stderr
    listed = run_json("ls", store)
    assert [e["id"] for e in listed["entries"]] == [f"vllm:0.7.2.post1/90a/{H1}"]
    pod = tmp_path / "pod-vllm"
    proc = run_cli("pull", store, H1, "--layout", "vllm", "--any-env", env=vllm_env(pod))
    assert proc.returncode == 0, proc.stderr
    got = pod / "flashinfer_autotune_cache" / "0.7.2.post1" / "90a" / H1
    assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in path.iterdir())
    bad = run_cli("pull", store, "--layout", "vllm", "--model", "Qwen/Qwen3-30B-A3B", env=vllm_env(pod))
    assert bad.returncode == 2 and "pull by id" in bad.stderr


def test_other_versions_never_takes_an_entry_whose_version_it_cannot_read(tmp_path):
    shared = tmp_path / "shared"
    path = write_vllm_entry(shared, H1, world=1, override_dir=True)
    env = {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(shared)}
    e = run_json("ls", "--layout", "vllm-dir", env=env)["entries"][0]
    assert e["flashinfer_version"] == "0.7.2.post1"  # from the files' _metadata
    assert run_cli("ls", "--layout", "vllm-dir", "--flashinfer-version", "0.7.2.post1", "-q", env=env).stdout.split() \
        == [f"vllm-dir:{H1}"]
    # Files without a readable version: never "another version" than the installed one.
    from autotune_cache.autotuner.rankfile import cache_file_bytes
    from devtools.synthetic import DEFAULT_METADATA, fake_configs

    meta = {k: v for k, v in DEFAULT_METADATA.items() if k != "flashinfer_version"}
    (path / "autotune_configs_dp0_rank0.json").write_bytes(cache_file_bytes(meta, fake_configs()))
    proc = run_cli("prune", "--layout", "vllm-dir", "--other-versions", "-y", env=env)
    assert proc.returncode == 0, proc.stderr
    assert path.is_dir() and (path / "autotune_configs_dp0_rank0.json").is_file()


def test_metadata_that_differs_across_ranks_is_diverged(tmp_path):
    root = tmp_path / "vllm"
    path = write_vllm_entry(root, H1, world=2)
    from autotune_cache.autotuner.rankfile import cache_file_bytes
    from devtools.synthetic import DEFAULT_METADATA, fake_configs

    (path / "autotune_configs_dp0_rank1.json").write_bytes(
        cache_file_bytes({**DEFAULT_METADATA, "cudnn_version": "91600"}, fake_configs()))
    e = run_json("ls", "--layout", "vllm", env=vllm_env(root))["entries"][0]
    assert e["status"] == "diverged"
    # Counts alone: a note, since pp > 1 would make them legitimately differ.
    (path / "autotune_configs_dp0_rank1.json").write_bytes(
        cache_file_bytes(DEFAULT_METADATA, dict(list(fake_configs().items())[:-1])))
    shown = run_json("show", f"vllm:0.7.2.post1/90a/{H1}", env=vllm_env(root))["entries"][0]
    assert shown["status"] == "unverified" and any("vLLM tunes again unless pp > 1" in n for n in shown["notes"])


def test_rank_names_vllm_cannot_write_are_corrupt(tmp_path):
    root = tmp_path / "vllm"
    path = write_vllm_entry(root, H1, world=2)  # dp0_rank0, dp0_rank1
    (path / "autotune_configs_dp1_rank1.json").write_bytes((path / "autotune_configs_dp0_rank0.json").read_bytes())
    assert run_json("ls", "--layout", "vllm", env=vllm_env(root))["entries"][0]["status"] == "corrupt"


def test_diff_reads_vllm_dirs_trees_and_stores(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    pa = write_vllm_entry(a, H1, world=2, seed=1)
    pb = write_vllm_entry(b, H1, world=2, seed=2)
    for x, y in ((pa, pb), (a, b)):
        proc = run_cli("diff", "--exit-code", str(x), str(y))
        assert proc.returncode == 1, proc.stdout + proc.stderr
    assert run_cli("diff", "--exit-code", str(pa), str(pa)).returncode == 0
    sa, sb = f"file://{tmp_path / 'sa'}", f"file://{tmp_path / 'sb'}"
    for root, store in ((a, sa), (b, sb)):
        assert run_cli("push", store, "--layout", "vllm", "--include-incomplete", env=vllm_env(root)).returncode == 0
    proc = run_cli("diff", "--exit-code", sa, sb)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # An id with --cache-dir looks in that root as the id's own layout.
    proc = run_cli("diff", "--exit-code", "--cache-dir", str(a), f"vllm:0.7.2.post1/90a/{H1}", str(pb))
    assert proc.returncode == 1, proc.stdout + proc.stderr


def test_arch_filter_takes_flashinfers_suffixed_names_too(tmp_path):
    root = tmp_path / "vllm"
    write_vllm_entry(root, H1)
    assert run_cli("ls", "--layout", "vllm", "--arch", "sm90a", "-q", env=vllm_env(root)).stdout.split() == [
        f"vllm:0.7.2.post1/90a/{H1}"]


def test_rm_of_an_entry_it_must_leave_fails(tmp_path):
    root = tmp_path / "vllm"
    path = write_vllm_entry(root, H1, world=1)
    (path / "notes.txt").write_text("mine")
    proc = run_cli("rm", H1, "--layout", "vllm", "-y", env=vllm_env(root))
    assert proc.returncode == 1 and "notes.txt" in proc.stderr + proc.stdout
    assert (path / "autotune_configs_dp0_rank0.json").is_file() and (path / "notes.txt").is_file()


def test_two_layouts_in_one_root_keep_their_own_digest_index(tmp_path):
    """VLLM_CACHE_ROOT and SGLANG_CACHE_DIR may be one directory: each layout's scan keeps only
    the records it used, so a shared index file would lose the other layout's every time."""
    import os as _os

    from autotune_cache.tree.scanner.digestindex import DigestIndex, stats_digest
    from autotune_cache.tree.scanner.scan import scan_cache
    from devtools.synthetic import entry_path, write_fake_entry

    root = tmp_path / "shared-root"
    eid = write_fake_entry(root, with_manifest=False)
    write_vllm_entry(root, H1, world=2)
    scan_cache(root, get_layout("sglang"))
    scan_cache(root, get_layout("vllm"))
    sglang_files = sorted((p.name, _os.stat(p)) for p in entry_path(root, eid).iterdir() if p.name.startswith("rank_"))
    index = DigestIndex.for_root(root, "sglang")
    assert sglang_files and index.get_entry(stats_digest(sglang_files), len(sglang_files)) is not None
    assert len(DigestIndex.for_root(root, "vllm")) == 1  # its one entry, both files the same bytes
