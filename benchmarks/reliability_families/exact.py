"""Kills at exact syscalls (strace): every mutating call of each tree and store command."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .common import COLUMNS, REPO, Row, TIMEOUT, cli, corrupt_files, leftovers, statuses
from .trials import finish_with_a_writer

from autotune_cache.tree.layouts.own_names import TEMP_FILE_RE
from devtools.synthetic import default_fields, write_fake_entry


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
