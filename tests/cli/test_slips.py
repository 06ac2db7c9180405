"""No delete on a slip: a size without a unit, a zero budget or ``--keep-latest 0``, an id with a
stray newline or space, a mis-cased unit - each is refused (exit 2, one line) before anything is
planned, and ``--keep-latest`` never deletes the entry the engine reads. Real processes, real trees."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from autotune_cache.humanize import how_it_ended, parse_duration, parse_size
from autotune_cache.errors import UsageError
from devtools.synthetic import DEFAULT_METADATA, default_fields, entry_path, write_fake_entry, write_vllm_entry

from ..conftest import run_cli, run_json


def ids(root, *layout) -> list[str]:
    return sorted(run_cli("ls", "-q", *layout, "--cache-dir", str(root)).stdout.splitlines())


def one_line_usage_error(proc) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


# --- 1. sizes need a unit ------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ("prune", "--max-size", "50", "-y"),
    ("prune", "--max-size", "0", "-y"),
    ("prune", "--larger-than", "100", "-y"),
    ("prune", "--smaller-than", "10", "-y"),
    ("ls", "--larger-than", "100"),
])
def test_a_size_without_a_unit_is_a_usage_error(root, args):
    eid = write_fake_entry(root)
    proc = run_cli(*args, "--cache-dir", str(root))
    one_line_usage_error(proc)
    assert "no unit" in proc.stderr and "G" in proc.stderr, proc.stderr
    assert proc.stdout == ""
    assert ids(root) == [str(eid)]


@pytest.mark.parametrize("budget", ["0G", "0b", "0.0M"])
def test_a_zero_budget_is_refused(root, budget):
    eid = write_fake_entry(root)
    proc = run_cli("prune", "--max-size", budget, "-y", "--cache-dir", str(root))
    one_line_usage_error(proc)
    assert "every entry" in proc.stderr, proc.stderr
    assert ids(root) == [str(eid)]


# --- 2. one unit grammar, any case ---------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("50G", 50 * 10**9), ("50g", 50 * 10**9), ("50GB", 50 * 10**9), ("50Gb", 50 * 10**9), ("50gb", 50 * 10**9),
    ("50GiB", 50 * 2**30), ("50gib", 50 * 2**30), ("50GIB", 50 * 2**30), ("50Gi", 50 * 2**30),
    ("1.5k", 1500), ("2KiB", 2048), ("1T", 10**12), ("1p", 10**15), ("7B", 7), ("7 b", 7), ("0G", 0),
])
def test_sizes_any_case(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["50", "0", "1e3G", "50X", "50Gibs", "G", "-1G", "50 G B"])
def test_sizes_refused(text):
    with pytest.raises(UsageError):
        parse_size(text)


@pytest.mark.parametrize("text, seconds", [
    ("30d", 30 * 86400), ("30D", 30 * 86400), ("30days", 30 * 86400), ("1 day", 86400), ("1.5d", 1.5 * 86400),
    ("2w", 14 * 86400), ("2Weeks", 14 * 86400), ("12h", 43200), ("12hr", 43200), ("12 hours", 43200),
    ("90m", 5400), ("90min", 5400), ("90 Minutes", 5400), ("45s", 45), ("45sec", 45), ("45 seconds", 45),
])
def test_durations_any_case_with_long_forms(text, seconds):
    assert parse_duration(text).seconds == seconds


@pytest.mark.parametrize("text", ["30", "2y", "1mo", "3 months", "30dd", "d"])
def test_durations_refused(text):
    with pytest.raises(UsageError):
        parse_duration(text)


def test_a_process_end_in_words():
    """What a worker's failure says of how it ended (``Popen.returncode``)."""
    assert [how_it_ended(rc) for rc in (-9, -15, 0, 3, None, -200)] == [
        "killed by SIGKILL", "killed by SIGTERM", "exit status 0", "exit status 3", "no exit status",
        "killed by signal 200"]


