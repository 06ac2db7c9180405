"""Archives with links, device nodes, ``..`` and sparse members (import and pull)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from .common import Row, cli, leftovers
from .exact import _tree_entries
from .http import _rank_bytes, _snapshot

from devtools.synthetic import DEFAULT_METADATA, cache_file_bytes, fake_configs


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
