"""Reliability trials of the tree commands, counted: real processes, real kills, real files.

    python benchmarks/reliability.py            # long form: >= 100 kills, >= 50 rounds
    python benchmarks/reliability.py --short    # what CI runs (tests/tree/test_stress.py)

Trials, each a row of the table:

* concurrency: rounds of 8 processes (3 writers, 2 pruners, 3 importers) on one tree;
* kill at random times: ``import`` of a 30-entry archive, ``prune`` of 6 entries and a ``warm``-like
  writer, each SIGKILLed after a random delay, then checked with ``ls`` (which finishes any
  interrupted write) and repaired by re-running the command;
* kill at exact steps: every crash point of the write and delete paths
  (``FI_AUTOTUNE_CRASH_AT``), with and without ``RENAME_EXCHANGE``;
* malformed trees x 8 commands; hostile archives.

Columns: attempts, corrupt (a rank file or manifest an engine or ls could read that does not
parse), lost (a complete entry that should be there and is not), half (an entry partly written or
partly deleted, or an archive partly installed), leftovers (staging/trash/journal after the next
command), tracebacks, hangs (over 60 s). The target is zero in every failure column.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autotune_cache.registry import default_layout  # noqa: E402
from autotune_cache.tree.layout import MANIFEST_NAME, STAGE_DIR_RE, TEMP_FILE_RE, TRASH_DIR_RE  # noqa: E402
from autotune_cache.tree.manifest import Manifest  # noqa: E402
from autotune_cache.autotuner.rankfile import parse_cache_bytes  # noqa: E402
from tests.synthetic import DEFAULT_METADATA, cache_file_bytes, default_fields, fake_configs, write_fake_entry  # noqa: E402

SG = default_layout()
COLUMNS = ("attempts", "corrupt", "lost", "half", "leftovers", "tracebacks", "hangs")
TIMEOUT = 60


def cli(*args, env=None, input=None) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run([sys.executable, "-m", "fi_autotune_cli", *map(str, args)], cwd=REPO, capture_output=True,
                              env={**os.environ, **(env or {})}, input=input, timeout=TIMEOUT)
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
    subprocess.run([sys.executable, "-m", "tests._workers", "seed", str(src)], cwd=REPO, check=True)
    archive = tmp / "conc.tgz"
    assert cli("export", "-o", archive, "--cache-dir", src).returncode == 0
    expected = sorted(statuses(src, row))
    for r in range(rounds):
        root = tmp / f"conc-{r}"
        procs = ([("writer", 3, i) for i in range(3)] + [("pruner", 4, i) for i in range(2)]
                 + [("importer", 3, i) for i in range(3)])
        running = [subprocess.Popen([sys.executable, "-m", "tests._workers", mode, str(root), str(n),
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
            p = subprocess.Popen([sys.executable, "-m", "tests._workers", "forever", str(root), "0", str(i)], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            p.stdout.readline()
        time.sleep(rng.uniform(0.05, 0.9 if kind == "import" else 0.5))
        p.send_signal(signal.SIGKILL)
        p.wait()
        row["corrupt"] += corrupt_files(root)
        now = statuses(root, row)  # finishes an interrupted import
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


CRASH_POINTS = [("txn.staged_file:3", {}), ("txn.journaled", {}), ("txn.exchanged:1", {}), ("txn.exchanged:2", {}),
                ("txn.swapped:2", {}), ("txn.unjournaled", {}), ("txn.between_renames:1", {"FI_AUTOTUNE_NO_EXCHANGE": "1"}),
                ("txn.between_renames:3", {"FI_AUTOTUNE_NO_EXCHANGE": "1"})]


def kill_at_steps(tmp: Path, repeats: int) -> Row:
    row = Row()
    _, archive, eids = seeded(tmp, 5, "step")
    for rep in range(repeats):
        for point, env in CRASH_POINTS:
            root = tmp / f"step-{rep}-{point.replace(':', '_')}"
            for i in range(3):  # old versions of three of the archive's entries are there
                write_fake_entry(root, fields=default_fields(f"org/step{i}", tp=2, dp=2), arch="sm90", seed=50 + i,
                                 buckets=(1, 2))
            before = statuses(root, row)
            row["attempts"] += 1
            p = row.proc(cli("import", archive, "--force", "--cache-dir", root, env={"FI_AUTOTUNE_CRASH_AT": point, **env}))
            if p is not None and p.returncode != -signal.SIGKILL:
                row.fail("half", f"{point}: never reached (exit {p.returncode})")  # the trial would prove nothing
            row["corrupt"] += corrupt_files(root)
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
            row.proc(cli("prune", "--flashinfer-version", "0.7.1", "-y", "--cache-dir", root,
                         env={"FI_AUTOTUNE_CRASH_AT": f"prune.renamed:{n}"}))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="The CI form: a few of each trial.")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "reliability.json"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    sizes = dict(rounds=3, kills=6, steps=1, hostile=10) if args.short else dict(rounds=50, kills=102, steps=3, hostile=60)
    tmp = Path(tempfile.mkdtemp(prefix="fi-autotune-reliability-"))
    rows: dict[str, Row] = {}
    t0 = time.perf_counter()
    try:
        rows["concurrency (8 processes/round)"] = concurrency(tmp, sizes["rounds"])
        rows["SIGKILL at random times"] = kill_at_random(tmp, sizes["kills"], rng)
        rows["SIGKILL at exact steps"] = kill_at_steps(tmp, sizes["steps"])
        seeded(tmp, 1, "good")
        rows["malformed trees x 8 commands"] = malformed_trees(tmp)
        rows["hostile archives"] = hostile_archives(tmp, rng, sizes["hostile"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = Row()
    for r in rows.values():
        for c in COLUMNS:
            total[c] += r[c]
    rows["total"] = total
    print(f"{'trial':<34}" + "".join(f"{c:>11}" for c in COLUMNS))
    for name, r in rows.items():
        print(f"{name:<34}" + "".join(f"{r[c]:>11}" for c in COLUMNS))
    for name, r in rows.items():
        for d in r.details:
            print(f"  {name}: {d}")
    failures = sum(total[c] for c in COLUMNS if c != "attempts")
    print(f"{time.perf_counter() - t0:.0f} s; failures: {failures} ({'target met' if failures == 0 else 'TARGET MISSED'})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"short": args.short, "seed": args.seed, "rows": rows}, indent=2))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
