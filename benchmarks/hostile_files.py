"""The reliability benchmark's hostile-files family (issue 44): every command that opens a path,
given one that is not what it expects, under a deadline.

    python benchmarks/hostile_files.py [--deadline 20] [--out docs/results/hostile_files_<date>.json]

Each case is a real ``fi-autotune`` process with a path (or a tree holding one) that is a FIFO
with no writer, ``/dev/zero``, a symlink to it, a sparse 4 GiB file, JSON nested 200,000 deep, or
garbage; plus served workers' ``state.json`` as each of those. Counted per case: a *hang* (no
exit within the deadline: killed), an *unbounded read* (the process's peak RSS over 512 MiB,
read per process from ``wait4``), an *internal error* (a traceback or "internal error" in its
output) and whether it ended in one line with a non-zero status where it must refuse. Stores
with slow headers and bodies are tests/tree/store/test_store_deadlines.py's (a server per case).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools.synthetic import write_fake_entry  # noqa: E402

RSS_LIMIT_KB = 512 * 1024


def _hostile(kind: str, path: Path) -> Path:
    """Make ``path`` hostile of ``kind``; the path to give the command."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        return Path("/dev/zero")
    elif kind == "symlink-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "sparse-4g":
        with open(path, "wb") as f:
            f.truncate(4 << 30)
    elif kind == "deep-json":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif kind == "garbage":
        path.write_bytes(os.urandom(4096))
    return path


KINDS = ("fifo", "dev-zero", "symlink-dev-zero", "sparse-4g", "deep-json", "garbage")


def _run(argv: list[str], env: dict, deadline: float) -> dict:
    """The command in its own process; its own peak RSS from ``wait4`` (polled, so the deadline
    holds: ``subprocess`` would reap the child and lose its rusage)."""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", "fi_autotune_cli", *argv], cwd=REPO, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        hang, status, usage = False, None, None
        while status is None:
            pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                status, usage = st, ru
            elif time.perf_counter() - t > deadline:
                hang = True
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
            else:
                time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    rss_kb = usage.ru_maxrss
    return {"argv": argv, "seconds": round(time.perf_counter() - t, 2), "code": proc.returncode, "hang": hang,
            "rss_mb": round(rss_kb / 1024, 1), "unbounded": rss_kb > RSS_LIMIT_KB,
            "internal": "Traceback" in stdout + stderr or "internal error" in stdout + stderr,
            "lines": len(stderr.strip().splitlines()), "stderr": stderr[-300:]}


def cases(work: Path) -> list[tuple[str, str, list[str], dict]]:
    """(family, kind, argv, extra env) for every hostile path."""
    out = []
    for kind in KINDS:
        d = work / f"doctor-{kind}"
        out.append(("doctor LOG", kind, ["doctor", str(_hostile(kind, d / "boot.log"))], {}))
        t = work / f"targets-{kind}"
        out.append(("check --targets FILE", kind, ["check", "--targets", str(_hostile(kind, t / "targets.yaml")),
                                                   "--arch", "sm90"], {}))
        e = work / f"env-{kind}"
        out.append(("check --env-from FILE", kind, ["check", "--env-from", str(_hostile(kind, e / "env.json")),
                                                    "--model", "Qwen/Qwen3-30B-A3B", "--arch", "sm90"], {}))
        tree = work / f"tree-{kind}"
        eid = write_fake_entry(tree, arch="sm90")
        entry_dir = tree / "flashinfer" / "autotune" / eid.path_str
        rank = sorted(entry_dir.glob("rank_*.json"))[0]
        _hostile(kind, rank)
        for cmd in (["ls"], ["show", str(eid)], ["prune", "--older-than", "1d", "--dry-run"]):
            out.append((f"{cmd[0]} (a rank file)", kind, [*cmd, "--cache-dir", str(tree)], {}))
        manifest = work / f"manifest-{kind}"
        eid = write_fake_entry(manifest, arch="sm90")
        _hostile(kind, manifest / "flashinfer" / "autotune" / eid.path_str / "fi-autotune.json")
        out.append(("ls (a manifest)", kind, ["ls", "--cache-dir", str(manifest)], {}))
        home = work / f"home-{kind}"
        state = home / ".cache" / "fi-autotune" / "workers" / "state.json"
        _hostile(kind, state)
        out.append(("workers status (state.json)", kind, ["workers", "status"], {"HOME": str(home),
                                                                                 "XDG_CACHE_HOME": str(home / ".cache")}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deadline", type=float, default=20.0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fi-hostile-"))
    rows = []
    for family, kind, argv, extra in cases(work):
        env = {**os.environ, "SGLANG_CACHE_DIR": str(work / "default-root"), **extra}
        r = _run(argv, env, a.deadline)
        rows.append({"family": family, "kind": kind, **r})
    print(f"{'command':<30} {'path':<18} {'exit':>4} {'s':>6} {'RSS MB':>7}  verdict")
    for r in rows:
        bad = [w for w in ("hang", "unbounded", "internal") if r[w]]
        print(f"{r['family']:<30} {r['kind']:<18} {str(r['code']):>4} {r['seconds']:>6.2f} {r['rss_mb']:>7.1f}  "
              + (" ".join(bad) if bad else "ok"))
    totals = {w: sum(r[w] for r in rows) for w in ("hang", "unbounded", "internal")}
    print(f"\n{len(rows)} cases: {totals['hang']} hangs, {totals['unbounded']} unbounded reads, "
          f"{totals['internal']} internal errors (deadline {a.deadline:g} s, RSS limit {RSS_LIMIT_KB // 1024} MiB)")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"deadline_s": a.deadline, "totals": totals, "cases": rows}, indent=2))
    sys.exit(1 if any(totals.values()) else 0)


if __name__ == "__main__":
    main()
