"""Issue 45: one eviction order for every budget (``prune --max-size``, ``--keep-latest`` and
their mix): what no engine of this environment can read goes first (corrupt, diverged, other
FlashInfer versions, other archs, then stale), the installed version's complete entries last, by
last use within a class. Real processes, real trees of two versions."""

from __future__ import annotations

import os
import time
from importlib.metadata import version

from devtools.synthetic import default_fields, entry_path, write_fake_entry

from ..conftest import run_cli, run_json

INSTALLED = version("flashinfer-python")  # what the engine of this environment reads


def _use(root, eid, days_ago: float, written_days_ago: float = 30) -> None:
    now = time.time()
    for p in entry_path(root, eid).iterdir():
        os.utime(p, (now - days_ago * 86400, now - written_days_ago * 86400))


def _sizes(root) -> dict[str, int]:
    return {e["id"]: e["size_on_disk"] for e in run_json("ls", "--cache-dir", str(root))["entries"]}


def test_max_size_evicts_another_version_before_the_installed_one_used_earlier(root):
    """The issue's case: an installed-version entry read 5 days ago, an 0.6.9 entry imported just
    now, room for one: the 0.6.9 entry goes, the one the engine reads stays."""
    here = write_fake_entry(root, fields=default_fields("A", tp=2, dp=1), flashinfer_version=INSTALLED, seed=1)
    old = write_fake_entry(root, fields=default_fields("B", tp=2, dp=1), flashinfer_version="0.6.9", seed=2)
    _use(root, here, 5)
    _use(root, old, 0.001, written_days_ago=0.001)
    sizes = _sizes(root)
    budget = max(sizes.values())
    plan = run_json("prune", "--max-size", f"{budget}B", "--dry-run", "--cache-dir", str(root))
    assert [e["id"] for e in plan["plan"]["entries"]] == [str(old)]
    proc = run_cli("prune", "--max-size", f"{budget}B", "-y", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert run_cli("ls", "-q", "--cache-dir", str(root)).stdout.split() == [str(here)]
