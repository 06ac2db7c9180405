"""What a transfer says it will do is what it does: ``pull --dry-run`` decides as the pull does,
``pull`` applies the filters ``ls URL`` takes (or refuses flags it would ignore), a pull that
misses names the nearest entry, and a ``--cache-dir`` one level off a tree's root is refused
naming the root instead of reading as empty or being written into. Real processes, real trees,
a file:// store and a real S3 server on loopback (moto)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devtools.synthetic import DEFAULT_METADATA, default_fields, write_fake_entry, write_vllm_entry

from tests.conftest import run_cli, run_cli_unprivileged
from tests.engines.test_v2_bundles import V2, env_dir as v2_env_dir, store_root as v2_root, tree as v2_tree  # noqa: F401
from tests.tree.store.test_pull_verify import store  # noqa: F401 - the store fixture (file:// and S3)

H100 = {"gpu": "NVIDIA H100 80GB HBM3"}


def ok(*args) -> dict:
    proc = run_cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def env_file(tmp_path: Path, **fields) -> str:
    path = tmp_path / "env.json"
    path.write_text(json.dumps({"fingerprint": {**DEFAULT_METADATA, **fields}, "arch": "sm100"}))
    return str(path)


def mixed_store(url: str, src: Path) -> tuple[str, list[str]]:
    """One entry tuned on an H200 (the target), two on an H100, pushed to ``url``."""
    good = str(write_fake_entry(src))
    others = sorted(str(write_fake_entry(src, fields=default_fields(f"org/m{i}", tp=2, dp=1), seed=i, metadata=H100))
                    for i in (1, 2))
    assert run_cli("push", url, "--cache-dir", str(src)).returncode == 0
    return good, others


def rank_files(root: Path) -> list[Path]:
    return sorted(root.rglob("rank_*.json")) if root.exists() else []


# --- 1. a dry run decides as the run does --------------------------------------------------------

def test_pull_dry_run_refuses_what_the_pull_refuses_and_the_hint_takes_only_the_compatible(store, tmp_path):
    good, others = mixed_store(store.url, tmp_path / "src")
    env, dest = env_file(tmp_path), tmp_path / "dest"
    args = ("pull", store.url, "--env-from", env, "--cache-dir", str(dest))
    dry = run_cli(*args, "--dry-run")
    real = run_cli(*args)
    assert real.returncode == 1 and not rank_files(dest)
    assert dry.returncode == real.returncode, dry.stdout + dry.stderr
    assert "would be pulled" not in dry.stdout
    for proc in (dry, real):
        assert "--only-compatible" in proc.stderr and all(o in proc.stderr for o in others)
    would = ok(*args, "--only-compatible", "--dry-run")
    assert would["dry_run"] and would["imported"] == [good] and not rank_files(dest)
    pulled = ok(*args, "--only-compatible")
    assert pulled["imported"] == [good]
    assert {p.parent.name for p in rank_files(dest)} == {good.rsplit("/", 1)[1]}


def test_pull_dry_run_refuses_a_conflict_the_pull_refuses(tmp_path):
    url, src, dest = f"file://{tmp_path / 'store'}", tmp_path / "src", tmp_path / "dest"
    eid = str(write_fake_entry(src))
    assert run_cli("push", url, "--cache-dir", str(src)).returncode == 0
    write_fake_entry(dest, seed=7)  # the same id, other tactics: a different complete entry
    before = {p: p.read_bytes() for p in rank_files(dest)}
    real = run_cli("pull", url, "--any-env", "--cache-dir", str(dest))
    dry = run_cli("pull", url, "--any-env", "--cache-dir", str(dest), "--dry-run")
    assert real.returncode == 1 and dry.returncode == 1, dry.stdout + dry.stderr
    assert eid in dry.stderr and "would be pulled" not in dry.stdout
    assert {p: p.read_bytes() for p in rank_files(dest)} == before


# --- 2. pull takes ls URL's filters ------------------------------------------------------------------

def test_pull_applies_the_filters_ls_url_takes(tmp_path):
    url, src = f"file://{tmp_path / 'store'}", tmp_path / "src"
    glm = str(write_fake_entry(src))
    m1 = str(write_fake_entry(src, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1))
    m2 = str(write_fake_entry(src, fields=default_fields("org/m2", tp=2, dp=1), arch="sm90", seed=2,
                              flashinfer_version="0.6.0"))
    assert run_cli("push", url, "--cache-dir", str(src)).returncode == 0
    for flags, want in ((("--arch", "sm90"), [m1, m2]),
                        (("--arch", "sm90", "--flashinfer-version", "0.6.0"), [m2]),
                        (("--flashinfer-version", "0.7.2.post1"), [glm, m1]),
                        (("--status", "complete", "--arch", "sm100"), [glm])):
        listed = sorted(e["id"] for e in ok("ls", url, *flags)["entries"])
        assert listed == sorted(want), flags
        dest = tmp_path / f"dest-{'-'.join(flags)}"
        would = ok("pull", url, *flags, "--any-env", "--cache-dir", str(dest), "--dry-run")
        assert would["dry_run"] and sorted(would["imported"]) == listed, flags
        assert sorted(ok("pull", url, *flags, "--any-env", "--cache-dir", str(dest))["imported"]) == listed, flags
    nothing = run_cli("pull", url, "--arch", "sm120", "--any-env", "--cache-dir", str(tmp_path / "none"))
    assert nothing.returncode == 1 and not rank_files(tmp_path / "none")


def test_pull_refuses_serving_flags_it_would_ignore(tmp_path):
    url, src = f"file://{tmp_path / 'store'}", tmp_path / "src"
    write_fake_entry(src)
    assert run_cli("push", url, "--cache-dir", str(src)).returncode == 0
    proc = run_cli("pull", url, "--tp", "8", "--any-env", "--cache-dir", str(tmp_path / "dest"))
    assert proc.returncode == 2 and "--tp" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not rank_files(tmp_path / "dest")


# --- 3. a miss names the nearest entry -------------------------------------------------------------

def test_a_pull_by_serving_flags_that_misses_names_the_nearest_entry(tmp_path):
    url, src = f"file://{tmp_path / 'store'}", tmp_path / "src"
    write_fake_entry(src)  # GLM-5.1 tp8 dp8
    assert run_cli("push", url, "--cache-dir", str(src)).returncode == 0
    proc = run_cli("pull", url, "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--dp", "4",
                   "--env-from", env_file(tmp_path), "--cache-dir", str(tmp_path / "dest"))
    assert proc.returncode == 1, proc.stderr
    assert "nearest entry" in proc.stderr and "attention-DP size" in proc.stderr, proc.stderr


# --- 4. import --dry-run's wording -------------------------------------------------------------

def test_import_dry_run_says_into_the_destination(tmp_path):
    src, dest, archive = tmp_path / "src", tmp_path / "dest", tmp_path / "a.tgz"
    write_fake_entry(src)
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(src)).returncode == 0
    proc = run_cli("import", str(archive), "--cache-dir", str(dest), "--dry-run")
    assert proc.returncode == 0 and f"would be imported into {dest}" in proc.stdout, proc.stdout
    assert "imported from" not in proc.stdout and not dest.exists()


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mode, p.stat().st_mtime_ns, p.is_file() and p.read_bytes())
            for p in sorted(root.rglob("*"))}


def test_an_import_dry_run_writes_nothing_and_answers_over_a_tree_it_cannot_write(tmp_path):
    """A dry run stages outside the tree: no staging dir, lock file or missing root is made in it,
    so it answers where its user may only read (a shared cache, a read-only image) - and, where
    it could write, the tree is left as it was to the last mtime."""
    src, archive, shared = tmp_path / "src", tmp_path / "a.tgz", tmp_path / "shared"
    there = str(write_fake_entry(src))
    new = str(write_fake_entry(src, fields=default_fields("org/m1", tp=2, dp=1), seed=1))
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(src)).returncode == 0
    write_fake_entry(shared)  # ``there`` is already in it, the same
    before = _snapshot(shared)
    writable = run_cli("import", str(archive), "--cache-dir", str(shared), "--dry-run", "--json")
    assert writable.returncode == 0, writable.stderr
    assert [e["id"] for e in json.loads(writable.stdout)["entries"]] == [new]
    assert _snapshot(shared) == before
    dirs = [shared, *(p for p in shared.rglob("*") if p.is_dir())]
    for d in dirs:
        d.chmod(0o555)
    try:
        ro = run_cli_unprivileged("import", str(archive), "--cache-dir", str(shared), "--dry-run", "--json")
        missing = run_cli_unprivileged("import", str(archive), "--cache-dir", str(shared / "not-yet"), "--dry-run")
        real = run_cli_unprivileged("import", str(archive), "--cache-dir", str(shared))
    finally:
        for d in dirs:
            d.chmod(0o755)
    assert ro.returncode == 0, ro.stderr
    assert [e["id"] for e in json.loads(ro.stdout)["entries"]] == [new] and there != new
    assert missing.returncode == 0 and "2 entries" in missing.stdout and not (shared / "not-yet").exists(), missing.stderr
    assert real.returncode == 1 and "Permission denied" in real.stderr  # the run itself still needs to write
    assert _snapshot(shared) == before


# --- 5. a root one level off ------------------------------------------------------------------------

@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_a_cache_dir_inside_a_tree_is_refused_naming_the_root(tmp_path, depth):
    root = tmp_path / "cache"
    eid = write_fake_entry(root)
    archive = tmp_path / "a.tgz"
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(root)).returncode == 0
    inside = root.joinpath("flashinfer", "autotune", *eid.parts[:depth])
    before = sorted(p for p in root.rglob("*"))
    for args in (("ls",), ("prune", "--older-than", "1s", "-y"), ("import", str(archive)), ("export", "-o", "-"),
                 ("rm", str(eid), "-y"), ("push", f"file://{tmp_path / 'store'}"),
                 ("pull", f"file://{tmp_path / 'store'}", "--any-env")):
        proc = run_cli(*args, "--cache-dir", str(inside))
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert f"--cache-dir {root}" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert sorted(p for p in root.rglob("*")) == before and not (tmp_path / "store").exists()


def test_a_tree_nested_inside_a_tree_is_named_and_never_written(tmp_path):
    root, src, archive = tmp_path / "cache", tmp_path / "src", tmp_path / "a.tgz"
    write_fake_entry(src)
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(src)).returncode == 0
    nested = root / "flashinfer" / "autotune" / "flashinfer" / "autotune"
    nested.mkdir(parents=True)  # what an older import into <root>/flashinfer/autotune left
    for args in (("ls",), ("import", str(archive))):
        proc = run_cli(*args, "--cache-dir", str(root))
        assert proc.returncode == 2 and str(nested) in proc.stderr, proc.stderr
    assert not rank_files(root)


def test_the_flashinfer_dir_of_a_tree_is_no_root_and_a_root_called_flashinfer_is(tmp_path):
    """``<root>/flashinfer`` (half the base): refused where ``autotune`` is beneath it, and a tree
    written there before (``<root>/flashinfer/flashinfer/autotune``) is named from ``<root>``."""
    root, archive = tmp_path / "cache", tmp_path / "a.tgz"
    write_fake_entry(root)
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(root)).returncode == 0
    for args in (("ls",), ("import", str(archive)), ("prune", "--older-than", "1s", "-y"), ("export", "-o", "-")):
        proc = run_cli(*args, "--cache-dir", str(root / "flashinfer"))
        assert proc.returncode == 2 and f"--cache-dir {root}" in proc.stderr, (args, proc.stderr)
    assert not (root / "flashinfer" / "flashinfer").exists()
    (root / "flashinfer" / "flashinfer" / "autotune").mkdir(parents=True)  # what such an import left before
    proc = run_cli("ls", "--cache-dir", str(root))
    assert proc.returncode == 2 and str(root / "flashinfer" / "flashinfer" / "autotune") in proc.stderr, proc.stderr
    named = tmp_path / "flashinfer"  # a root may be called flashinfer: empty, then holding its own tree
    named.mkdir()
    assert ok("ls", "--cache-dir", str(named))["entries"] == []
    assert ok("import", str(archive), "--cache-dir", str(named))["imported"]
    assert ok("ls", "--cache-dir", str(named))["entries"]


def test_fresh_empty_and_unrelated_roots_are_still_roots(tmp_path):
    src, archive = tmp_path / "src", tmp_path / "a.tgz"
    write_fake_entry(src)
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(src)).returncode == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert ok("ls", "--cache-dir", str(empty))["entries"] == []
    other = tmp_path / "srv" / "x" / "flashinfer" / "autotune"  # <given>/x/flashinfer/autotune: not nested
    other.mkdir(parents=True)
    for root in (tmp_path / "fresh" / "cache", empty, tmp_path / "srv"):
        assert ok("import", str(archive), "--cache-dir", str(root))["imported"], root


def test_the_vllm_and_flashinfer_v2_layouts_name_their_own_roots(tmp_path):
    vroot = tmp_path / "vllm"
    entry = write_vllm_entry(vroot, "ab" * 32)
    for inside in (vroot / "flashinfer_autotune_cache", entry.parent, entry):
        proc = run_cli("ls", "--layout", "vllm", "--cache-dir", str(inside))
        assert proc.returncode == 2 and f"--cache-dir {vroot}" in proc.stderr, proc.stderr
    assert [e["id"] for e in ok("ls", "--layout", "vllm", "--cache-dir", str(vroot))["entries"]]
    froot = tmp_path / "fi"
    env = froot / "v2" / "0123456789abcdef"
    (env / "entries").mkdir(parents=True)
    for inside in (froot / "v2", env):
        proc = run_cli("ls", "--layout", "flashinfer-v2", "--cache-dir", str(inside))
        assert proc.returncode == 2 and f"--cache-dir {froot}" in proc.stderr, proc.stderr
    named_v2 = tmp_path / "stores" / "v2"  # a root may be called v2: nothing of a store inside it
    named_v2.mkdir(parents=True)
    assert run_cli("ls", "--layout", "flashinfer-v2", "--cache-dir", str(named_v2)).returncode == 0


def test_import_dry_run_refuses_a_conflict_the_import_refuses(tmp_path):
    src, dest, archive = tmp_path / "src", tmp_path / "dest", tmp_path / "a.tgz"
    eid = str(write_fake_entry(src))
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(src)).returncode == 0
    write_fake_entry(dest, seed=7)  # the same id, other tactics
    before = {p: p.read_bytes() for p in rank_files(dest)}
    real = run_cli("import", str(archive), "--cache-dir", str(dest))
    dry = run_cli("import", str(archive), "--cache-dir", str(dest), "--dry-run")
    assert real.returncode == 1 and dry.returncode == 1, dry.stdout + dry.stderr
    assert eid in dry.stderr and "would be imported" not in dry.stdout
    assert {p: p.read_bytes() for p in rank_files(dest)} == before
    forced = ok("import", str(archive), "--cache-dir", str(dest), "--dry-run", "--force")
    assert [e["id"] for e in forced["entries"]] == [eid] and {p: p.read_bytes() for p in rank_files(dest)} == before


def test_a_merged_stores_import_dry_run_refuses_what_the_import_refuses(v2_root, tmp_path):
    """FlashInfer's managed store merges file by file: its dry run asks the same question."""
    bundle, target = tmp_path / "a.tgz", tmp_path / "other"
    assert run_cli("export", *V2, "--cache-dir", str(v2_root), "-o", str(bundle)).returncode == 0
    assert run_cli("import", *V2, "--cache-dir", str(target), str(bundle)).returncode == 0
    victim = sorted((v2_env_dir(target) / "entries").glob("*.json"))[0]
    local = json.loads(victim.read_text())
    local["tactic"] = [7]  # this host tuned one of the bundle's keys to another tactic
    victim.write_text(json.dumps(local, indent=2, sort_keys=True))
    before = v2_tree(target)
    real = run_cli("import", *V2, "--cache-dir", str(target), str(bundle))
    dry = run_cli("import", *V2, "--cache-dir", str(target), str(bundle), "--dry-run")
    assert real.returncode == 1 and dry.returncode == 1, dry.stdout + dry.stderr
    assert "already there with other content" in dry.stderr and v2_tree(target) == before
    forced = ok("import", *V2, "--cache-dir", str(target), str(bundle), "--dry-run", "--force")
    assert len(forced["entries"]) == 1 and v2_tree(target) == before
