"""Reliability trials of the tree and store commands, counted: real processes, real kills, real files.

    python benchmarks/reliability.py                  # the tree trials: >= 100 kills, >= 50 rounds
    python benchmarks/reliability.py --short          # what CI runs (tests/tree/crashsafe/test_stress.py)
    python benchmarks/reliability.py --long           # every attack (about 25 min on 2 cores)
    python benchmarks/reliability.py --long --quick   # a few points of each family (development)
    python benchmarks/reliability.py --long --only "exact syscall kills: rm,HTTP"   # rows by substring

Trials, each a row of the table:

* concurrency: rounds of 8 processes (3 writers, 2 pruners, 3 importers) on one tree;
* kill at random times: ``import`` of a 30-entry archive, ``prune`` of 6 entries and a ``warm``-like
  writer, each SIGKILLed after a random delay, then checked with ``ls`` (which finishes any
  interrupted write) and repaired by re-running the command;
* kill at exact steps: every crash point of the write and delete paths
  (run through tests/standins/fault_cli.py), with and without ``RENAME_EXCHANGE``;
* malformed trees x 8 commands; hostile archives.

``--long`` adds (each a row, or a row per command):

* exact syscall kills: push, pull, import, export, convert, rm, prune, rm URL and prune URL
  (file:// store), each killed by ``strace -f -e inject=SYSCALL:signal=SIGKILL:when=N`` at every
  mutating syscall it makes on its own files (rename*, unlink*, rmdir, mkdir, link, write, fsync,
  ftruncate, openat for writing; listed by a dry run under strace; at most 38 per command,
  spread), each kill checked to land in the syscall aimed at; then the state checked, the same
  command run again, and the end state checked;
* hostile HTTP servers on loopback (``--timeout 1``): silent, trickling (inside and past the
  timeout), garbage bodies and status lines, not HTTP at all, endless bodies, a huge
  Content-Length, a gzip bomb, redirects to file://, in a loop and to another entry's object, a
  404 bundle; on the marker, one record, one bundle or the directory listing; each x ``ls URL``,
  ``pull URL``, ``pull URL ID``;
* look-alike names (newline, space, tab, CR, case, non-ASCII digits) in the sglang, vllm and
  flashinfer-v2 layouts: as dirs next to the real entry, and given to rm, show, export, pull URL;
* swapped and edited index records (file:// and a real S3 server, moto) x ls, pull, pull ID,
  rm URL ID, prune URL;
* archives with symlinks, hardlinks, device nodes, FIFOs, ``..``, absolute and sparse members,
  given to import and, as a bundle with its true sha256, to pull;
* 8 commands at once on one tree and one store (import, import --force, push, pull, rm, prune,
  export, rm URL), 3 of them SIGKILLed at random times, each killed one run again.

Columns (every failure column is a count of findings; the target is zero in each):

* attempts: commands run (for a kill: one kill point, its checks and its re-run count once);
* kills: attempts whose process died by SIGKILL (sent by us, by tests/standins/fault_cli.py's crash point, or by
  strace at the syscall aimed at);
* corrupt: a file a reader would take as finished that does not verify or parse: a rank file or
  manifest in a tree (not a temp, stage or trash name), a file of FlashInfer's managed store, a
  store index record that is not JSON, a bundle whose sha256 is not its name; or ``ls URL``
  failing on the store;
* lost: an entry complete before the command, not asked to be deleted, that is gone (or no
  longer complete) after the kill or after the re-run; in a store, no longer listed by ``ls URL``;
* half: something partly done visible as done: an entry ``ls`` lists as other than complete, some
  but not all entries of an all-or-none import or pull, a store record whose bundle is not
  there, a partial archive at export's output name, a pull that failed and installed anything;
* leftovers: what the killed command left that is still there after its re-run finished: trash,
  stage or journal dirs in a tree, our temp files (``.tmp-*`` in a file:// store,
  ``.fi-autotune-*.tmp`` in FlashInfer's store, temp files next to export's output), bundles that
  no index record names;
* unfinished: the re-run of a killed command exits non-zero, or leaves undone what it was asked
  (named or selected entries still there, no whole archive); at most one per attempt;
* tracebacks: a Python traceback on stderr (for the malformed trees also an exit status other
  than 0, 1, 2);
* hangs: a command still running past its limit (60 s; 30 s against a hostile server), or holding
  more than 1 GiB resident (then killed);
* wrong deletes: a delete that removed what it was not asked to: the real entry or a look-alike
  dir when a look-alike name was given (or by ``prune --status corrupt``), another entry's record
  or bundle in a store, anything outside the store;
* escapes: a file written or changed outside the command's destination (a victim dir next to the
  tree or store, the target of a link, ``..`` or absolute member, or of a file:// redirect);
* wrong installs: an entry installed, exported or shown that is not the one named, or whose bytes
  are not the honest entry's: a hostile archive or bundle that installed anything, a pulled entry
  whose rank files differ from those pushed under its id, a look-alike name that resolved (exit
  0), ``ls`` listing a look-alike dir.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import http.server
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autotune_cache.registry import default_layout  # noqa: E402
from autotune_cache.tree.layouts.own_names import MANIFEST_NAME, STAGE_DIR_RE, TEMP_FILE_RE, TRASH_DIR_RE  # noqa: E402
from autotune_cache.tree.manifest import Manifest  # noqa: E402
from autotune_cache.autotuner.rankfile import parse_cache_bytes  # noqa: E402
from tests.standins.fault_cli import crash_at  # noqa: E402
from devtools.synthetic import (DEFAULT_METADATA, cache_file_bytes, default_fields, fake_configs, write_fake_entry,  # noqa: E402
                             write_vllm_entry)  # noqa: E402

SG = default_layout()
COLUMNS = ("attempts", "kills", "corrupt", "lost", "half", "leftovers", "unfinished", "tracebacks", "hangs",
           "wrong deletes", "escapes", "wrong installs")
FAILURES = COLUMNS[2:]
TIMEOUT = 60


def cli(*args, env=None, input=None, launcher=None) -> subprocess.CompletedProcess | None:
    """``fi-autotune ARGS`` in a process; ``launcher``: the command to run it with instead (``crash_at``)."""
    try:
        return subprocess.run([*(launcher or [sys.executable, "-m", "fi_autotune_cli"]), *map(str, args)], cwd=REPO,
                              capture_output=True, env={**os.environ, **(env or {})}, input=input, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return None


class Row(dict):
    def __init__(self):
        super().__init__({c: 0 for c in COLUMNS})
        self.details: list[str] = []

    def fail(self, column: str, what: str, n: int = 1) -> None:
        if n:
            self[column] += n
            self.details.append(f"{column}: {what}")

    def proc(self, p: subprocess.CompletedProcess | None) -> subprocess.CompletedProcess | None:
        if p is None:
            self.fail("hangs", "a command ran past the timeout")
        elif b"Traceback" in (p.stderr or b""):
            self.fail("tracebacks", p.stderr.decode(errors="replace")[-600:])
        return p


def corrupt_files(root: Path) -> int:
    bad = 0
    base = SG.base(root)
    if not base.exists():
        return 0
    for p in base.rglob("*.json"):
        if TEMP_FILE_RE.match(p.name) or ".fi-autotune-journal" in p.parts \
                or any(STAGE_DIR_RE.match(x) or TRASH_DIR_RE.match(x) for x in p.parts):
            continue
        try:
            data = p.read_bytes()
            (Manifest.from_bytes if p.name == MANIFEST_NAME else parse_cache_bytes)(data)
        except (OSError, ValueError):
            bad += 1
    return bad


def leftovers(root: Path) -> int:
    base = SG.base(root)
    if not base.exists():
        return 0
    return sum(1 for p in base.rglob("*") if STAGE_DIR_RE.match(p.name) or TRASH_DIR_RE.match(p.name)
               or p.parent.name == ".fi-autotune-journal")


def statuses(root: Path, row: Row) -> dict[str, str]:
    if not root.exists():
        return {}
    p = row.proc(cli("ls", "--json", "--cache-dir", root))
    if p is None or p.returncode != 0:
        return {}
    return {e["id"]: e["status"] for e in json.loads(p.stdout)["entries"]}


def seeded(tmp: Path, n: int, tag: str, tp: int = 2) -> tuple[Path, Path, list[str]]:
    src = tmp / f"src-{tag}"
    eids = [str(write_fake_entry(src, fields=default_fields(f"org/{tag}{i}", tp=tp, dp=tp), arch="sm90", seed=i,
                                 buckets=(1, 2, 4, 8))) for i in range(n)]
    archive = tmp / f"{tag}.tgz"
    assert cli("export", "-o", archive, "--cache-dir", src).returncode == 0
    return src, archive, sorted(eids)


# --- trials -------------------------------------------------------------------------------------

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


# (crash point, without RENAME_EXCHANGE)
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


# --- kills at exact syscalls (strace) --------------------------------------------------------------
#
# Each case is set up once as a template dir; a dry run under strace lists every mutating syscall
# the command makes on the case's own files (rename*, unlink*, rmdir, mkdir, link, write, fsync,
# ftruncate, and openat with O_CREAT/O_WRONLY/O_RDWR/O_TMPFILE), each as (syscall, its ordinal among
# that syscall's calls by the process). Then for each point: a fresh copy of the template at the
# same path, the command under ``strace -e inject=SYSCALL:signal=SIGKILL:when=N``, the checks of the
# state the kill left, the same command again, and the checks of the end state.

STRACE = shutil.which("strace") or "/usr/bin/strace"
TRACED = ("rename,renameat,renameat2,unlink,unlinkat,rmdir,mkdir,mkdirat,link,linkat,symlink,symlinkat,"
          "write,pwrite64,writev,fsync,fdatasync,ftruncate,openat")
_CALL = re.compile(r"^(\d+)\s+(\w+)\((.*)$")
_FD_FIRST = ("write", "pwrite64", "writev", "fsync", "fdatasync", "ftruncate")


def _mutating_points(log: Path, work: Path) -> list[tuple[str, int, str]]:
    """(syscall, N, the call as traced) for every mutating call of the first process on ``work``."""
    counts: dict[tuple[str, str], int] = {}
    points, main = [], None
    for line in log.read_text(errors="replace").splitlines():
        m = _CALL.match(line)
        if not m:
            continue
        pid, name, rest = m.groups()
        main = main or pid
        counts[(pid, name)] = n = counts.get((pid, name), 0) + 1
        if pid != main:
            continue
        args = rest.rsplit(") = ", 1)[0]
        if name in _FD_FIRST:
            fd = re.match(r"\d+<([^>]*)>", args)
            hit = fd is not None and fd.group(1).startswith(str(work))
        elif name == "openat":
            hit = str(work) in args and re.search(r"O_WRONLY|O_RDWR|O_CREAT|O_TMPFILE", args) is not None
        else:
            hit = str(work) in args
        if hit:
            points.append((name, n, line[len(pid):].strip()[:160]))
    return points


def _spread(points: list, cap: int) -> list:
    """At most ``cap`` points: every rename/unlink/rmdir/link/fsync first, then writes and opens
    spread evenly over the run."""
    if len(points) <= cap:
        return points
    key = [p for p in points if p[0] not in ("write", "pwrite64", "writev", "openat", "mkdir", "mkdirat")]
    rest = [p for p in points if p not in key]
    if len(key) >= cap:
        step = len(key) / cap
        return [key[int(i * step)] for i in range(cap)]
    step = len(rest) / (cap - len(key))
    chosen = key + [rest[int(i * step)] for i in range(cap - len(key))]
    return sorted(chosen, key=points.index)


def traced(argv: list, env: dict, log: Path, inject: tuple[str, int] | None = None,
           timeout: float = TIMEOUT) -> subprocess.CompletedProcess | None:
    cmd = [STRACE, "-f", "-qq", "-y", "-o", str(log), "-e", f"trace={TRACED}"]
    if inject:
        cmd += ["-e", f"inject={inject[0]}:signal=SIGKILL:when={inject[1]}"]
    try:
        return subprocess.run([*cmd, sys.executable, "-m", "fi_autotune_cli", *map(str, argv)], cwd=REPO,
                              capture_output=True, env={**os.environ, **env}, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


class ExactCase:
    """One command killed at each of its mutating syscalls. Subclasses set ``name`` and give
    ``setup(work)`` (the template, under ``work``), ``argv(work)``, ``after_kill`` and ``after_rerun``."""

    name = ""
    rerun_must_succeed = True

    def setup(self, work: Path) -> None:
        raise NotImplementedError

    def argv(self, work: Path) -> list:
        raise NotImplementedError

    def rerun_argv(self, work: Path) -> list:
        return self.argv(work)

    def after_kill(self, work: Path, row: Row, where: str) -> None:
        pass

    def after_rerun(self, work: Path, row: Row, where: str) -> None:
        pass

    def env(self, work: Path) -> dict:
        return {"XDG_CACHE_HOME": str(work / "xdg"), "FLASHINFER_AUTOTUNE_CACHE_DIR": str(work / "no-v2"),
                "FI_AUTOTUNE_STORE_TIMEOUT": "10"}


def _killed_at(log: Path) -> str | None:
    """The syscall the traced process died in (the call strace shows as ``= ?`` before the kill)."""
    last = None
    for line in log.read_text(errors="replace").splitlines():
        m = _CALL.match(line)
        if m and line.rstrip().endswith("= ?"):
            last = m.group(2)
    return last


def _one_point(case: ExactCase, template: Path, work: Path, point: tuple[str, int, str]) -> Row:
    row = Row()
    syscall, n, what = point
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(template, work, symlinks=True)
    where = f"{syscall}#{n} ({what[:110]})"
    row["attempts"] += 1
    log = work.parent / f"{work.name}.strace"
    p = row.proc(traced(case.argv(work), case.env(work), log, inject=(syscall, n)))
    if p is None:
        return row
    if p.returncode != -signal.SIGKILL:
        row.details.append(f"note: {case.name} {where}: not reached (exit {p.returncode}); checked anyway")
    else:
        row["kills"] += 1
        died = _killed_at(log)
        if died != syscall:
            row.details.append(f"note: {case.name} {where}: the kill landed in {died}")
    case.after_kill(work, row, where)
    again = row.proc(cli(*case.rerun_argv(work), env=case.env(work)))
    if again is not None and case.rerun_must_succeed and again.returncode != 0:
        row.fail("unfinished", f"{case.name} killed at {where}: the re-run exited {again.returncode}: "
                               f"{again.stderr.decode(errors='replace').strip()[-200:]}")
    case.after_rerun(work, row, where)
    row["unfinished"] = min(row["unfinished"], 1)  # one per attempt: its exit and what it left say the same
    return row


def exact_syscall_kills(tmp: Path, case: ExactCase, cap: int, jobs: int = 2) -> Row:
    """``case``'s command killed at each of its mutating syscalls (at most ``cap``, spread), ``jobs``
    points at a time (each in its own dir of the same path length: the counts do not depend on it)."""
    row = Row()
    slug = re.sub(r"\W+", "-", case.name)
    template, log = tmp / f"exact-{slug}-t", tmp / "strace.log"
    works = [tmp / f"exact-{slug}-{k}" for k in range(jobs)]
    case.setup(template)
    for _ in range(2):  # twice: the first run warms byte-code caches
        if works[0].exists():
            shutil.rmtree(works[0])
        shutil.copytree(template, works[0], symlinks=True)
        dry = traced(case.argv(works[0]), case.env(works[0]), log)
    if dry is None or dry.returncode != 0:
        row.fail("unfinished", f"{case.name}: the dry run failed: {dry and dry.stderr[-300:]!r}")
        return row
    points = _mutating_points(log, works[0])
    chosen = _spread(points, cap)
    row.details.append(f"note: {case.name}: {len(points)} mutating syscalls on its files, {len(chosen)} killed")
    def worker(k: int) -> list[Row]:  # each worker its own dir, its points one after another
        return [_one_point(case, template, works[k], pt) for pt in chosen[k::jobs]]

    with ThreadPoolExecutor(jobs) as pool:
        results = [r for rows in pool.map(worker, range(jobs)) for r in rows]
    for r in results:
        for c in COLUMNS:
            row[c] += r[c]
        row.details += r.details
    for w in works + [template]:
        shutil.rmtree(w, ignore_errors=True)
    return row


def _tree_entries(fields_tag: str, root: Path, n: int, version: str = "0.7.2.post1", seed0: int = 0) -> list[str]:
    return [str(write_fake_entry(root, fields=default_fields(f"org/{fields_tag}{i}", tp=2, dp=2), arch="sm90",
                                 seed=seed0 + i, buckets=(1, 2), flashinfer_version=version)) for i in range(n)]


class TreeRm(ExactCase):
    """``rm -y A B C D`` of a tree holding A-E: E must stay; the re-run must finish."""

    name = "rm"

    def setup(self, work):
        ids = _tree_entries("rm", work / "tree", 5)
        (work / "ids.json").write_text(json.dumps(ids))

    def ids(self, work):
        return json.loads((work / "ids.json").read_text())

    def argv(self, work):
        return ["rm", "-y", *self.ids(work)[:4], "--cache-dir", work / "tree"]

    def after_kill(self, work, row, where):
        _check_tree(work / "tree", row, where, keep=self.ids(work)[4:], may_go=self.ids(work)[:4])

    def after_rerun(self, work, row, where):
        now = _check_tree(work / "tree", row, where, keep=self.ids(work)[4:], may_go=self.ids(work)[:4])
        left = [i for i in self.ids(work)[:4] if i in now]
        row.fail("unfinished", f"rm killed at {where}: {len(left)} named entries still there after the re-run",
                 len(left) and 1)
        row.fail("leftovers", f"rm killed at {where}: {leftovers(work / 'tree')} trash/stage/journal after the re-run",
                 leftovers(work / "tree"))


def _check_tree(root: Path, row: Row, where: str, keep: list[str], may_go: list[str] = (),
                all_or_none: list[str] = ()) -> dict[str, str]:
    """The tree's invariants: every file parses, ``keep`` all there and complete, every entry listed
    complete, ``all_or_none`` all there or none. Returns the statuses."""
    bad = corrupt_files(root)
    row.fail("corrupt", f"{where}: {bad} file(s) do not parse", bad)
    now = statuses(root, row)
    gone = [i for i in keep if i not in now]
    row.fail("lost", f"{where}: {gone} gone", len(gone))
    halves = [i for i, s in now.items() if s != "complete"]
    row.fail("half", f"{where}: {halves} not complete", len(halves))
    if all_or_none:
        there = [i for i in all_or_none if i in now]
        if there and len(there) != len(all_or_none):
            row.fail("half", f"{where}: {len(there)} of {len(all_or_none)} entries installed")
    return now


def _store_state(store: Path) -> dict:
    """What a file:// store holds, read straight from its files: records (path -> parsed or None),
    bundles (relative path -> sha256 matches its name), temp files."""
    records, bundles, temps = {}, {}, []
    if not store.exists():
        return {"records": records, "bundles": bundles, "temps": temps}
    for p in store.rglob("*"):
        if ".fi-autotune-locks" in p.parts or not p.is_file():
            continue
        rel = str(p.relative_to(store))
        if p.name.startswith(".tmp-"):
            temps.append(rel)
        elif rel.startswith("index/") and p.suffix == ".json":
            try:
                records[rel] = json.loads(p.read_bytes())
            except ValueError:
                records[rel] = None
        elif rel.startswith("bundles/") and p.name.endswith(".tar.gz"):
            bundles[rel] = hashlib.sha256(p.read_bytes()).hexdigest() == p.name[: -len(".tar.gz")]
    return {"records": records, "bundles": bundles, "temps": temps}


def _check_store(store: Path, row: Row, where: str, keep: list[str], final: bool = False) -> list[str]:
    """The store's invariants: every record parses and names a bundle that is there with its sha256;
    ``keep`` all listed by ``ls URL``. With ``final``: no temp file and no bundle without a record
    (leftovers). Returns the ids ``ls URL`` lists."""
    st = _store_state(store)
    bad = [r for r, d in st["records"].items() if not isinstance(d, dict)] + [b for b, ok in st["bundles"].items() if not ok]
    row.fail("corrupt", f"{where}: {bad} do not parse or do not match their sha256", len(bad))
    named = set()
    for r, d in st["records"].items():
        if isinstance(d, dict):
            named.add(d.get("bundle"))
            if d.get("bundle") not in st["bundles"]:
                row.fail("half", f"{where}: record {r} names a bundle that is not there")
    p = row.proc(cli("ls", f"file://{store}", "--json", env={"XDG_CACHE_HOME": str(store.parent / "xdg-check")}))
    ids = [e["id"] for e in json.loads(p.stdout)["entries"]] if p is not None and p.returncode == 0 else []
    if p is not None and p.returncode != 0 and store.exists():
        row.fail("corrupt", f"{where}: ls URL exits {p.returncode}: {p.stderr.decode(errors='replace')[-200:]}")
    gone = [i for i in keep if i not in ids]
    row.fail("lost", f"{where}: {gone} no longer listed by ls URL", len(gone))
    if final:
        orphans = [b for b in st["bundles"] if b not in named]
        row.fail("leftovers", f"{where}: {len(st['temps'])} temp file(s) {st['temps'][:2]} after the re-run", len(st["temps"]))
        row.fail("leftovers", f"{where}: {len(orphans)} bundle(s) no record names after the re-run: {orphans[:1]}", len(orphans))
    return ids


def _ids(work: Path) -> dict:
    return json.loads((work / "ids.json").read_text())


def _pushed(work: Path, store: Path, tree: Path) -> None:
    p = cli("push", f"file://{store}", "--cache-dir", tree, env={"XDG_CACHE_HOME": str(work / "xdg")})
    assert p is not None and p.returncode == 0, p and p.stderr


class TreePrune(ExactCase):
    """``prune --flashinfer-version 0.7.1 -y`` of a tree with 4 such entries and one 0.7.2.post1 (stays)."""

    name = "prune"

    def setup(self, work):
        old = _tree_entries("pr", work / "tree", 4, version="0.7.1")
        keep = _tree_entries("prk", work / "tree", 1)
        (work / "ids.json").write_text(json.dumps({"old": old, "keep": keep}))

    def argv(self, work):
        return ["prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", work / "tree"]

    def after_kill(self, work, row, where):
        _check_tree(work / "tree", row, where, keep=_ids(work)["keep"])

    def after_rerun(self, work, row, where):
        now = _check_tree(work / "tree", row, where, keep=_ids(work)["keep"])
        left = [i for i in _ids(work)["old"] if i in now]
        row.fail("unfinished", f"prune killed at {where}: {len(left)} selected entries still there after the re-run",
                 len(left) and 1)
        row.fail("leftovers", f"prune killed at {where}: trash/stage/journal after the re-run", leftovers(work / "tree"))


class TreeImport(ExactCase):
    """``import`` of a 4-entry archive into a tree holding 2 others: all 4 or none, the 2 stay."""

    name = "import"

    def setup(self, work):
        new = _tree_entries("imp", work / "src", 4)
        keep = _tree_entries("impk", work / "tree", 2, seed0=10)
        assert cli("export", "-o", work / "in.tgz", "--cache-dir", work / "src").returncode == 0
        shutil.rmtree(work / "src")
        (work / "ids.json").write_text(json.dumps({"new": new, "keep": keep}))

    def argv(self, work):
        return ["import", work / "in.tgz", "--cache-dir", work / "tree"]

    def after_kill(self, work, row, where):
        finish_with_a_writer(work / "tree", row, where)  # a transaction killed mid-swap: the next writer ends it
        _check_tree(work / "tree", row, where, keep=_ids(work)["keep"], all_or_none=_ids(work)["new"])

    def after_rerun(self, work, row, where):
        now = _check_tree(work / "tree", row, where, keep=_ids(work)["keep"] + _ids(work)["new"])
        row.fail("leftovers", f"import killed at {where}: trash/stage/journal after the re-run", leftovers(work / "tree"))
        del now


def _archive_ok(path: Path, expect: list[str]) -> bool:
    try:
        with tarfile.open(path) as tar:
            names = tar.getnames()
            for m in tar.getmembers():
                if m.isfile():
                    tar.extractfile(m).read()
    except (OSError, tarfile.TarError, EOFError, zlib.error):
        return False
    return all(any(e.split("/")[-1] in n for n in names) for e in expect)


class TreeExport(ExactCase):
    """``export -o out/x.tgz`` of 4 entries: the archive at that name is whole or absent."""

    name = "export"

    def setup(self, work):
        ids = _tree_entries("exp", work / "tree", 4)
        (work / "out").mkdir()
        (work / "ids.json").write_text(json.dumps({"all": ids}))

    def argv(self, work):
        return ["export", "-o", work / "out" / "x.tgz", "--cache-dir", work / "tree"]

    def after_kill(self, work, row, where):
        out = work / "out" / "x.tgz"
        if out.exists() and not _archive_ok(out, _ids(work)["all"]):
            row.fail("half", f"export killed at {where}: a partial archive at the output name")
        _check_tree(work / "tree", row, where, keep=_ids(work)["all"])

    def after_rerun(self, work, row, where):
        if not _archive_ok(work / "out" / "x.tgz", _ids(work)["all"]):
            row.fail("unfinished", f"export killed at {where}: no whole archive after the re-run")
        extra = [p.name for p in (work / "out").iterdir() if p.name != "x.tgz"]
        row.fail("leftovers", f"export killed at {where}: {extra} next to the archive after the re-run", len(extra))


class TreeConvert(ExactCase):
    """``convert A B --layout flashinfer-v2 --to v2``: every store file parses, no temp file stays."""

    name = "convert"

    def setup(self, work):
        ids = _tree_entries("cv", work / "tree", 2)
        (work / "ids.json").write_text(json.dumps({"all": ids}))

    def argv(self, work):
        return ["convert", *_ids(work)["all"], "--layout", "flashinfer-v2", "--to", work / "v2", "--cache-dir", work / "tree"]

    def _check(self, work, row, where, final):
        v2 = work / "v2"
        if not v2.exists():
            return
        bad = 0
        for p in v2.rglob("*.json"):
            if ".fi-autotune-locks" in p.parts or TEMP_FILE_RE.match(p.name):
                continue
            try:
                json.loads(p.read_bytes())
            except (ValueError, OSError):
                bad += 1
        row.fail("corrupt", f"convert killed at {where}: {bad} store file(s) do not parse", bad)
        p = row.proc(cli("ls", "--layout", "flashinfer-v2", "--cache-dir", v2, "--json", env=self.env(work)))
        if p is not None and p.returncode == 0:
            halves = [e["id"] for e in json.loads(p.stdout)["entries"] if e["status"] != "complete"]
            row.fail("half", f"convert killed at {where}: {halves} not complete", len(halves))
        if final:
            temps = [str(p.relative_to(v2)) for p in v2.rglob("*") if TEMP_FILE_RE.match(p.name)]
            row.fail("leftovers", f"convert killed at {where}: {temps[:2]} after the re-run", len(temps))

    def after_kill(self, work, row, where):
        self._check(work, row, where, False)

    def after_rerun(self, work, row, where):
        self._check(work, row, where, True)


class StorePush(ExactCase):
    """``push file://store`` of 4 entries into a store already holding a 5th (stays)."""

    name = "push"

    def setup(self, work):
        keep = _tree_entries("pk", work / "other", 1, seed0=20)
        _pushed(work, work / "store", work / "other")
        shutil.rmtree(work / "other")
        new = _tree_entries("pu", work / "tree", 4)
        (work / "ids.json").write_text(json.dumps({"new": new, "keep": keep}))

    def argv(self, work):
        return ["push", f"file://{work / 'store'}", "--cache-dir", work / "tree"]

    def after_kill(self, work, row, where):
        _check_store(work / "store", row, where, keep=_ids(work)["keep"])

    def after_rerun(self, work, row, where):
        ids = _check_store(work / "store", row, where, keep=_ids(work)["keep"] + _ids(work)["new"], final=True)
        del ids


