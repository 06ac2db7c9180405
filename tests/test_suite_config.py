"""The suite's own machinery works as pyproject.toml says: ``--dist loadgroup`` keeps an
``xdist_group`` in one process (the GPU tests share one GPU one at a time; session fixtures are
built once per group). pytest 9.2 with xdist 3.8.0 silently spread a group over every worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GROUPED = '''
import os, pytest, time

@pytest.mark.parametrize("i", range(6))
@pytest.mark.xdist_group("one")
def test_grouped(i):
    time.sleep(0.05)
    with open(os.environ["OUT"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
'''


def test_an_xdist_group_runs_in_one_worker(tmp_path: Path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    out = tmp_path / "workers.txt"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-n", "2",
                        "--dist", "loadgroup", "-o", "addopts=", str(tmp_path / "test_grouped.py")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**__import__("os").environ,
                                                                                       "OUT": str(out)})
    assert p.returncode == 0, p.stdout + p.stderr
    workers = out.read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, f"one xdist group ran on {sorted(set(workers))}"
