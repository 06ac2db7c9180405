"""Crash safety and concurrency with real processes, real files and SIGKILL."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import io
import time
from pathlib import Path

import pytest

from autotune_cache import layout
from autotune_cache.atomic import exchange_paths
from autotune_cache.manifest import Manifest
from autotune_cache.rankfile import parse_cache_bytes
from autotune_cache.scan import scan_cache
from autotune_cache.testing import DEFAULT_METADATA, cache_file_bytes, fake_configs, write_fake_entry

from .conftest import REPO, run_cli, run_json


def worker(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests._workers", *map(str, args)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_every_cache_file_parses(root: Path) -> int:
    """Every rank file and manifest an engine or ls may read is whole, valid JSON."""
    checked = 0
    for p in layout.autotune_dir(root).rglob("*.json"):
        if layout.TEMP_FILE_RE.match(p.name) or any(layout.STAGE_DIR_RE.match(part) for part in p.parts):
            continue  # hidden temp/staging names are never read by engines; prune cleans them
        data = p.read_bytes()
        if p.name == layout.MANIFEST_NAME:
            Manifest.from_bytes(data)
        else:
            parse_cache_bytes(data)
        checked += 1
    return checked


def test_eight_processes_write_prune_import_concurrently(tmp_path):
    root = tmp_path / "tree"
    src = tmp_path / "src"
    assert worker("seed", src).wait() == 0
    archive = tmp_path / "a.tar.gz"
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(src)).returncode == 0
    rounds = 30
    procs = (
        [worker("writer", root, rounds, i) for i in range(3)]
        + [worker("pruner", root, rounds * 2, i) for i in range(2)]
        + [worker("importer", root, rounds, archive, i) for i in range(3)]
    )
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    assert assert_every_cache_file_parses(root) > 0
    info = scan_cache(root)
    # Three keys were written complete by every writer and importer; pruners only remove
    # incomplete/corrupt/diverged entries: all three must have survived, complete.
    assert len(info.entries) == 3
    assert {e.status for e in info.entries} == {"complete"}, [(e.id, e.problems) for e in info.entries]
    assert info.stale_temp == ()


def test_sigkilled_writer_never_leaves_an_unparseable_file(tmp_path):
    root = tmp_path / "tree"
    rng = random.Random(7)
    kills = 20
    a, b = tmp_path / "probe-a", tmp_path / "probe-b"
    a.mkdir(), b.mkdir()
    swap_supported = exchange_paths(a, b)
    for i in range(kills):
        p = worker("forever", root, 0, i)
        assert p.stdout.readline().strip() == "started"
        time.sleep(rng.uniform(0.0, 0.25))
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert_every_cache_file_parses(root)
        if swap_supported:
            # Each commit is one rename or one RENAME_EXCHANGE: never a partial rank set.
            assert all(e.status == "complete" for e in scan_cache(root).entries)
    info = scan_cache(root)
    assert info.entries, "the writer never got to write anything"
    # Leftover temp files / staging dirs from the kills are cleaned once they are old enough.
    leftovers = info.stale_temp
    old = time.time() - 7200
    for f in leftovers:
        os.utime(f.path, (old, old), follow_symlinks=False)
    proc = run_cli("prune", "--status", "corrupt", "-y", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert scan_cache(root).stale_temp == ()
    assert [e.id for e in scan_cache(root).entries] == [e.id for e in info.entries]


def test_ctrl_c_during_commit_is_deferred_until_the_entry_is_whole(tmp_path):
    """SIGINT arriving mid-commit is held by deferred_signals: the entry lands whole, then the process stops."""
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "import autotune_cache.writer as w\n"
        "from autotune_cache.testing import write_fake_entry\n"
        "orig = w._write_plain\n"
        "def interrupted(path, data):\n"
        "    if path.name == 'rank_tp1_pp0_dp1.json': os.kill(os.getpid(), signal.SIGINT)\n"
        "    return orig(path, data)\n"
        "w._write_plain = interrupted\n"
        "write_fake_entry(Path(sys.argv[1]), seed=1)\n"
        "print('not reached')\n"
    )
    root = tmp_path / "tree"
    proc = subprocess.run([sys.executable, "-c", code, str(root)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr and "not reached" not in proc.stdout
    (e,) = scan_cache(root).entries
    assert e.status == "complete" and e.manifest is not None
    assert scan_cache(root).stale_temp == ()


def _hostile_tree(root: Path, outside: Path) -> dict:
    good = write_fake_entry(root, seed=1)
    bad = write_fake_entry(root, flashinfer_version="0.7.1", seed=2)
    bdir = layout.key_dir(root, bad.flashinfer_version, bad.arch, bad.key)
    (bdir / "rank_tp0_pp0_dp0.json").write_bytes((bdir / "rank_tp1_pp0_dp1.json").read_bytes()[:500])  # truncated
    (bdir / "rank_tp1_pp0_dp1.json").write_text(json.dumps({"hello": "world"}))  # JSON, not a cache
    (bdir / "notes.txt").write_text("mine, not fi-autotune's")  # foreign
    unreadable = bdir / "rank_tp2_pp0_dp2.json"
    unreadable.write_text("{not json")
    unreadable.chmod(0)
    (bdir / "rank_tp3_pp0_dp3.json").unlink()
    (bdir / "rank_tp3_pp0_dp3.json").symlink_to(outside / "target.json")  # symlink out of the tree
    (bdir / "rank_tp4_pp0_dp4.json").unlink()
    os.mkfifo(bdir / "rank_tp4_pp0_dp4.json")  # reading would block forever
    (bdir / "rank_tp5_pp0_dp5.json").unlink()
    (bdir / "rank_tp5_pp0_dp5.json").mkdir()
    vdir = layout.autotune_dir(root) / "0.7.1"
    (vdir / "README").write_text("foreign file at version level")
    (vdir / "sm90").symlink_to(outside, target_is_directory=True)  # symlinked arch dir pointing out
    (layout.autotune_dir(root) / "0.7.1" / "sm100" / "not-a-key").mkdir()
    return {"good": good, "bad": bad, "bdir": bdir}


def test_ls_and_prune_survive_a_hostile_tree(tmp_path):
    root = tmp_path / "tree"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.json").write_bytes(cache_file_bytes(DEFAULT_METADATA, fake_configs()))
    (outside / "precious").write_text("do not touch")
    outside_before = {p.name: p.read_bytes() for p in outside.iterdir()}
    t = _hostile_tree(root, outside)

    proc = run_cli("ls", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    for needle in ("notes.txt", "symlink", "README", "not-a-key", "invalid JSON", "not a FlashInfer cache", "not a regular file"):
        assert needle in proc.stderr, needle
    data = run_json("ls", "--cache-dir", str(root))
    status = {e["id"]: e["status"] for e in data["entries"]}
    assert status == {str(t["good"]): "complete", str(t["bad"]): "corrupt"}

    notes = (t["bdir"] / "notes.txt").stat().st_size
    ours = sum(p.stat().st_size for p in t["bdir"].iterdir() if p.is_file() and not p.is_symlink() and p.name != "notes.txt"
               and p.stat().st_mode & 0o170000 == 0o100000)
    pruned = run_json("prune", "--status", "corrupt", "-y", "--cache-dir", str(root))
    assert pruned["result"]["deleted"] == [str(t["bad"])]
    # what it promised and what it freed are ours only: the foreign notes.txt stays and is not counted
    assert pruned["plan"]["expected_freed_size"] == pruned["result"]["freed"] == ours and notes > 0
    bdir = t["bdir"]
    remaining = sorted(p.name for p in bdir.iterdir())
    # ours (regular files in our names) are gone; foreign, symlink, FIFO and dir stay
    assert remaining == ["notes.txt", "rank_tp3_pp0_dp3.json", "rank_tp4_pp0_dp4.json", "rank_tp5_pp0_dp5.json"]
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == outside_before
    assert (layout.autotune_dir(root) / "0.7.1" / "README").exists()
    assert run_cli("ls", "-q", "--cache-dir", str(root)).stdout.split() == sorted([t["good"].key, t["bad"].key])


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _reg(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


GOOD = cache_file_bytes(DEFAULT_METADATA, fake_configs(buckets=(1, 2)))
PREFIX = "flashinfer/autotune/0.7.2.post1/sm90/0123456789abcdef/"


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, None


@pytest.mark.parametrize("case,members", [
    ("traversal", [_reg(PREFIX + "rank_tp0_pp0_dp0.json", GOOD), _reg("flashinfer/autotune/../../evil.json", GOOD)]),
    ("traversal-deep", [_reg(PREFIX + "../../../../../evil.json", GOOD)]),
    ("absolute", [_reg("/tmp/evil.json", GOOD)]),
    ("symlink", [_special(PREFIX + "rank_tp0_pp0_dp0.json", tarfile.SYMTYPE, "/etc/passwd")]),
    ("hardlink", [_reg(PREFIX + "rank_tp0_pp0_dp0.json", GOOD), _special(PREFIX + "rank_tp1_pp0_dp0.json", tarfile.LNKTYPE, PREFIX + "rank_tp0_pp0_dp0.json")]),
    ("device", [_special(PREFIX + "rank_tp0_pp0_dp0.json", tarfile.CHRTYPE)]),
    ("oversized", [_reg(PREFIX + "rank_tp0_pp0_dp0.json", b" " * (64 * 1024 * 1024 + 1))]),
    ("foreign-name", [_reg(PREFIX + "evil.sh", b"#!/bin/sh\n")]),
    ("not-json", [_reg(PREFIX + "rank_tp0_pp0_dp0.json", GOOD), _reg(PREFIX + "rank_tp1_pp0_dp0.json", b"{oops")]),
    ("not-a-cache", [_reg(PREFIX + "rank_tp0_pp0_dp0.json", b'{"a": 1}')]),
    ("bad-key-dir", [_reg("flashinfer/autotune/0.7.2.post1/sm90/NOTAKEY/rank_tp0_pp0_dp0.json", GOOD)]),
])
def test_hostile_archive_is_rejected_and_nothing_is_written(tmp_path, case, members):
    archive = _tar(tmp_path / f"{case}.tar.gz", members)
    dest = tmp_path / "dest"
    proc = run_cli("import", str(archive), "--cache-dir", str(dest))
    assert proc.returncode == 1, (case, proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not dest.exists() or not any(p.is_file() for p in dest.rglob("*"))
    assert not list(tmp_path.rglob("evil*"))


def test_archive_with_forged_manifest_key_is_rejected(tmp_path):
    src = tmp_path / "src"
    eid = write_fake_entry(src)
    kdir = layout.key_dir(src, eid.flashinfer_version, eid.arch, eid.key)
    m = json.loads((kdir / layout.MANIFEST_NAME).read_text())
    m["key_fields"]["model_path"] = "someone/else"
    members = [_reg(f"flashinfer/autotune/{eid}/{p.name}", p.read_bytes()) for p in kdir.glob("rank_*.json")]
    members.append(_reg(f"flashinfer/autotune/{eid}/{layout.MANIFEST_NAME}", json.dumps(m).encode()))
    proc = run_cli("import", str(_tar(tmp_path / "f.tar.gz", members)), "--cache-dir", str(tmp_path / "dest"))
    assert proc.returncode == 1 and "key does not match" in proc.stderr
    assert not (tmp_path / "dest").exists()


def test_not_an_archive(tmp_path):
    f = tmp_path / "x.tar.gz"
    f.write_bytes(b"definitely not gzip")
    proc = run_cli("import", str(f), "--cache-dir", str(tmp_path / "d"))
    assert proc.returncode == 1 and "cannot read" in proc.stderr