class StorePull(ExactCase):
    """``pull file://store --any-env`` of 4 entries into a tree holding a 5th: all or none, it stays."""

    name = "pull"

    def setup(self, work):
        new = _tree_entries("pl", work / "src", 4)
        _pushed(work, work / "store", work / "src")
        shutil.rmtree(work / "src")
        keep = _tree_entries("plk", work / "tree", 1, seed0=30)
        (work / "ids.json").write_text(json.dumps({"new": new, "keep": keep}))

    def argv(self, work):
        return ["pull", f"file://{work / 'store'}", "--any-env", "--cache-dir", work / "tree"]

    def after_kill(self, work, row, where):
        finish_with_a_writer(work / "tree", row, where)  # a transaction killed mid-swap: the next writer ends it
        _check_tree(work / "tree", row, where, keep=_ids(work)["keep"], all_or_none=_ids(work)["new"])

    def after_rerun(self, work, row, where):
        _check_tree(work / "tree", row, where, keep=_ids(work)["keep"] + _ids(work)["new"])
        row.fail("leftovers", f"pull killed at {where}: trash/stage/journal after the re-run", leftovers(work / "tree"))
        _check_store(work / "store", row, where, keep=_ids(work)["new"])


class StoreRm(ExactCase):
    """``rm file://store A B C D -y`` of a store holding A-E: E stays, the re-run finishes."""

    name = "rm URL"

    def setup(self, work):
        ids = _tree_entries("srm", work / "src", 5)
        _pushed(work, work / "store", work / "src")
        shutil.rmtree(work / "src")
        (work / "ids.json").write_text(json.dumps({"gone": ids[:4], "keep": ids[4:]}))

    def argv(self, work):
        return ["rm", f"file://{work / 'store'}", *_ids(work)["gone"], "-y"]

    def after_kill(self, work, row, where):
        _check_store(work / "store", row, where, keep=_ids(work)["keep"])

    def after_rerun(self, work, row, where):
        ids = _check_store(work / "store", row, where, keep=_ids(work)["keep"], final=True)
        left = [i for i in _ids(work)["gone"] if i in ids]
        row.fail("unfinished", f"rm URL killed at {where}: {len(left)} named entries still published after the re-run",
                 len(left) and 1)