def test_every_option_takes_the_grammar(root):
    eid = write_fake_entry(root)
    for args in (("ls", "--larger-than", "1kib"), ("ls", "--smaller-than", "50Gb"), ("ls", "--older-than", "30Days"),
                 ("ls", "--unused-for", "2W"), ("prune", "--max-size", "50gib", "--dry-run"),
                 ("prune", "--older-than", "1 Week", "--dry-run")):
        proc = run_cli(*args, "--cache-dir", str(root))
        assert proc.returncode == 0, (args, proc.stderr)
    assert ids(root) == [str(eid)]


@pytest.mark.parametrize("value,code", [("30", 0), ("1.5", 0), ("30s", 0), ("2m", 0), ("0s", 2), ("0", 2), ("2y", 2),
                                        ("abc", 2)])
def test_a_store_timeout_takes_seconds_bare_or_with_a_unit(tmp_path, value, code):
    """``--timeout 30s`` was "'30s' is not a valid float"; every other span takes a unit."""
    path = tmp_path / "store"
    path.mkdir()
    proc = run_cli("ls", f"file://{path}", "--timeout", value)
    lines = proc.stderr.strip().splitlines()
    if code == 2:
        assert proc.returncode == 2 and len(lines) == 1 and "--timeout" in lines[0], proc.stderr
    else:  # the timeout taken: the command goes on to find no store there
        assert proc.returncode == 1 and "no fi-autotune store" in proc.stderr, proc.stderr


def test_the_grammar_is_documented():
    from ..conftest import REPO

    text = (REPO / "docs" / "cli.md").read_text()
    assert "## Units" in text and "GiB" in text and "days" in text


# --- 3. --keep-latest --------------------------------------------------------------------------

def test_keep_latest_zero_is_refused(root):
    eid = write_fake_entry(root)
    proc = run_cli("prune", "--keep-latest", "0", "-y", "--cache-dir", str(root))
    one_line_usage_error(proc)
    assert "--keep-latest" in proc.stderr
    assert ids(root) == [str(eid)]


def _touch(root, eid, days_ago: float) -> None:
    t = time.time() - days_ago * 86400
    for p in entry_path(root, eid).iterdir():
        os.utime(p, (t, t))


def test_keep_latest_keeps_what_the_engine_reads_over_a_complete_entry_of_another_version(root, tmp_path):
    """The issue's case: one key, complete under 0.7.1 and written by the engine (no manifest:
    unverified) under the installed 0.7.2.post1. The engine reads only the installed one."""
    from importlib.metadata import version

    installed = version("flashinfer-python")
    fields = default_fields("A", tp=2, dp=1)
    old = write_fake_entry(root, fields=fields, flashinfer_version="0.7.1")
    here = write_fake_entry(root, fields=fields, flashinfer_version=installed, with_manifest=False)
    _touch(root, here, 5)
    statuses = {e["id"]: e["status"] for e in run_json("ls", "--cache-dir", str(root))["entries"]}
    assert statuses == {str(old): "complete", str(here): "unverified"}
    out = run_json("prune", "--keep-latest", "1", "-y", "--cache-dir", str(root))
    assert out["result"]["deleted"] == [str(old)]
    assert ids(root) == [str(here)]
    # The same with the serving image's version from --env-from (nothing installed matters then).
    root2 = tmp_path / "second"
    old2 = write_fake_entry(root2, fields=fields, flashinfer_version="0.7.0")
    served = write_fake_entry(root2, fields=fields, flashinfer_version="0.6.9", with_manifest=False)
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"fingerprint": {**DEFAULT_METADATA, "flashinfer_version": "0.6.9"}}))
    plan = run_json("prune", "--keep-latest", "1", "--env-from", str(env), "--dry-run", "--cache-dir", str(root2))
    (picked,) = plan["plan"]["entries"]
    assert picked["id"] == str(old2) and f"kept: {served}" in picked["reasons"][-1]


