"""docs/deploy.md's recipes, run: every ``# recipe:`` shell block, in order, against a real S3
server on loopback. GPU steps (``fi-autotune env`` and ``warm`` on the GPU box) are stood in for
by tests/standins/deploy_steps.py where no GPU exists; everything else runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import GPU_STEPS, REPO
from ..support.zygotes import cli_on_path

DOC = REPO / "docs" / "deploy.md"
BLOCK_RE = re.compile(r"```bash\n(# recipe: (?P<name>[\w-]+) (?P<step>\d+)/(?P<steps>\d+) \((?P<where>[^)]*)\)\n.*?)```", re.S)

STANDIN = (
    'fi-autotune() { case "$1" in env|warm) "$FI_GPU_STEPS" "$@";; '
    '*) command fi-autotune "$@";; esac; }\n'
)


def recipes() -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list] = {}
    for m in BLOCK_RE.finditer(DOC.read_text()):
        out.setdefault(m["name"], []).append((m["where"], m.group(1)))
    return out


def test_every_recipe_has_its_blocks():
    found = recipes()
    assert set(found) == {"docker", "github-actions", "kubernetes", "slurm"}
    for name, blocks in found.items():
        steps = [int(m["step"]) for m in BLOCK_RE.finditer(DOC.read_text()) if m["name"] == name]
        assert steps == list(range(1, len(blocks) + 1)), name


@pytest.mark.parametrize("name", sorted(recipes()))
def test_recipe_runs(name, s3, tmp_path):  # noqa: F811 - fixture
    work = tmp_path / name
    work.mkdir()
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, **s3["env"], "STORE": s3["url"],
           "PATH": f"{bindir}:{os.environ['PATH']}", "SGLANG_CACHE_DIR": str(work / "engine-cache")}
    # the recipe's `fi-autotune` lines (the installed console script) and the GPU steps' stand-in
    # ($FI_GPU_STEPS), each a process forked by the test process's CLI fork server
    # (tests/support/zygotes.py cli_on_path) rather than a fresh interpreter
    with cli_on_path(env, GPU_STEPS) as env:
        for where, block in recipes()[name]:
            gpu = "GPU" in where and "no GPU" not in where
            script = "set -euo pipefail\n" + (STANDIN if gpu else "") + block
            proc = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, f"{name} ({where}) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            assert "Traceback" not in proc.stderr