class StorePrune(ExactCase):
    """``prune file://store --flashinfer-version 0.7.1 -y`` of 4 such entries; a 0.7.2.post1 one stays."""

    name = "prune URL"

    def setup(self, work):
        old = _tree_entries("spr", work / "src", 4, version="0.7.1")
        keep = _tree_entries("sprk", work / "src", 1)
        _pushed(work, work / "store", work / "src")
        shutil.rmtree(work / "src")
        (work / "ids.json").write_text(json.dumps({"old": old, "keep": keep}))

    def argv(self, work):
        return ["prune", f"file://{work / 'store'}", "--flashinfer-version", "0.7.1", "-y"]

    def after_kill(self, work, row, where):
        _check_store(work / "store", row, where, keep=_ids(work)["keep"])

    def after_rerun(self, work, row, where):
        ids = _check_store(work / "store", row, where, keep=_ids(work)["keep"], final=True)
        left = [i for i in _ids(work)["old"] if i in ids]
        row.fail("unfinished", f"prune URL killed at {where}: {len(left)} selected entries still published after the re-run",
                 len(left) and 1)


EXACT_CASES = [TreeRm, TreePrune, TreeImport, TreeExport, TreeConvert, StorePush, StorePull, StoreRm, StorePrune]


# --- hostile HTTP servers on loopback ----------------------------------------------------------------

class HostileHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a real store's files (with directory indexes, which an HTTP store lists through),
    except the one object under attack (``server.target``: marker, record, bundle or listing),
    which gets ``server.attack``."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):  # noqa: D401 - quiet
        pass

    def _targeted(self) -> bool:
        path, target = self.path.split("?")[0], self.server.target  # type: ignore[attr-defined]
        return (target == "all" or (target == "marker" and path.endswith("/fi-autotune-store.json"))
                or (target == "record" and path.startswith("/index/") and path.endswith(f"{self.server.key}.json"))
                or (target == "bundle" and path.startswith("/bundles/") and f"/{self.server.key}/" in path
                    and path.endswith(".tar.gz"))
                or (target == "listing" and path.endswith("/")))

    def do_HEAD(self):
        self.do_GET(head=True)

    def do_GET(self, head: bool = False):
        if not self._targeted():
            return super().do_HEAD() if head else super().do_GET()
        attack, stop = self.server.attack, self.server.stop  # type: ignore[attr-defined]
        self.server.hits += 1  # type: ignore[attr-defined]
        w = self.wfile
        try:
            if attack == "silent":
                stop.wait(120)
            elif attack == "trickle":
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\nContent-Type: application/json\r\n\r\n{")
                w.flush()
                while not head and not stop.wait(0.5):  # one byte every 0.5 s: inside every read timeout
                    w.write(b" ")
                    w.flush()
            elif attack == "trickle-slow":
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n{")
                w.flush()
                while not head and not stop.wait(3):  # a byte every 3 s: past the 1 s timeout
                    w.write(b" ")
                    w.flush()
            elif attack == "garbage":
                body = self.server.rng.randbytes(self.server.rng.randrange(1, 5000))  # type: ignore[attr-defined]
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + (b"" if head else body))
            elif attack == "garbage-status":
                w.write(b"HTTP/1.1 999 \xff\xfe\r\nX: \x00\r\n\r\n")
            elif attack == "not-http":
                w.write(self.server.rng.randbytes(3000))  # type: ignore[attr-defined]
            elif attack == "endless":
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
                chunk = b"[" * 65536
                t0 = time.monotonic()
                while not head and not stop.is_set() and time.monotonic() - t0 < 60:
                    w.write(chunk)
            elif attack == "huge-length":
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000000\r\n\r\n")
                t0 = time.monotonic()
                while not head and not stop.is_set() and time.monotonic() - t0 < 60:
                    w.write(b"{" * 65536)
            elif attack == "gzip-bomb":
                body = self.server.bomb  # type: ignore[attr-defined]
                w.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body)
                        + (b"" if head else body))
            elif attack == "redirect-file":
                w.write(b"HTTP/1.1 302 Found\r\nLocation: file://%s%s\r\nContent-Length: 0\r\n\r\n"
                        % (str(self.server.victim).encode(), self.path.encode()))  # type: ignore[attr-defined]
            elif attack == "redirect-loop":
                w.write(b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % self.path.encode())
            elif attack == "redirect-other":  # the attacked object is sent from another entry's place
                other = self.path.replace(self.server.key, self.server.other_key)  # type: ignore[attr-defined]
                if other.endswith(".tar.gz"):
                    d = Path(self.directory) / other.lstrip("/").rsplit("/", 1)[0]
                    other = "/" + str(next(d.iterdir()).relative_to(self.directory))
                w.write(b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % other.encode())
            elif attack == "missing":
                w.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            w.flush()
        except OSError:
            pass
        self.close_connection = True


class HostileServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


HTTP_ATTACKS = [("silent", "all"), ("trickle", "marker"), ("trickle", "record"), ("trickle", "bundle"),
                ("trickle", "listing"), ("trickle-slow", "marker"), ("trickle-slow", "bundle"),
                ("garbage", "marker"), ("garbage", "record"), ("garbage", "bundle"), ("garbage", "listing"),
                ("garbage-status", "marker"), ("not-http", "all"), ("endless", "marker"), ("endless", "record"),
                ("endless", "bundle"), ("endless", "listing"), ("huge-length", "marker"), ("huge-length", "record"),
                ("huge-length", "bundle"), ("gzip-bomb", "marker"), ("gzip-bomb", "record"), ("gzip-bomb", "bundle"),
                ("redirect-file", "marker"), ("redirect-file", "record"), ("redirect-file", "bundle"),
                ("redirect-loop", "marker"), ("redirect-loop", "bundle"), ("redirect-other", "record"),
                ("redirect-other", "bundle"), ("missing", "bundle")]
HTTP_HANG = 30  # seconds a command against a hostile server may take (its --timeout is 1 s)
RSS_LIMIT = 1 << 30  # bytes of memory a command may hold before it is killed and counted as a hang


def watched(argv: list, env: dict, timeout: float, rss_limit: int) -> tuple[subprocess.CompletedProcess | None, str]:
    """``argv`` run to its end, or killed past ``timeout`` s or ``rss_limit`` bytes resident (then
    None and why)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=err)
        t0, peak = time.monotonic(), 0
        while p.poll() is None:
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    rss = next((int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS")), 0)
            except (OSError, StopIteration):
                rss = 0
            peak = max(peak, rss)
            why = (f"still running after {timeout:g} s" if time.monotonic() - t0 > timeout else
                   f"{rss >> 20} MB resident after {time.monotonic() - t0:.1f} s (killed)" if rss > rss_limit else "")
            if why:
                p.kill()
                p.wait()
                return None, why
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, p.returncode, out.read(), err.read()), ""


def _rank_bytes(root: Path) -> dict[str, dict[str, bytes]]:
    """entry id -> {rank file name: bytes} for every entry dir in a tree."""
    out: dict[str, dict[str, bytes]] = {}
    base = SG.base(root)
    if not base.exists():
        return out
    for p in base.glob("[!.]*/[!.]*/[!.]*/rank_*.json"):
        out.setdefault(str(p.parent.relative_to(base)), {})[p.name] = p.read_bytes()
    return out


def hostile_http(tmp: Path, rng: random.Random, attacks=HTTP_ATTACKS) -> Row:
    """Each attack x (``ls URL``, a full ``pull``, ``pull ID`` of the attacked entry), ``--timeout 1``.
    Checks: no traceback; done within HTTP_HANG s (hangs); a pull that fails installs nothing
    (half); whatever is installed is byte-for-byte the honest store's entry (wrong installs: the
    victim store a file:// redirect points at holds other entries); nothing changes outside the
    destination (escapes)."""
    row = Row()
    work = tmp / "http"
    src, victim_src = work / "src", work / "victim-src"
    ids = _tree_entries("http", src, 3)
    honest = _rank_bytes(src)
    store, victim = work / "store", work / "victim"
    env = {"XDG_CACHE_HOME": str(work / "xdg")}
    assert cli("push", f"file://{store}", "--cache-dir", src, env=env).returncode == 0
    _tree_entries("victim", victim_src, 2, seed0=40)
    assert cli("push", f"file://{victim}", "--cache-dir", victim_src, env=env).returncode == 0
    victim_before = _snapshot(victim)
    bomb = io.BytesIO()
    with gzip.GzipFile(fileobj=bomb, mode="wb", compresslevel=9) as gz:
        for _ in range(1024):  # 1 GiB of "[" in about 1 MB
            gz.write(b"[" * (1 << 20))
    server = HostileServer(("127.0.0.1", 0), functools.partial(HostileHandler, directory=str(store)))
    server.stop, server.rng, server.bomb, server.victim, server.hits = threading.Event(), rng, bomb.getvalue(), victim, 0
    server.key, server.other_key = ids[0].split("/")[-1], ids[1].split("/")[-1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for attack, target in attacks:
            server.attack, server.target = attack, target
            for cmd in (["ls", url], ["pull", url, "--any-env"], ["pull", url, ids[0], "--any-env"]):
                dest = work / "dest"
                shutil.rmtree(dest, ignore_errors=True)
                what = f"{attack} {target}: {' '.join(cmd[:1] + cmd[2:3])}"
                row["attempts"] += 1
                t0 = time.monotonic()
                args = [*cmd, "--timeout", "1"] + (["--cache-dir", dest] if cmd[0] == "pull" else [])
                p, why = watched([sys.executable, "-m", "fi_autotune_cli", *map(str, args)], {**os.environ, **env},
                                 HTTP_HANG, RSS_LIMIT)
                if why:
                    row.fail("hangs", f"{what}: {why}")
                took = time.monotonic() - t0
                if p is not None:
                    row.proc(p)
                    err = p.stderr.decode(errors="replace").strip()
                    row.details.append(f"note: {what}: exit {p.returncode} in {took:.1f} s: {err.splitlines()[-1][:150] if err else ''}")
                    got = _rank_bytes(dest)
                    if cmd[0] == "pull" and p.returncode != 0 and got:
                        row.fail("half", f"{what}: exit {p.returncode} but {len(got)} entries installed")
                    for eid, files in got.items():
                        if honest.get(eid) != files:
                            row.fail("wrong installs", f"{what}: {eid} installed with other bytes than the store's")
                    bad = [e for e, s in statuses(dest, row).items() if s != "complete"]
                    row.fail("half", f"{what}: {bad} not complete", len(bad))
                if _snapshot(victim) != victim_before:
                    row.fail("escapes", f"{what}: the victim store changed")
                    victim_before = _snapshot(victim)
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()
    shutil.rmtree(work, ignore_errors=True)
    return row


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file() and ".fi-autotune-locks" not in p.parts}


# --- look-alike names ---------------------------------------------------------------------------------

def _look_alikes(eid: str) -> list[tuple[str, str]]:
    """(what, name) look-alikes of a real id: whitespace, case, non-ASCII digits."""
    out = [("trailing newline", eid + "\n"), ("trailing space", eid + " "), ("leading space", " " + eid),
           ("trailing tab", eid + "\t"), ("trailing CR", eid + "\r")]
    last = eid.rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    if last.upper() != last:
        out.append(("upper case", eid[: len(eid) - len(last)] + last.upper()))
    i = next((i for i, c in enumerate(eid) if c.isdigit()), None)
    if i is not None:
        out.append(("arabic-indic digit", eid[:i] + chr(0x0660 + int(eid[i])) + eid[i + 1:]))
        out.append(("fullwidth digit", eid[:i] + chr(0xFF10 + int(eid[i])) + eid[i + 1:]))
        out.append(("mathematical digit", eid[:i] + chr(0x1D7CE + int(eid[i])) + eid[i + 1:]))
    return out


def _layout_tree(work: Path, layout: str) -> tuple[Path, list[str], Path, dict]:
    """A tree of ``layout`` with its real entries, their ids, the real entry's dir, the env."""
    env = {"XDG_CACHE_HOME": str(work / "xdg"), "FLASHINFER_AUTOTUNE_CACHE_DIR": str(work / "no-v2")}
    if layout == "sglang":
        root = work / "sg"
        ids = _tree_entries("look", root, 2)
        path = SG.entry_dir(root, SG.parse_id(ids[0]))
    elif layout == "vllm":
        root = work / "vl"
        path = write_vllm_entry(root, "ab" * 32)
        write_vllm_entry(root, "cd" * 32, seed=1)
    else:
        src, root = work / "v2src", work / "v2"
        eid = _tree_entries("lookv2", src, 1)[0]
        assert cli("convert", eid, "--layout", "flashinfer-v2", "--to", root, "--cache-dir", src, env=env).returncode == 0
        path = next((root / "v2").iterdir())
        env["FLASHINFER_AUTOTUNE_CACHE_DIR"] = str(root)
    p = cli("ls", "-q", "--layout", layout, "--cache-dir", root, env=env)
    ids = p.stdout.decode().split()
    return root, ids, path, env


