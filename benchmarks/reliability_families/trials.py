"""The tree trials: concurrency, kills at random times and at exact steps, malformed trees, hostile archives."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from .common import REPO, Row, SG, TIMEOUT, cli, corrupt_files, leftovers, seeded, statuses

from autotune_cache.tree.layouts.own_names import MANIFEST_NAME
from tests.standins.fault_cli import crash_at
from devtools.synthetic import DEFAULT_METADATA, cache_file_bytes, default_fields, fake_configs, write_fake_entry


def concurrency(tmp: Path, rounds: int) -> Row:
    row = Row()
    src = tmp / "conc-src"
    subprocess.run([sys.executable, "-m", "devtools.workers", "seed", str(src)], cwd=REPO, check=True)
    archive = tmp / "conc.tgz"
    assert cli("export", "-o", archive, "--cache-dir", src).returncode == 0
    expected = sorted(statuses(src, row))
    for r in range(rounds):
        root = tmp / f"conc-{r}"
        procs = ([("writer", 3, i) for i in range(3)] + [("pruner", 4, i) for i in range(2)]
                 + [("importer", 3, i) for i in range(3)])
        running = [subprocess.Popen([sys.executable, "-m", "devtools.workers", mode, str(root), str(n),
                                     *([str(archive)] if mode == "importer" else []), f"{r}-{i}"],
                                    cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for mode, n, i in procs]
        for p in running:
            row["attempts"] += 1
            try:
                _, err = p.communicate(timeout=TIMEOUT)
                if b"Traceback" in err:
                    row.fail("tracebacks", f"round {r}: {err.decode(errors='replace')[-600:]}")
            except subprocess.TimeoutExpired:
                p.kill()
                row["hangs"] += 1
        row["corrupt"] += corrupt_files(root)
        now = statuses(root, row)
        row["lost"] += len(set(expected) - set(now))
        row["half"] += sum(1 for s in now.values() if s != "complete")
        row["leftovers"] += leftovers(root)
        shutil.rmtree(root, ignore_errors=True)
    return row

def kill_at_random(tmp: Path, kills: int, rng: random.Random) -> Row:
    row = Row()
    _, archive, eids = seeded(tmp, 30, "rand")
    prune_src = tmp / "prune-src"
    for i in range(kills):
        kind = ("import", "prune", "writer")[i % 3]
        root = tmp / f"kill-{i}"
        row["attempts"] += 1
        if kind == "import":
            argv = ["import", str(archive), "--cache-dir", str(root)]
        elif kind == "prune":
            if not prune_src.exists():
                for j in range(6):
                    write_fake_entry(prune_src, fields=default_fields(f"p{j}", tp=4, dp=4), flashinfer_version="0.7.1")
            shutil.copytree(prune_src, root, symlinks=True)
            argv = ["prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", str(root)]
        else:
            argv = None
        if argv is not None:
            p = subprocess.Popen([sys.executable, "-m", "fi_autotune_cli", *argv], cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        else:
            p = subprocess.Popen([sys.executable, "-m", "devtools.workers", "forever", str(root), "0", str(i)], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            p.stdout.readline()
        time.sleep(rng.uniform(0.05, 0.9 if kind == "import" else 0.5))
        p.send_signal(signal.SIGKILL)
        if p.wait() == -signal.SIGKILL:
            row["kills"] += 1
        row["corrupt"] += corrupt_files(root)
        if kind == "import" and root.exists():
            finish_with_a_writer(root, row, "import at a random time")  # ls changes nothing; a writer finishes
        now = statuses(root, row)
        if kind == "import":
            if sorted(now) not in ([], eids):
                row["half"] += 1
            row.proc(cli("import", archive, "--cache-dir", root))
            now = statuses(root, row)
            row["lost"] += len(set(eids) - set(now))
        elif kind == "prune":
            row["half"] += sum(1 for s in now.values() if s != "complete")
            row.proc(cli("prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", root))
            row["lost"] += 0
            if statuses(root, row):
                row["half"] += 1  # the re-run must finish the job
        else:
            row["half"] += sum(1 for s in now.values() if s != "complete")
            row.proc(cli("prune", "--status", "corrupt", "-y", "--cache-dir", root))
        row["leftovers"] += leftovers(root)
        shutil.rmtree(root, ignore_errors=True)
    return row

CRASH_POINTS = [("txn.staged_file:3", False), ("txn.journaled", False), ("txn.exchanged:1", False),
                ("txn.exchanged:2", False), ("txn.swapped:2", False), ("txn.unjournaled", False),
                ("txn.between_renames:1", True), ("txn.between_renames:3", True)]

def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    return {str(q.relative_to(root)): (q.lstat().st_size, q.lstat().st_mtime_ns) for q in sorted(root.rglob("*"))}

def finish_with_a_writer(root: Path, row: Row, point: str) -> None:
    """Readers never write (issue 33): ``ls`` over what a kill left must change nothing; the next
    writer (a prune that selects nothing) finishes it, and then the tree is judged."""
    if not root.exists():
        return
    before = tree_state(root)
    statuses(root, row)
    if tree_state(root) != before:
        row.fail("half", f"{point}: ls wrote to the tree")
    row.proc(cli("prune", "--older-than", "36500d", "-y", "--cache-dir", root))

def kill_at_steps(tmp: Path, repeats: int) -> Row:
    row = Row()
    _, archive, eids = seeded(tmp, 5, "step")
    for rep in range(repeats):
        for point, no_exchange in CRASH_POINTS:
            root = tmp / f"step-{rep}-{point.replace(':', '_')}"
            for i in range(3):  # old versions of three of the archive's entries are there
                write_fake_entry(root, fields=default_fields(f"org/step{i}", tp=2, dp=2), arch="sm90", seed=50 + i,
                                 buckets=(1, 2))
            before = statuses(root, row)
            row["attempts"] += 1
            p = row.proc(cli("import", archive, "--force", "--cache-dir", root,
                             launcher=crash_at(point, no_exchange=no_exchange)))
            if p is not None and p.returncode != -signal.SIGKILL:
                row.fail("half", f"{point}: never reached (exit {p.returncode})")  # the trial would prove nothing
            elif p is not None:
                row["kills"] += 1
            row["corrupt"] += corrupt_files(root)
            finish_with_a_writer(root, row, point)
            now = statuses(root, row)
            all_new = sorted(now) == eids
            none_new = now == before and _old_content(root)
            if not (all_new or none_new):
                row.fail("half", f"{point}: {len(now)} entries after the kill")
            row.proc(cli("import", archive, "--force", "--cache-dir", root))
            row["lost"] += len(set(eids) - set(statuses(root, row)))
            row["leftovers"] += leftovers(root)
            shutil.rmtree(root, ignore_errors=True)
        for n in (1, 3):  # prune killed after its n-th one-step delete
            root = tmp / f"step-prune-{rep}-{n}"
            for j in range(4):
                write_fake_entry(root, fields=default_fields(f"d{j}", tp=4, dp=4), flashinfer_version="0.7.1")
            row["attempts"] += 1
            p = row.proc(cli("prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", root,
                             launcher=crash_at(f"prune.renamed:{n}")))
            row["kills"] += p is not None and p.returncode == -signal.SIGKILL
            now = statuses(root, row)
            row["half"] += sum(1 for s in now.values() if s != "complete")
            if len(now) != 4 - n:
                row["half"] += 1
            row.proc(cli("prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", root))
            row["leftovers"] += leftovers(root)
            shutil.rmtree(root, ignore_errors=True)
    return row

def _old_content(root: Path) -> bool:
    for p in SG.base(root).glob("[!.]*/[!.]*/[!.]*/rank_tp0_pp0_dp0.json"):
        keys = [k for k in json.loads(p.read_text()) if not k.startswith("_")]
        if len(keys) != 6:
            return False
    return True

def malformed_trees(tmp: Path) -> Row:
    row = Row()
    cases = _malformed_cases()
    for name, make in cases:
        root = tmp / f"bad-{name}"
        make(root)
        archive = tmp / "m.tgz"
        commands = [["ls"], ["ls", "--json"], ["show", "0.7.2.post1/sm100/d99390dfa961185d"],
                    ["prune", "--status", "corrupt", "--dry-run"], ["prune", "--status", "corrupt", "-y"],
                    ["rm", "0.7.2.post1/sm100/d99390dfa961185d", "--dry-run"], ["export", "-o", archive],
                    ["import", tmp / "good.tgz"]]
        for cmd in commands:
            row["attempts"] += 1
            p = row.proc(cli(*cmd, "--cache-dir", root))
            if p is not None and p.returncode not in (0, 1, 2):
                row["tracebacks"] += 1
        shutil.rmtree(root, ignore_errors=True)
    return row

def _malformed_cases():
    def base(root):
        return write_fake_entry(root)

    def edit_manifest(fn):
        def make(root):
            eid = base(root)
            p = SG.entry_dir(root, eid) / MANIFEST_NAME
            m = json.loads(p.read_text())
            fn(m)
            p.write_text(json.dumps(m))
        return make

    def raw_manifest(data: bytes):
        def make(root):
            eid = base(root)
            (SG.entry_dir(root, eid) / MANIFEST_NAME).write_bytes(data)
        return make

    def rank(name: str, data: bytes | None = None, kind: str = "file"):
        def make(root):
            eid = base(root)
            p = SG.entry_dir(root, eid) / name
            if p.exists():
                p.unlink()
            if kind == "fifo":
                os.mkfifo(p)
            elif kind == "dir":
                p.mkdir()
            elif kind == "symlink":
                p.symlink_to("/etc/hostname")
            else:
                p.write_bytes(data or b"")
        return make

    def tree(fn):
        def make(root):
            base(root)
            fn(SG.base(root))
        return make

    cases = [
        ("rank-files-list", edit_manifest(lambda m: m.__setitem__("rank_files", ["x"]))),
        ("rank-files-str", edit_manifest(lambda m: m.__setitem__("rank_files", "x"))),
        ("tp-huge", edit_manifest(lambda m: m["topology"].__setitem__("tp", 10**9))),
        ("dp-zero", edit_manifest(lambda m: m["topology"].__setitem__("dp", 0))),
        ("key-fields-null", edit_manifest(lambda m: m.__setitem__("key_fields", None))),
        ("format-99", edit_manifest(lambda m: m.__setitem__("format", 99))),
        ("format-str", edit_manifest(lambda m: m.__setitem__("format", "2"))),
        ("metadata-list", edit_manifest(lambda m: m.__setitem__("flashinfer_metadata", [1]))),
        ("record-negative", edit_manifest(lambda m: next(iter(m["rank_files"].values())).__setitem__("size", -1))),
        ("manifest-nested", raw_manifest(b"[" * 100_000 + b"]" * 100_000)),
        ("manifest-empty", raw_manifest(b"")),
        ("manifest-binary", raw_manifest(os.urandom(4096))),
        ("manifest-huge-int", raw_manifest(b'{"tool":"fi-autotune","format":' + b"9" * 5000 + b"}")),
        ("rank-nested", rank("rank_tp1_pp0_dp1.json", b"[" * 100_000 + b"]" * 100_000)),
        ("rank-empty", rank("rank_tp1_pp0_dp1.json", b"")),
        ("rank-not-cache", rank("rank_tp1_pp0_dp1.json", b'{"a": 1}')),
        ("rank-value-wrong", rank("rank_tp1_pp0_dp1.json", b'{"k": 5}')),
        ("rank-fifo", rank("rank_tp2_pp0_dp2.json", kind="fifo")),
        ("rank-dir", rank("rank_tp2_pp0_dp2.json", kind="dir")),
        ("rank-symlink", rank("rank_tp2_pp0_dp2.json", kind="symlink")),
        ("rank-huge-index", rank("rank_tp99999999_pp0_dp0.json", cache_file_bytes(DEFAULT_METADATA, {}))),
        ("rank-huge-key", rank("rank_tp1_pp0_dp1.json", cache_file_bytes(DEFAULT_METADATA, {"(" * 9000: ["R", 1]}))),
        ("version-file", tree(lambda b: (b / "0.7.0").write_text("x"))),
        ("version-symlink", tree(lambda b: (b / "0.7.0").symlink_to("/tmp"))),
        ("arch-fifo", tree(lambda b: os.mkfifo(b / "0.7.2.post1" / "sm90"))),
        ("key-file", tree(lambda b: (b / "0.7.2.post1" / "sm100" / "0123456789abcdef").write_text("x"))),
        ("journal-garbage", tree(lambda b: ((b / ".fi-autotune-journal").mkdir(exist_ok=True), (b / ".fi-autotune-journal" / "0123456789ab-1.json").write_text("{")))),
        ("stage-garbage", tree(lambda b: (b / "0.7.2.post1" / "sm100" / ".fi-autotune-stage-0123456789ab-x").mkdir())),
        ("trash-garbage", tree(lambda b: (b / "0.7.2.post1" / "sm100" / ".fi-autotune-trash-0123456789ab-x").mkdir())),
        ("locks-file", tree(lambda b: (shutil.rmtree(b / ".fi-autotune-locks"), (b / ".fi-autotune-locks").write_text("x")))),
        ("unicode-names", tree(lambda b: (b / "0.7.2.post1" / "sm100" / "ключ").mkdir())),
    ]
    return cases

def hostile_archives(tmp: Path, rng: random.Random, n: int) -> Row:
    row = Row()
    good = cache_file_bytes(DEFAULT_METADATA, fake_configs(buckets=(1, 2)))
    prefix = "flashinfer/autotune/0.7.2.post1/sm90/0123456789abcdef/"

    def reg(name, data):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        return info, data

    builders = [
        lambda: [reg(prefix + "rank_tp0_pp0_dp0.json", good), reg("flashinfer/autotune/../../evil.json", good)],
        lambda: [reg("/tmp/evil.json", good)],
        lambda: [reg(prefix + "../../../evil.json", good)],
        lambda: [reg(prefix + "rank_tp0_pp0_dp0.json", b" " * rng.randrange(9 << 20, 12 << 20) + good)],
        lambda: [reg(prefix + f"rank_tp{rng.randrange(10**6, 10**12)}_pp0_dp0.json", good)],
        lambda: [reg(prefix + "rank_tp0_pp0_dp0.json", good[: rng.randrange(1, len(good))])],
        lambda: [reg(prefix + "rank_tp0_pp0_dp0.json", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 2000))))],
        lambda: [reg(prefix + MANIFEST_NAME, json.dumps({"tool": "fi-autotune", "format": 2, "rank_files": []}).encode()),
                 reg(prefix + "rank_tp0_pp0_dp0.json", good)],
        lambda: [reg(prefix + "evil.sh", b"#!/bin/sh")],
        lambda: [reg(prefix + f"rank_tp{i}_pp0_dp0.json", good[:-2] + b" " * (3 << 20) + good[-2:]) for i in range(4)],
    ]
    for i in range(n):
        members = builders[i % len(builders)]()
        archive = tmp / f"hostile-{i}.tgz"
        with tarfile.open(archive, "w:gz") as tar:
            for info, data in members:
                tar.addfile(info, io.BytesIO(data))
        dest = tmp / f"hostile-dest-{i}"
        row["attempts"] += 1
        p = row.proc(cli("import", archive, "--cache-dir", dest))
        installed = sum(1 for q in dest.rglob("rank_*")) if dest.exists() else 0
        if p is not None and (p.returncode != 1 or installed):
            row.fail("half", f"hostile {i % len(builders)}: exit {p.returncode}, {installed} files: {p.stderr[-200:]!r}")
        row["leftovers"] += leftovers(dest)
        if list(tmp.rglob("evil*")):
            row["corrupt"] += 1
        shutil.rmtree(dest, ignore_errors=True)
    return row
