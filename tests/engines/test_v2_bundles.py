"""FlashInfer's managed store moved between machines: ``export``/``import`` and
``push``/``pull`` of an environment directory (tree/layout_kinds/flashinfer_v2/bundle.py). The tree on the
other side is judged by FlashInfer's own ``ManagedAutotuneCache`` (run on CPU); an import merges
entry by entry (FlashInfer publishes into the same directory) and refuses, whole, what would
replace another tuning without --force, or what FlashInfer itself would not read."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from ..conftest import run_cli
from ..support.fake_gpus import gpu_env, run_gpu_cli
from devtools.synthetic import DEFAULT_METADATA

QWEN = ["--model", "Qwen/Qwen3-30B-A3B", "--moe-runner-backend", "flashinfer_cutlass", "--flashinfer-version", "0.7.2.post1"]
META = {**DEFAULT_METADATA, "gpu": "NVIDIA H200"}
V2 = ["--layout", "flashinfer-v2"]


@pytest.fixture
def store_root(tmp_path) -> Path:
    """A single-rank vLLM store, as warm writes it (stand-in GPUs), at tmp/vroot."""
    env = gpu_env(tmp_path, VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR=str(tmp_path / "vroot"))
    proc = run_gpu_cli("warm", *QWEN, "--tp", "1", "--layout", "vllm", env=env)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "vroot"


def env_dir(root: Path) -> Path:
    (d,) = [p for p in (root / "v2").iterdir() if not p.name.startswith(".")]
    return d


def tree(root: Path) -> dict[str, bytes]:
    d = env_dir(root)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(d.rglob("*.json"))}


def cli_ok(*args) -> str:
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_export_import_gives_the_same_store_flashinfer_reads(store_root, tmp_path):
    a, b = tmp_path / "a.tgz", tmp_path / "b.tgz"
    cli_ok("export", *V2, "--cache-dir", str(store_root), "-o", str(a))
    cli_ok("export", *V2, "--cache-dir", str(store_root), "-o", str(b))
    assert a.read_bytes() == b.read_bytes()  # reproducible
    names = tarfile.open(a).getnames()
    assert len(names) == 43 and all(n.startswith("v2/") for n in names)
    assert "imported" in cli_ok("import", *V2, "--cache-dir", str(tmp_path / "other"), str(a))
    assert tree(tmp_path / "other") == tree(store_root)
    from flashinfer.autotune_cache import ManagedAutotuneCache

    entries, total, skipped = ManagedAutotuneCache(META, tmp_path / "other").preload()
    assert (len(entries), total, skipped) == (42, 42, 0)
    assert "unchanged" in cli_ok("import", *V2, "--cache-dir", str(tmp_path / "other"), str(a))


def test_import_merges_and_never_replaces_another_tuning_without_force(store_root, tmp_path):
    bundle = tmp_path / "a.tgz"
    cli_ok("export", *V2, "--cache-dir", str(store_root), "-o", str(bundle))
    target = tmp_path / "other"
    cli_ok("import", *V2, "--cache-dir", str(target), str(bundle))
    d = env_dir(target)
    # FlashInfer published another key meanwhile: a merge leaves it
    extra = d / "entries" / ("f" * 24 + ".json")
    extra.write_text("{}")
    # and this host tuned one of the bundle's keys to another tactic
    victim = sorted((d / "entries").glob("*.json"))[0]
    local = json.loads(victim.read_text())
    local["tactic"] = [7]
    victim.write_text(json.dumps(local, indent=2, sort_keys=True))
    before = tree(target)
    proc = run_cli("import", *V2, "--cache-dir", str(target), str(bundle))
    assert proc.returncode == 1 and "already there with other content" in proc.stderr and "--force" in proc.stderr
    assert tree(target) == before
    cli_ok("import", *V2, "--cache-dir", str(target), str(bundle), "--force")
    assert json.loads(victim.read_text())["tactic"] != [7] and extra.exists()


def _rewrite(bundle: Path, out: Path, edit) -> None:
    with tarfile.open(bundle) as src:
        members = [(m, src.extractfile(m).read()) for m in src.getmembers()]
    with tarfile.open(out, "w:gz") as dst:
        for m, data in members:
            m2, data2 = edit(m.name, data)
            info = tarfile.TarInfo(m2)
            info.size = len(data2)
            dst.addfile(info, io.BytesIO(data2))


@pytest.mark.parametrize("edit,message", [
    (lambda n, d: (n, d.replace(b'"key": "(', b'"key": "(x', 1)) if "/entries/" in n else (n, d),
     "its embedded key does not hash to its name"),
    (lambda n, d: (n, d.replace(b'"gpu": "NVIDIA H200"', b'"gpu": "NVIDIA H100"')) if n.endswith("manifest.json") else (n, d),
     "does not hash to its directory"),
    (lambda n, d: (n, b"[1, 2]") if "/entries/" in n else (n, d), "not a FlashInfer v2 entry"),
    (lambda n, d: (n.replace("/entries/", "/entries/../../"), d), "path traversal"),
])
def test_a_bundle_flashinfer_would_not_read_is_refused_whole(store_root, tmp_path, edit, message):
    bundle, bad = tmp_path / "a.tgz", tmp_path / "bad.tgz"
    cli_ok("export", *V2, "--cache-dir", str(store_root), "-o", str(bundle))
    _rewrite(bundle, bad, edit)
    proc = run_cli("import", *V2, "--cache-dir", str(tmp_path / "other"), str(bad))
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not list((tmp_path / "other").rglob("*.json"))


def test_push_and_pull_through_a_store(store_root, tmp_path):
    url = f"file://{tmp_path / 'store'}"
    pushed = json.loads(cli_ok("push", url, *V2, "--cache-dir", str(store_root), "--json"))
    assert len(pushed["pushed"]) == 1
    listed = json.loads(cli_ok("ls", url, "--json"))
    (rec,) = listed["entries"]
    assert rec["id"].startswith("flashinfer-v2:") and rec["status"] == "complete"
    dry = run_cli("pull", url, *V2, "--cache-dir", str(tmp_path / "dst"), "--dry-run")
    assert dry.returncode == 0 and not (tmp_path / "dst").exists()
    cli_ok("pull", url, *V2, "--cache-dir", str(tmp_path / "dst"), "--any-env")
    assert tree(tmp_path / "dst") == tree(store_root)


def test_pull_on_s3(store_root, tmp_path, s3):
    cli_ok("push", s3["url"], *V2, "--cache-dir", str(store_root))
    cli_ok("pull", s3["url"], *V2, "--cache-dir", str(tmp_path / "dst"), "--any-env")
    assert tree(tmp_path / "dst") == tree(store_root)


def test_a_record_edited_to_name_another_gpu_is_refused(store_root, tmp_path):
    store = tmp_path / "store"
    cli_ok("push", f"file://{store}", *V2, "--cache-dir", str(store_root))
    (record,) = (store / "index" / "flashinfer-v2").glob("*.json")
    rec = json.loads(record.read_text())
    rec["metadata"]["gpu"] = "NVIDIA B200"
    record.write_text(json.dumps(rec))
    proc = run_cli("pull", f"file://{store}", *V2, "--cache-dir", str(tmp_path / "dst"), "--any-env")
    assert proc.returncode == 1 and "metadata disagrees with its bundle" in proc.stderr, proc.stderr
    assert not list((tmp_path / "dst").rglob("*.json"))


def test_what_cannot_be_read_as_an_entry_is_other_content(store_root, tmp_path):
    """A symlink (or FIFO, or oversized file) where an entry belongs is not "absent": replacing it
    needs --force like any other content."""
    bundle = tmp_path / "a.tgz"
    cli_ok("export", *V2, "--cache-dir", str(store_root), "-o", str(bundle))
    target = tmp_path / "other"
    cli_ok("import", *V2, "--cache-dir", str(target), str(bundle))
    victim = sorted((env_dir(target) / "entries").glob("*.json"))[0]
    (tmp_path / "elsewhere.json").write_bytes(victim.read_bytes())
    victim.unlink()
    victim.symlink_to(tmp_path / "elsewhere.json")
    proc = run_cli("import", *V2, "--cache-dir", str(target), str(bundle))
    assert proc.returncode == 1 and "already there with other content" in proc.stderr
    assert victim.is_symlink()


def test_an_entry_file_this_user_may_not_read_makes_the_store_unreadable_never_corrupt(store_root):
    """FlashInfer's store written by a server's user (0600 files) and pruned by another: what the
    file holds is not known, so ``prune --status corrupt`` leaves the environment dir."""
    from ..conftest import run_cli_unprivileged

    locked = sorted((env_dir(store_root) / "entries").glob("*.json"))[0]
    locked.chmod(0)
    try:
        ls = run_cli_unprivileged("ls", *V2, "--json", "--cache-dir", str(store_root))
        (entry,) = json.loads(ls.stdout)["entries"]
        assert entry["status"] == "unreadable" and any("Permission denied" in p for p in entry["problems"]), entry
        proc = run_cli_unprivileged("prune", *V2, "--status", "corrupt", "-y", "--cache-dir", str(store_root))
        assert proc.returncode == 0 and "Nothing to delete" in proc.stdout, proc.stdout + proc.stderr
    finally:
        locked.chmod(0o644)
    assert env_dir(store_root).is_dir()