def look_alike_names(tmp: Path) -> Row:
    """In every layout (sglang, vllm, flashinfer-v2): next to the real entry, copies of it under
    look-alike dir names (a trailing newline or space, upper case, a non-ASCII digit); then each
    look-alike of the real id given to ``rm -y``, ``show``, ``export`` and ``pull URL`` (from a
    file:// store the layout was pushed to). A look-alike must never name the real entry: ``rm``
    deleting anything is a wrong delete; ``show``/``export``/``pull`` succeeding is a wrong
    install (it acted on an entry that was not named); ``ls`` listing a look-alike dir, or
    ``prune --status corrupt -y`` removing one (they are not ours), likewise."""
    row = Row()
    for layout in ("sglang", "vllm", "flashinfer-v2"):
        work = tmp / f"look-{layout}"
        root, ids, path, env = _layout_tree(work, layout)
        store = work / "store"
        p = cli("push", f"file://{store}", "--layout", layout, "--cache-dir", root,
                *(["--include-incomplete"] if layout == "vllm" else []), env=env)  # vLLM's files carry no manifest
        pushed = p is not None and p.returncode == 0
        if not pushed:
            row.details.append(f"note: {layout}: push refused ({p and p.stderr.decode(errors='replace').strip()[-150:]}); "
                               "pull of look-alikes not tried")
        twins = []
        for what, spoiled_dir in (("newline", path.name + "\n"), ("space", path.name + " "), ("upper", path.name.upper()),
                                  ("digit", re.sub(r"\d", lambda m: chr(0x0660 + int(m.group())), path.name, count=1))):
            twin = path.with_name(spoiled_dir)
            if twin != path and not twin.exists():
                shutil.copytree(path, twin)
                twins.append(twin)
        on_disk = _snapshot(root)
        lay = ["--layout", layout, "--cache-dir", root]
        row["attempts"] += 1
        listed = row.proc(cli("ls", "-q", *lay, env=env))
        if listed is not None and sorted(listed.stdout.decode().split("\n")[:-1]) != sorted(ids):
            row.fail("wrong installs", f"{layout}: ls -q lists {listed.stdout!r}, not the real ids {ids}")
        row["attempts"] += 1
        row.proc(cli("prune", "--status", "corrupt", "-y", *lay, env=env))
        gone = [t.name for t in twins if not t.is_dir()] + ([path.name] if not path.is_dir() else [])
        row.fail("wrong deletes", f"{layout}: prune --status corrupt removed {gone}", len(gone))
        for what, name in _look_alikes(ids[0]):
            for cmd in (["rm", "-y", name, *lay], ["show", name, *lay], ["export", "-o", work / "out.tgz", name, *lay],
                        *([["pull", f"file://{store}", name, "--any-env", "--layout", layout, "--cache-dir", work / "dest"]]
                          if pushed else [])):
                row["attempts"] += 1
                p = row.proc(cli(*cmd, env=env))
                where = f"{layout} {what} {cmd[0]}"
                if p is None:
                    continue
                now = _snapshot(root) if root.exists() else {}
                lost = sorted({k.split("/")[-2] for k in on_disk if k not in now})
                if lost:
                    row.fail("wrong deletes", f"{where}: {lost} deleted")
                    break
                if p.returncode == 0:
                    row.fail("wrong installs", f"{where} {name!r}: exit 0 (acted on {ids[0]})")
                if cmd[0] == "export" and (work / "out.tgz").exists():
                    (work / "out.tgz").unlink()
                if (work / "dest").exists():
                    shutil.rmtree(work / "dest")
        shutil.rmtree(work, ignore_errors=True)
    return row


# --- swapped and edited index records (file:// and a real S3 server) ------------------------------------

class FileBackend:
    def __init__(self, store: Path):
        self.store, self.url = store, f"file://{store}"

    def keys(self) -> list[str]:
        return sorted(str(p.relative_to(self.store)) for p in self.store.rglob("*")
                      if p.is_file() and ".fi-autotune-locks" not in p.parts)

    def get(self, key: str) -> bytes:
        return (self.store / key).read_bytes()

    def put(self, key: str, data: bytes) -> None:
        (self.store / key).parent.mkdir(parents=True, exist_ok=True)
        (self.store / key).write_bytes(data)

    def env(self) -> dict:
        return {}


class S3Backend:
    def __init__(self, endpoint: str, bucket: str):
        import boto3
        self.endpoint, self.bucket, self.url = endpoint, bucket, f"s3://{bucket}/caches"
        self.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing")
        self.client.create_bucket(Bucket=bucket)

    def keys(self) -> list[str]:
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix="caches/"):
            out += [o["Key"][len("caches/"):] for o in page.get("Contents", [])
                    if ".fi-autotune-locks" not in o["Key"]]
        return sorted(out)

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=f"caches/{key}")["Body"].read()

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=f"caches/{key}", Body=data)

    def env(self) -> dict:
        return s3_env(self.endpoint)


def s3_env(endpoint: str) -> dict:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}


