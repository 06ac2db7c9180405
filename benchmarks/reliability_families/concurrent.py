"""8 processes at once on one tree and one store, some killed at random."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .common import REPO, Row, TIMEOUT, cli, leftovers
from .exact import _check_store, _check_tree, _tree_entries


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