# --- 4. ids match exactly -----------------------------------------------------------------------

SLIPS = ["\n", " ", "\r", "\t"]


def _sglang(tmp_path):
    root = tmp_path / "sg"
    eid = write_fake_entry(root, arch="sm90")
    return root, (), str(eid), entry_path(root, eid)


def _vllm(tmp_path):
    root = tmp_path / "vl"
    path = write_vllm_entry(root, "ab" * 32)
    (eid,) = ids(root, "--layout", "vllm")
    return root, ("--layout", "vllm"), eid, path


def _v2(tmp_path):
    src, root = tmp_path / "src", tmp_path / "v2"
    sg = write_fake_entry(src, arch="sm90")
    proc = run_cli("convert", str(sg), "--layout", "flashinfer-v2", "--to", str(root), "--cache-dir", str(src))
    assert proc.returncode == 0, proc.stderr
    (eid,) = ids(root, "--layout", "flashinfer-v2")
    path = next((root / "v2").iterdir())
    return root, ("--layout", "flashinfer-v2"), eid, path


@pytest.mark.parametrize("make", [_sglang, _vllm, _v2], ids=["sglang", "vllm", "flashinfer-v2"])
@pytest.mark.parametrize("form", ["key", "id"])
def test_an_id_with_a_stray_character_deletes_nothing(tmp_path, make, form):
    root, layout, eid, path = make(tmp_path)
    twin = path.with_name(path.name + "\n")
    shutil.copytree(path, twin)
    ref = eid.rpartition("/")[2] if form == "key" else eid
    refs = [ref + "\n", ref + " ", " " + ref, ref + "\r", ref + "\t", "\n" + ref]
    if form == "key":
        refs.append(ref[:6] + "\n")  # a prefix too
    for bad in refs:
        proc = run_cli("rm", "-y", bad, *layout, "--cache-dir", str(root))
        one_line_usage_error(proc)
        assert "not an entry id" in proc.stderr, proc.stderr
        assert path.is_dir() and twin.is_dir(), bad
    proc = run_cli("show", ref + "\n", *layout, "--cache-dir", str(root))
    assert proc.returncode == 2 and "not an entry id" in proc.stderr, proc.stderr
    if not layout:
        for cmd in (("diff", ref, ref + "\n"), ("export", ref + " ", "-o", str(tmp_path / "x.tgz")),
                    ("convert", ref + "\r", "--layout", "flashinfer-v2", "--to", str(tmp_path / "v2x"))):
            proc = run_cli(*cmd, "--cache-dir", str(root))
            assert proc.returncode == 2 and "not an entry id" in proc.stderr, (cmd, proc.stderr)
    proc = run_cli("rm", "-y", ref, *layout, "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert not path.exists() and twin.is_dir()


def test_a_store_id_with_a_stray_character_is_refused(tmp_path):
    root, other, store = tmp_path / "tree", tmp_path / "other", tmp_path / "store"
    eid = str(write_fake_entry(root, arch="sm90"))
    url = f"file://{store}"
    assert run_cli("push", url, "--cache-dir", str(root)).returncode == 0
    for args in (("rm", "-y", url, eid + "\n"), ("rm", "-y", url, " " + eid.rpartition("/")[2]),
                 ("pull", url, eid + "\r", "--cache-dir", str(other)), ("push", url, eid + "\n", "--cache-dir", str(root))):
        proc = run_cli(*args)
        assert proc.returncode == 2 and "not an entry id" in proc.stderr, (args, proc.stderr)
    listed = run_cli("ls", "-q", url)
    assert listed.stdout.split() == [eid], listed.stderr


# --- 6. small ------------------------------------------------------------------------------------

def test_a_version_the_tree_does_not_hold_names_those_it_does(root):
    write_fake_entry(root, flashinfer_version="0.7.2.post1")
    proc = run_cli("ls", "--flashinfer-version", "0.7.2", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert "no entry under 0.7.2" in proc.stderr and "0.7.2.post1" in proc.stderr, proc.stderr


def test_a_misspelled_arch_lists_the_accepted_forms(root):
    write_fake_entry(root)
    proc = run_cli("ls", "--arch", "sm_90", "--cache-dir", str(root))
    one_line_usage_error(proc)
    assert "sm90" in proc.stderr and "sm100a" in proc.stderr and "did you mean sm90" in proc.stderr, proc.stderr


# --- 5. access times that cannot be trusted ------------------------------------------------------

def _times(root, eid, *, used_s_ago: float, modified_days_ago: float) -> None:
    now = time.time()
    for p in entry_path(root, eid).iterdir():
        os.utime(p, (now - used_s_ago, now - modified_days_ago * 86400))


def _three(root):
    return [write_fake_entry(root, fields=default_fields(m, tp=2, dp=1)) for m in ("A", "B", "C")]


def test_access_times_left_by_a_copy_are_not_taken_for_use(root):
    """rsync (and a restore) leaves every entry read within seconds of the others, however far
    apart they were written: "last used" would then rank a 60-day-old entry as fresh as one
    the engine reads every day. ls says so; --max-size evicts by last write and says it."""
    a, b, c = _three(root)
    _times(root, a, used_s_ago=1, modified_days_ago=60)
    _times(root, b, used_s_ago=2, modified_days_ago=1)
    _times(root, c, used_s_ago=3, modified_days_ago=30)  # the copy read it first
    listed = run_cli("ls", "--json", "--cache-dir", str(root))
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["atime"]["trusted"] is False
    assert "access times" in listed.stderr and "within" in listed.stderr, listed.stderr
    human = run_cli("ls", "--cache-dir", str(root))
    assert "access times" in human.stderr, human.stderr
    size = sum(e["size_on_disk"] for e in json.loads(listed.stdout)["entries"])
    proc = run_cli("prune", "--max-size", f"{size - 1}B", "--dry-run", "--json", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    (picked,) = json.loads(proc.stdout)["plan"]["entries"]
    assert picked["id"] == str(a), picked  # the oldest write, not the "least recently used" copy order
    assert "last write" in proc.stderr, proc.stderr
    proc = run_cli("prune", "--unused-for", "1s", "--dry-run", "--json", "--cache-dir", str(root))
    assert proc.returncode == 0 and json.loads(proc.stdout)["plan"]["entries"] == []
    assert "--older-than" in proc.stderr, proc.stderr


def test_access_times_spread_like_use_are_trusted(root):
    a, b, c = _three(root)
    _times(root, a, used_s_ago=5 * 86400, modified_days_ago=60)
    _times(root, b, used_s_ago=3600, modified_days_ago=1)
    _times(root, c, used_s_ago=20 * 86400, modified_days_ago=30)
    listed = run_cli("ls", "--json", "--cache-dir", str(root))
    assert json.loads(listed.stdout)["atime"] == {"trusted": True, "why": None}
    assert "access times" not in listed.stderr
    size = sum(e["size_on_disk"] for e in json.loads(listed.stdout)["entries"])
    plan = run_json("prune", "--max-size", f"{size - 1}B", "--dry-run", "--cache-dir", str(root))
    assert [e["id"] for e in plan["plan"]["entries"]] == [str(c)]  # least recently used


def test_a_noatime_mount_is_named(tmpfs):
    mnt = tmpfs("8m", "noatime")
    write_fake_entry(mnt)
    listed = run_cli("ls", "--json", "--cache-dir", str(mnt))
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["atime"]["trusted"] is False
    assert "noatime" in listed.stderr, listed.stderr
    proc = run_cli("prune", "--unused-for", "30d", "--dry-run", "--cache-dir", str(mnt))
    assert proc.returncode == 0 and "noatime" in proc.stderr and "--older-than" in proc.stderr, proc.stderr