class MotoServer:
    """A real S3 server on loopback (moto's server mode), as the tests start it."""

    def __init__(self, tmp: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = open(tmp / "moto.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.1)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.log.close()


def _record_edits(a: dict, b: dict) -> list[tuple[str, object]]:
    """(what, new record for A's place or a function of the store) for each edit of A's record."""
    def edit(**kw):
        return {**a, **kw}
    return [
        ("B's record at A's place", dict(b)),
        ("A's record names B's bundle and sha", edit(bundle=b["bundle"], sha256=b["sha256"], size=b["size"])),
        ("A's record names B's bundle", edit(bundle=b["bundle"])),
        ("sha256 edited", edit(sha256="0" * 64)),
        ("metadata gpu edited", edit(metadata={**a["metadata"], "gpu": "NVIDIA B200"})),
        ("metadata emptied", edit(metadata={})),
        ("rank_files edited", edit(rank_files=a["rank_files"] + 6)),
        ("id edited to B", edit(id=b["id"], parts=b["parts"])),
        ("bundle path escapes the store", edit(bundle="../victim/keep.json")),
        ("bundle path absolute", edit(bundle="/etc/hostname")),
        ("bundle path into index", edit(bundle=a["bundle"].replace("bundles/", "index/", 1))),
        ("size huge", edit(size=10 ** 15)),
        ("format 99", edit(format=99)),
        ("layout edited", edit(layout="vllm")),
        ("truncated", None),
    ]


S3_EDITS = ("B's record at A's place", "A's record names B's bundle and sha", "bundle path escapes the store",
            "sha256 edited")


def edited_records(tmp: Path, moto: "MotoServer | None") -> Row:
    """A store of A, B and C; A's index record replaced by each edit (B's record at A's place, A's
    record naming B's bundle, edited sha256/metadata/rank count/id/layout/format, a bundle path
    out of the store or absolute, truncated); then ``ls URL``, ``pull URL``, ``pull URL A``,
    ``rm URL A -y`` and ``prune URL --model m -y``; over file:// and over a real S3 server.
    Checks: whatever a pull installs is byte-for-byte the honest entry of that id (wrong
    installs); a delete removes nothing but A's own record and bundle - B, C and a victim file
    next to the store stay (wrong deletes, escapes)."""
    row = Row()
    src = tmp / "rec-src"
    ids = _tree_entries("rec", src, 3)
    honest = _rank_bytes(src)
    backends = ["file"] + (["s3"] if moto else [])
    for kind in backends:
        for n, (what, _) in enumerate(_record_edits(*[{"metadata": {}, "rank_files": 0, "bundle": "", "sha256": "", "size": 0, "id": "", "parts": []}] * 2)):
            if kind == "s3" and what not in S3_EDITS:
                continue  # S3 requests are slow here: the edits that reach for another entry's objects
            work = tmp / f"rec-{kind}-{n}"
            victim = work / "victim"
            victim.mkdir(parents=True)
            (victim / "keep.json").write_text("{}")
            be = FileBackend(work / "store") if kind == "file" else S3Backend(moto.endpoint, f"rec{n}")
            env = {"XDG_CACHE_HOME": str(work / "xdg"), **be.env()}
            p = cli("push", be.url, "--cache-dir", src, env=env)
            assert p.returncode == 0, p.stderr
            recs = {json.loads(be.get(k))["id"]: k for k in be.keys() if k.startswith("index/")}
            a, b = json.loads(be.get(recs[ids[0]])), json.loads(be.get(recs[ids[1]]))
            new = dict(_record_edits(a, b))[what]
            be.put(recs[ids[0]], be.get(recs[ids[0]])[:40] if new is None else json.dumps(new).encode())
            before = {k: be.get(k) for k in be.keys()}
            for cmd in (["ls", be.url], ["pull", be.url, "--any-env", "--cache-dir", work / "dest"],
                        ["pull", be.url, ids[0], "--any-env", "--cache-dir", work / "dest"],
                        ["rm", be.url, ids[0], "-y"], ["prune", be.url, "--model", "org/rec0", "-y"]):
                where = f"{kind} {what}: {cmd[0]}{' A' if ids[0] in cmd else ''}"
                row["attempts"] += 1
                p = row.proc(cli(*cmd, env=env))
                got = _rank_bytes(work / "dest")
                for eid, files in got.items():
                    if honest.get(eid) != files:
                        row.fail("wrong installs", f"{where}: {eid} installed with other bytes than its own")
                if p is not None and cmd[0] == "pull" and p.returncode != 0 and got:
                    row.fail("half", f"{where}: exit {p.returncode} but {len(got)} entries installed")
                shutil.rmtree(work / "dest", ignore_errors=True)
                now = set(be.keys())
                a_own = {recs[ids[0]], a["bundle"]}
                wrong = [k for k in before if k not in now and k not in a_own]
                row.fail("wrong deletes", f"{where}: {wrong} deleted", len(wrong))
                if not (victim / "keep.json").exists() or len(list(victim.iterdir())) != 1:
                    row.fail("escapes", f"{where}: the file next to the store was touched")
                for k in wrong:  # put back what was wrongly deleted, to go on
                    be.put(k, before[k])
            shutil.rmtree(work, ignore_errors=True)
    return row


# --- archives with links, device nodes, `..` and sparse members (import and pull) ----------------------

def _link_archives(tmp: Path, victim: Path) -> list[tuple[str, bytes]]:
    good = cache_file_bytes(DEFAULT_METADATA, fake_configs(buckets=(1, 2)))
    prefix = "flashinfer/autotune/0.7.2.post1/sm90/0123456789abcdef/"
    rank = prefix + "rank_tp0_pp0_dp0.json"

    def tar_of(members: list[tarfile.TarInfo], datas: dict[str, bytes] | None = None) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
            for m in members:
                data = (datas or {}).get(m.name)
                if data is not None:
                    m.size = len(data)
                tar.addfile(m, io.BytesIO(data) if data is not None else None)
        return buf.getvalue()

    def info(name, kind=tarfile.REGTYPE, link=""):
        t = tarfile.TarInfo(name)
        t.type, t.linkname = kind, link
        if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
            t.devmajor, t.devminor = 1, 3
        return t

    out = [
        ("symlink rank file -> victim", tar_of([info(rank, tarfile.SYMTYPE, str(victim / "keep.json"))])),
        ("symlink entry dir -> victim", tar_of([info(prefix.rstrip("/"), tarfile.SYMTYPE, str(victim)),
                                                info(rank)], {rank: good})),
        ("symlink then write through it", tar_of([info(prefix + "x", tarfile.SYMTYPE, str(victim)),
                                                  info(prefix + "x/keep.json")], {prefix + "x/keep.json": good})),
        ("hardlink rank file -> victim", tar_of([info(rank, tarfile.LNKTYPE, str(victim / "keep.json"))])),
        ("hardlink to ../ path", tar_of([info(rank, tarfile.LNKTYPE, "../../../../../../" + str(victim / "keep.json"))])),
        ("hardlink to a member", tar_of([info(rank), info(prefix + "rank_tp1_pp0_dp1.json", tarfile.LNKTYPE, rank)],
                                        {rank: good})),
        ("char device /dev/null", tar_of([info(rank, tarfile.CHRTYPE)])),
        ("block device", tar_of([info(rank, tarfile.BLKTYPE)])),
        ("FIFO", tar_of([info(rank, tarfile.FIFOTYPE)])),
        ("dotdot member", tar_of([info(prefix + "../../../../../../victim-evil.json")], {prefix + "../../../../../../victim-evil.json": good})),
        ("dotdot to victim", tar_of([info("flashinfer/autotune/../../" + os.path.relpath(victim / "evil.json", tmp))],
                                    {"flashinfer/autotune/../../" + os.path.relpath(victim / "evil.json", tmp): good})),
        ("absolute member", tar_of([info(str(victim / "evil.json"))], {str(victim / "evil.json"): good})),
        ("directory member where a rank file goes", tar_of([info(rank, tarfile.DIRTYPE)])),
    ]
    sparse = tmp / "sparse-src" / prefix
    sparse.mkdir(parents=True, exist_ok=True)
    with open(sparse / "rank_tp0_pp0_dp0.json", "wb") as f:
        f.write(good[:-1])
        f.seek(64 << 20)  # a 64 MB hole, then the closing brace
        f.write(good[-1:])
    p = subprocess.run(["tar", "-S", "-czf", str(tmp / "sparse.tgz"), "-C", str(tmp / "sparse-src"), "flashinfer"],
                       capture_output=True)
    if p.returncode == 0:
        out.append(("sparse member (64 MB hole)", (tmp / "sparse.tgz").read_bytes()))
    return out


def link_archives(tmp: Path) -> Row:
    """Archives whose members are symlinks or hardlinks (to a victim file outside the tree, through
    ``..``, to another member), device nodes, FIFOs, ``..`` and absolute names, a directory
    where a rank file goes, and a GNU sparse member: each given to ``import``, and each as a
    store bundle (a record with its true sha256, so only the contents can refuse it) given to
    ``pull``. Checks: exit 1 and nothing installed (wrong installs); the victim dir next to the
    tree unchanged and nothing written outside the destination (escapes); no staging left."""
    row = Row()
    work = tmp / "links"
    victim = work / "victim"
    victim.mkdir(parents=True)
    (victim / "keep.json").write_text('{"keep": 1}')
    env = {"XDG_CACHE_HOME": str(work / "xdg")}
    src = work / "src"
    _tree_entries("lnk", src, 1)
    store = work / "store"
    assert cli("push", f"file://{store}", "--cache-dir", src, env=env).returncode == 0
    rec_path = next((store / "index").rglob("*.json"))
    honest_rec = json.loads(rec_path.read_text())
    before = _snapshot(victim)
    outside = set(os.listdir(work))
    for what, data in _link_archives(work, victim):
        (work / "a.tgz").write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        bundle = honest_rec["bundle"].rsplit("/", 1)[0] + f"/{sha}.tar.gz"
        (store / bundle).write_bytes(data)
        rec_path.write_text(json.dumps({**honest_rec, "bundle": bundle, "sha256": sha, "size": len(data)}))
        for cmd in (["import", work / "a.tgz", "--cache-dir", work / "dest"],
                    ["pull", f"file://{store}", "--any-env", "--cache-dir", work / "dest"]):
            row["attempts"] += 1
            where = f"{what}: {cmd[0]}"
            p = row.proc(cli(*cmd, env=env))
            got = _rank_bytes(work / "dest") if (work / "dest").exists() else {}
            if p is not None and (p.returncode != 1 or got):
                row.fail("wrong installs", f"{where}: exit {p.returncode}, {len(got)} entries installed: "
                                           f"{p.stderr.decode(errors='replace').strip()[-150:]}")
            row.fail("leftovers", f"{where}: staging left in the destination", leftovers(work / "dest"))
            if _snapshot(victim) != before or set(os.listdir(work)) - outside - {"a.tgz", "dest", "sparse-src", "sparse.tgz"}:
                row.fail("escapes", f"{where}: a file outside the destination was written or changed")
                (victim / "keep.json").write_text('{"keep": 1}')
                before = _snapshot(victim)
            shutil.rmtree(work / "dest", ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    return row


# --- 8 processes at once on one tree and one store, some killed at random ----------------------------

def concurrent_kills(tmp: Path, rounds: int, rng: random.Random) -> Row:
    """Each round: a tree with 3 entries nobody deletes (``keep``), 2 to be deleted and 2 of
    0.7.1, a file:// store with 3 entries, an archive of 3 more; 8 commands at once - import,
    import --force, push, pull, rm -y of the 2, prune of 0.7.1, export, rm URL of one store
    entry - and 3 of them SIGKILLed after 0.05-1.5 s. Then: files parse (corrupt), ``keep``
    there and complete (lost, half); each killed command run again must exit 0 (unfinished);
    then no trash/stage/journal in the tree, no temp file or bundle without a record in the store
    (leftovers)."""
    row = Row()
    base = tmp / "ck-base"
    keep = _tree_entries("ckk", base / "tree", 3)
    gone = _tree_entries("ckg", base / "tree", 2, seed0=10)
    _tree_entries("cko", base / "tree", 2, version="0.7.1", seed0=20)
    s_ids = _tree_entries("cks", base / "ssrc", 3, seed0=30)
    _tree_entries("cka", base / "asrc", 3, seed0=40)
    env = {"XDG_CACHE_HOME": str(base / "xdg")}
    assert cli("push", f"file://{base / 'store'}", "--cache-dir", base / "ssrc", env=env).returncode == 0
    assert cli("export", "-o", base / "a.tgz", "--cache-dir", base / "asrc", env=env).returncode == 0
    for r in range(rounds):
        work = tmp / f"ck-{r}"
        shutil.copytree(base, work, symlinks=True)
        tree, url = work / "tree", f"file://{work / 'store'}"
        cmds = [["import", work / "a.tgz", "--cache-dir", tree], ["import", work / "a.tgz", "--force", "--cache-dir", tree],
                ["push", url, "--cache-dir", tree], ["pull", url, "--any-env", "--cache-dir", tree],
                ["rm", "-y", *gone, "--cache-dir", tree], ["prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", tree],
                ["export", "-o", work / "out.tgz", "--cache-dir", tree], ["rm", url, s_ids[r % 3], "-y"]]
        cenv = {**os.environ, "XDG_CACHE_HOME": str(work / "xdg")}
        procs = [subprocess.Popen([sys.executable, "-m", "fi_autotune_cli", *map(str, c)], cwd=REPO, env=cenv,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
        victims = rng.sample(range(len(cmds)), 3)
        t0 = time.monotonic()
        for i in sorted(victims, key=lambda _: rng.random()):
            time.sleep(max(0.0, rng.uniform(0.05, 1.5) - (time.monotonic() - t0)))
            procs[i].send_signal(signal.SIGKILL)
        killed = []
        for i, p in enumerate(procs):
            row["attempts"] += 1
            try:
                _, err = p.communicate(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                p.kill()
                row.fail("hangs", f"round {r}: {cmds[i][0]} ran past {TIMEOUT} s")
                continue
            if b"Traceback" in err:
                row.fail("tracebacks", f"round {r} {cmds[i][0]}: {err.decode(errors='replace')[-300:]}")
            if p.returncode == -signal.SIGKILL:
                row["kills"] += 1
                killed.append(i)
        where = f"round {r} (killed: {[' '.join(map(str, cmds[i][:2])) for i in killed]})"
        _check_tree(tree, row, where, keep=keep)
        _check_store(work / "store", row, where, keep=[])
        for i in killed:
            again = row.proc(cli(*cmds[i], env={"XDG_CACHE_HOME": str(work / "xdg")}))
            if again is not None and again.returncode != 0:
                err = again.stderr.decode(errors="replace").strip()
                row.fail("unfinished", f"{where}: the re-run of {' '.join(map(str, cmds[i][:2]))} exited "
                                       f"{again.returncode}: {err[-160:]}")
        _check_tree(tree, row, where, keep=keep)
        row.fail("leftovers", f"{where}: trash/stage/journal in the tree after the re-runs", leftovers(tree))
        _check_store(work / "store", row, where, keep=[], final=True)
        shutil.rmtree(work, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="The CI form: a few of each trial.")
    ap.add_argument("--long", action="store_true", help="Every attack: the trials above plus exact-syscall kills, "
                    "hostile servers, look-alike names, edited store records, hostile archives, kills under load.")
    ap.add_argument("--quick", action="store_true", help="With --long: a few points of each family (development).")
    ap.add_argument("--only", default="", help="Comma-separated substrings of row names to run (e.g. 'exact,http').")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    sizes = dict(rounds=3, kills=6, steps=1, hostile=10, cap=4, ck=3) if args.short or args.quick else \
        dict(rounds=50, kills=102, steps=3, hostile=60)
    if args.long and not args.quick:  # every attack within about 25 minutes on 2 cores: fewer of the tree trials
        sizes.update(rounds=10, kills=60, hostile=30, cap=45, ck=8)
    out = Path(args.out or (REPO / "docs" / "results" / "reliability_long.json" if args.long and not args.quick
                            else REPO / "benchmarks" / "results" / "reliability.json"))
    only = [o.strip() for o in args.only.split(",") if o.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="fi-autotune-reliability-"))
    trials: list[tuple[str, object]] = []
    if not args.long or not args.quick:
        trials += [("concurrency (8 processes/round)", lambda: concurrency(tmp, sizes["rounds"])),
                   ("SIGKILL at random times", lambda: kill_at_random(tmp, sizes["kills"], rng)),
                   ("SIGKILL at exact steps", lambda: kill_at_steps(tmp, sizes["steps"])),
                   ("malformed trees x 8 commands", lambda: (seeded(tmp, 1, "good"), malformed_trees(tmp))[1]),
                   ("hostile archives", lambda: hostile_archives(tmp, rng, sizes["hostile"]))]
    if args.long:
        for case in EXACT_CASES:
            trials.append((f"exact syscall kills: {case.name}", lambda case=case: exact_syscall_kills(tmp, case(), sizes["cap"])))
        trials.append(("hostile HTTP servers x 3 commands", lambda: hostile_http(tmp, random.Random(args.seed + 1))))
        trials.append(("look-alike names x 3 layouts", lambda: look_alike_names(tmp)))
        trials.append(("edited store records (file://, S3)", lambda: edited_records(tmp, moto())))
        trials.append(("archives: links, devices, .., sparse", lambda: link_archives(tmp)))
        trials.append(("8 commands at once, 3 killed", lambda: concurrent_kills(tmp, sizes["ck"], rng)))
    servers: list[MotoServer] = []

    def moto() -> MotoServer | None:
        if not servers:
            try:
                import moto as _  # noqa: F401
            except ImportError:
                return None
            servers.append(MotoServer(tmp))
        return servers[0]

    rows: dict[str, Row] = {}
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    background = {"hostile HTTP servers x 3 commands"}  # mostly waiting on timeouts: beside the others
    results: dict[str, Row] = {}

    def one(name, run):
        t1 = time.perf_counter()
        results[name] = run()
        times[name] = time.perf_counter() - t1
        print(f"  {name}: {dict(results[name])} ({times[name]:.0f} s)", file=sys.stderr, flush=True)

    try:
        chosen = [(n, r) for n, r in trials if not only or any(o in n for o in only)]
        threads = [threading.Thread(target=one, args=t) for t in chosen if t[0] in background]
        for t in threads:
            t.start()
        for name, run in chosen:
            if name not in background:
                one(name, run)
        for t in threads:
            t.join()
        rows.update((n, results[n]) for n, _ in chosen if n in results)
    finally:
        for s in servers:
            s.close()
        shutil.rmtree(tmp, ignore_errors=True)
    total = Row()
    for r in rows.values():
        for c in COLUMNS:
            total[c] += r[c]
    rows["total"] = total
    width = max(len(n) for n in rows) + 2
    print(f"{'trial':<{width}}" + "".join(f"{c:>{max(len(c), 5) + 2}}" for c in COLUMNS))
    for name, r in rows.items():
        print(f"{name:<{width}}" + "".join(f"{r[c]:>{max(len(c), 5) + 2}}" for c in COLUMNS))
    for name, r in rows.items():
        for d in r.details:
            print(f"  {name}: {d}")
    failures = sum(total[c] for c in FAILURES)
    took = time.perf_counter() - t0
    print(f"{took:.0f} s; {total['kills']} kills; failures: {failures} ({'target met' if failures == 0 else 'TARGET MISSED'})")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"short": args.short, "long": args.long, "quick": args.quick, "only": only,
                               "seed": args.seed, "seconds": round(took), "columns": list(COLUMNS),
                               "rows": {n: {**r, "seconds": round(times.get(n, took)), "details": r.details}
                                        for n, r in rows.items()}}, indent=2))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
