"""Issue 45: confusing and left-over items of the tree commands - a --cache-dir one level too
high, --model matched exactly, dry-run JSON shaped as the run's, convert's destination said,
transfer progress in a terminal only, and left-over log lines. Real processes on real trees."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from devtools.synthetic import default_fields, entry_path, write_fake_entry

from ..conftest import CLI_ARGV, REPO, run_cli, run_json


def ids(root) -> list[str]:
    return sorted(run_cli("ls", "-q", "--cache-dir", str(root)).stdout.splitlines())


# --- 1. a --cache-dir one level too high ----------------------------------------------------------

@pytest.fixture
def opt(tmp_path):
    """``opt/sglang-cache`` holds a tree; ``opt`` is what a user gives by mistake."""
    opt = tmp_path / "opt"
    tree = opt / "sglang-cache"
    tree.mkdir(parents=True)
    eid = write_fake_entry(tree)
    return opt, tree, eid


@pytest.mark.parametrize("cmd", [["ls"], ["ls", "--json"], ["prune", "--dry-run", "--older-than", "1d"]],
                         ids=lambda c: " ".join(c))
def test_a_root_one_level_too_high_names_the_tree_below(opt, cmd):
    top, tree, _ = opt
    proc = run_cli(*cmd, "--cache-dir", str(top))
    assert proc.returncode == 0, proc.stderr
    assert f"no cache tree at {top}; did you mean {tree}?" in proc.stderr, proc.stderr


def test_a_root_two_levels_too_high_names_the_tree_too(tmp_path):
    tree = tmp_path / "opt" / "images" / "sglang-cache"
    tree.mkdir(parents=True)
    write_fake_entry(tree)
    proc = run_cli("ls", "--cache-dir", str(tmp_path / "opt"))
    assert proc.returncode == 0, proc.stderr
    assert f"did you mean {tree}?" in proc.stderr, proc.stderr


def test_the_right_root_has_no_note(opt):
    _, tree, eid = opt
    proc = run_cli("ls", "-q", "--cache-dir", str(tree))
    assert proc.returncode == 0 and proc.stdout.split() == [str(eid)], proc.stderr
    assert "did you mean" not in proc.stderr


def _archive(tree, tmp_path) -> Path:
    out = tmp_path / "a.tgz"
    proc = run_cli("export", "-o", str(out), "--cache-dir", str(tree))
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_import_into_a_root_above_a_tree_is_refused_naming_it(opt, tmp_path, dry_run):
    top, tree, _ = opt
    archive = _archive(tree, tmp_path)
    proc = run_cli("import", str(archive), "--cache-dir", str(top), *(["--dry-run"] if dry_run else []))
    assert proc.returncode == 2, proc.stderr
    assert f"did you mean {tree}?" in proc.stderr and "--new-tree" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (top / "flashinfer").exists()


def test_import_with_new_tree_writes_a_tree_there(opt, tmp_path):
    top, tree, eid = opt
    archive = _archive(tree, tmp_path)
    proc = run_cli("import", str(archive), "--cache-dir", str(top), "--new-tree")
    assert proc.returncode == 0, proc.stderr
    assert ids(top) == [str(eid)]


def test_pull_into_a_root_above_a_tree_is_refused_naming_it(opt, tmp_path):
    top, tree, eid = opt
    store = f"file://{tmp_path / 'store'}"
    assert run_cli("push", store, "--cache-dir", str(tree)).returncode == 0
    proc = run_cli("pull", store, "--cache-dir", str(top), "--any-env")
    assert proc.returncode == 2, proc.stderr
    assert f"did you mean {tree}?" in proc.stderr and "--new-tree" in proc.stderr, proc.stderr
    assert not (top / "flashinfer").exists()
    proc = run_cli("pull", store, "--cache-dir", str(top), "--any-env", "--new-tree")
    assert proc.returncode == 0, proc.stderr
    assert ids(top) == [str(eid)]


def test_import_into_an_empty_new_root_needs_no_flag(opt, tmp_path):
    _, tree, eid = opt
    archive = _archive(tree, tmp_path)
    fresh = tmp_path / "fresh"
    proc = run_cli("import", str(archive), "--cache-dir", str(fresh))
    assert proc.returncode == 0, proc.stderr
    assert ids(fresh) == [str(eid)]


def test_pull_by_serving_flags_with_new_tree_says_nothing_more(opt, tmp_path):
    top, tree, _ = opt
    store = f"file://{tmp_path / 'store'}"
    assert run_cli("push", store, "--cache-dir", str(tree)).returncode == 0
    proc = run_cli("pull", store, "--cache-dir", str(top), "--any-env", "--new-tree", "--dry-run",
                   "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--dp", "8", "--arch", "sm100")
    assert "did you mean" not in proc.stderr, proc.stderr


# --- 2. --model is exact everywhere; --model-glob is the pattern ----------------------------------

GLM, GLM_FP8 = "zai-org/GLM-5.1", "zai-org/GLM-5.1-FP8"


@pytest.fixture
def glm_pair(tmp_path):
    """GLM-5.1 and GLM-5.1-FP8: one model path is a prefix (a substring) of the other."""
    root = tmp_path / "tree"
    fp8 = write_fake_entry(root, fields=default_fields(GLM_FP8))
    plain = write_fake_entry(root, fields=default_fields(GLM), seed=1)
    return root, str(plain), str(fp8)


def test_prune_model_takes_that_model_only(glm_pair):
    root, plain, fp8 = glm_pair
    would = run_json("prune", "--model", GLM, "--dry-run", "--cache-dir", str(root))
    assert [c["id"] for c in would["plan"]["entries"]] == [plain]
    proc = run_cli("prune", "--model", GLM, "-y", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert ids(root) == [fp8]


@pytest.mark.parametrize("cmd", [["ls", "-q"], ["export", "-o", "OUT", "--dry-run", "--json"],
                                 ["push", "STORE", "--dry-run", "--json"]], ids=lambda c: c[0])
def test_model_is_exact_in_every_filtering_command(glm_pair, tmp_path, cmd):
    root, plain, fp8 = glm_pair
    cmd = [str(tmp_path / "a.tgz") if a == "OUT" else f"file://{tmp_path / 's'}" if a == "STORE" else a for a in cmd]
    proc = run_cli(*cmd, "--model", GLM, "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    chosen = proc.stdout.split() if cmd[0] == "ls" else json.loads(proc.stdout)["sizes"]
    assert [c if isinstance(c, str) else c["id"] for c in chosen] == [plain]


def test_ls_url_model_is_exact(glm_pair, tmp_path):
    root, plain, _ = glm_pair
    store = f"file://{tmp_path / 'store'}"
    assert run_cli("push", store, "--cache-dir", str(root)).returncode == 0
    assert run_cli("ls", store, "-q", "--model", GLM).stdout.split() == [plain]


def test_model_glob_is_the_pattern(glm_pair):
    root, plain, fp8 = glm_pair
    assert run_cli("ls", "-q", "--model-glob", "*glm-5.1*", "--cache-dir", str(root)).stdout.split() == sorted([plain, fp8])
    assert run_cli("ls", "-q", "--model-glob", "*-FP8", "--cache-dir", str(root)).stdout.split() == [fp8]
    would = run_json("prune", "--model-glob", "zai-org/*", "--dry-run", "--cache-dir", str(root))
    assert sorted(c["id"] for c in would["plan"]["entries"]) == sorted([plain, fp8])


def test_a_model_that_only_a_substring_matches_points_at_model_glob(glm_pair):
    root, _, _ = glm_pair
    for cmd in (["ls"], ["prune", "--dry-run"]):
        proc = run_cli(*cmd, "--model", "GLM-5.1", "--cache-dir", str(root))
        assert proc.returncode == 0, proc.stderr
        assert "--model-glob '*GLM-5.1*'" in proc.stderr and GLM_FP8 in proc.stderr, proc.stderr
    assert "Nothing to delete" in proc.stdout


# --- 3. a dry run prints the run's own object, dry_run true ---------------------------------------

def test_dry_runs_print_the_runs_object(tmp_path):
    root, dest = tmp_path / "tree", tmp_path / "dest"
    eid = str(write_fake_entry(root))
    archive, store = tmp_path / "a.tgz", f"file://{tmp_path / 'store'}"
    cd = ["--cache-dir", str(root)]
    for cmd, run_args in ((["export", "-o", str(archive)], cd), (["push", store], cd),
                          (["import", str(archive)], ["--cache-dir", str(dest)])):
        dry = run_json(*cmd, "--dry-run", *run_args)
        assert not archive.exists() or cmd[0] != "export"
        real = run_json(*cmd, *run_args)
        assert dry["dry_run"] is True and real["dry_run"] is False, cmd
        assert set(real) <= set(dry) and set(dry) - set(real) <= {"where", "sizes", "entries"}, cmd
        for k in real:
            assert type(dry[k]) is type(real[k]), (cmd, k)
        if cmd[0] == "export":
            assert dry["entries"] == real["entries"] == [eid] and dry["size"] == real["size"] > 0
            assert dry["members"] == real["members"]
        if cmd[0] == "push":
            assert dry["pushed"] == real["pushed"] == [eid] and dry["uploaded_bytes"] == real["uploaded_bytes"]
            again = run_json(*cmd, "--dry-run", *run_args)
            assert again["pushed"] == [] and again["unchanged"] == [eid] and again["uploaded_bytes"] == 0
        if cmd[0] == "import":
            assert dry["imported"] == real["imported"] == [eid]
        assert [s["id"] for s in dry["sizes"]] == [eid]


# --- 5. left-overs: ls --help, the targets file's fields, "N entries to tune" ---------------------

def test_ls_help_names_every_status():
    from autotune_cache.tree.status import EntryStatus

    text = run_cli("ls", "--help").stdout
    at = text.index("  STATUS ")  # the column's own paragraph, not --status's option help
    status = text[at:text.index("\n\n", at)]
    for name in EntryStatus.names():
        assert name in status, name


def test_the_targets_files_unknown_field_error_lists_every_accepted_field(tmp_path):
    from autotune_cache import registry

    bad = tmp_path / "t.yaml"
    bad.write_text(json.dumps({"targets": [{"model": "Qwen/Qwen3-30B-A3B", "tp": 2, "bogus": 1}]}))
    proc = run_cli("plan", "--targets", str(bad), "--arch", "sm90")
    assert proc.returncode == 2
    known = proc.stderr.split("known: ", 1)[1]
    engine_fields = [o.name for e in registry.engines() for o in e.cli_options]
    assert engine_fields and all(f in known for f in engine_fields), known
    ok = tmp_path / "ok.yaml"  # each one listed is taken
    ok.write_text(json.dumps({"defaults": {"arch": "sm90", "flashinfer_version": "0.7.2.post1"}, "targets": [
        {"model": "Qwen/Qwen3-30B-A3B", "tp": 2, "moe_runner_backend": "flashinfer_cutlass", "layouts": ["vllm"],
         "vllm_config_hash": "a" * 64, "max_num_batched_tokens": 8192}]}))
    proc = run_cli("plan", "--targets", str(ok))
    assert proc.returncode == 0, proc.stderr


def test_entries_to_tune_counts_what_warm_will_tune(tmp_path):
    from autotune_cache.plan.request import TuneRequest
    from devtools.synthetic import write_plan_entry

    targets, root = tmp_path / "t.yaml", tmp_path / "tree"
    root.mkdir()
    targets.write_text(json.dumps({"defaults": {"arch": "sm90", "flashinfer_version": "0.7.2.post1"}, "targets": [
        {"model": "Qwen/Qwen3-30B-A3B", "tp": tp, "moe_runner_backend": "flashinfer_cutlass"} for tp in (1, 2)]}))
    args = ["plan", "--targets", str(targets), "--cache-dir", str(root)]
    assert "2 entries to tune:" in run_cli(*args).stdout
    workers = run_json(*args)["workers"]
    write_plan_entry(TuneRequest.from_dict(workers[0]["request"]).plan(root))
    human = run_cli(*args).stdout
    one = workers[1]["profiles"]
    assert f"1 entry to tune: {one} profiles one by one" in human, human
    assert "1 already covered (warm skips it unless --force)" in human, human


# --- 4. convert says where it writes --------------------------------------------------------------

def test_convert_names_its_destination_and_where_it_came_from(tmp_path, monkeypatch):
    tree, home = tmp_path / "sglang", tmp_path / "home"
    home.mkdir()
    eid = str(write_fake_entry(tree))
    monkeypatch.delenv("FLASHINFER_AUTOTUNE_CACHE_DIR", raising=False)
    env = {"SGLANG_CACHE_DIR": str(tree), "HOME": str(home)}
    proc = run_cli("convert", eid, "--layout", "flashinfer-v2", env=env)
    assert proc.returncode == 0, proc.stderr
    dest = home / ".cache" / "flashinfer" / "autotune"
    assert f"under {dest} (from the default ~/.cache/flashinfer/autotune), not under {tree} (from $SGLANG_CACHE_DIR)" \
        in proc.stderr, proc.stderr
    assert "--to ROOT" in proc.stderr and (dest / "v2").is_dir()
    data = run_json("convert", eid, "--layout", "flashinfer-v2", env={**env, "FLASHINFER_AUTOTUNE_CACHE_DIR": str(tmp_path / "fi")})
    assert [(e["root"], e["root_source"]) for e in data["entries"]] == [(str(tmp_path / "fi"), "$FLASHINFER_AUTOTUNE_CACHE_DIR")]
    proc = run_cli("convert", eid, "--layout", "flashinfer-v2", "--to", str(tmp_path / "to"), env=env)
    assert f"under {tmp_path / 'to'} (from --to)" in proc.stderr, proc.stderr


# --- 6. the README's `diff ID STORE` ---------------------------------------------------------------

def test_diff_an_entry_against_a_store_compares_its_published_copy(tmp_path):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    eid = str(write_fake_entry(mine))
    write_fake_entry(theirs, seed=5)  # the same id, other tactics
    store = f"file://{tmp_path / 'store'}"
    assert run_cli("push", store, "--cache-dir", str(theirs)).returncode == 0
    proc = run_cli("diff", eid, store, "--cache-dir", str(mine), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert not report["identical"] and report["b"] == f"{store} {eid}"
    assert run_json("diff", store, str(theirs))["identical"]
    same = run_cli("diff", eid, str(mine), "--cache-dir", str(mine))
    assert same.returncode == 0 and same.stdout.strip().splitlines()[-1].startswith("identical"), same.stderr
    other = write_fake_entry(mine, fields=default_fields("org/other"), seed=1)
    missing = run_cli("diff", str(other), store, "--cache-dir", str(mine))
    assert missing.returncode == 1 and f"holds no entry {other}" in missing.stderr, missing.stderr
    a_dir = run_cli("diff", str(entry_path(mine, other)), store)
    assert a_dir.returncode == 2, a_dir.stderr


# --- 7. push and pull show a bar in a terminal, nothing in a pipe or with --json -----------------

def _in_a_terminal(*args: str) -> tuple[int, str, str]:
    """The command with stderr on a terminal (a pty, 100 columns) and stdout on a pipe."""
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen([*CLI_ARGV, *args], stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                            cwd=REPO, env=env)
    os.close(slave)
    err = b""
    while select.select([master], [], [], 60)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the other end closed (Linux: EIO)
            break
        if not chunk:
            break
        err += chunk
    out = proc.stdout.read()
    proc.wait(timeout=60)
    os.close(master)
    return proc.returncode, out.decode(), err.decode(errors="replace")


def test_push_and_pull_show_progress_in_a_terminal_only(tmp_path):
    tree = tmp_path / "tree"
    write_fake_entry(tree)
    store = f"file://{tmp_path / 'store'}"
    rc, out, err = _in_a_terminal("push", store, "--cache-dir", str(tree))
    assert rc == 0 and "1 pushed" in out, err
    assert "push:" in err and "100%" in err, repr(err)
    rc, out, err = _in_a_terminal("pull", store, "--cache-dir", str(tmp_path / "a"), "--any-env")
    assert rc == 0 and "pulled" in out, err
    assert "pull:" in err and "100%" in err, repr(err)
    rc, out, err = _in_a_terminal("pull", store, "--cache-dir", str(tmp_path / "b"), "--any-env", "--json")
    assert rc == 0 and json.loads(out)["imported"] and "B/s" not in err, repr(err)
    piped = run_cli("pull", store, "--cache-dir", str(tmp_path / "c"), "--any-env")
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    piped = run_cli("push", store, "--cache-dir", str(tree))
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
