"""The reliability benchmark's short form (benchmarks/reliability.py --short): zero in every
failure column. The long form (>= 100 kills, >= 50 rounds) runs locally; its table is in
docs/reliability.md."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # about 2 minutes on 2 cores: CI runs it (.ci/run), the README's command does not


def test_reliability_short_form_has_no_failures(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "reliability.py"), "--short",
                           "--out", str(tmp_path / "reliability.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "failures: 0 (target met)" in proc.stdout
