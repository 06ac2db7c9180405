"""What every reliability family shares: the command runner, the row, and the tree checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from autotune_cache.registry import default_layout  # noqa: E402
from autotune_cache.tree.layouts.own_names import MANIFEST_NAME, STAGE_DIR_RE, TEMP_FILE_RE, TRASH_DIR_RE  # noqa: E402
from autotune_cache.tree.manifest import Manifest  # noqa: E402
from autotune_cache.autotuner.rankfile import parse_cache_bytes  # noqa: E402
from devtools.synthetic import default_fields, write_fake_entry  # noqa: E402


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
