"""Issue 23: a cache manager people trust at a glance - no deletes on a slip, honest statuses and
footers, Ctrl-C that exits 130. Real processes on real trees."""

from __future__ import annotations

import pytest

from tests.synthetic import write_fake_entry

from ..conftest import run_cli

#: Every command that takes a duration (the shared filter options).
DURATION_COMMANDS = [["ls"], ["prune", "--dry-run"], ["export", "-o", "-"], ["push", "file:///nonexistent-store"]]


@pytest.mark.parametrize("cmd", DURATION_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("option", ["--older-than", "--unused-for"])
def test_a_bare_number_is_a_usage_error_suggesting_days(root, cmd, option):
    """`--older-than 30` read as 30 seconds would select every entry for deletion."""
    write_fake_entry(root)
    proc = run_cli(*cmd, option, "30", "--cache-dir", str(root))
    assert proc.returncode == 2, proc.stderr
    assert "no unit" in proc.stderr and "30d" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("text", ["2y", "1mo", "3 months"])
def test_an_unknown_unit_names_the_accepted_ones(root, text):
    write_fake_entry(root)
    proc = run_cli("prune", "--older-than", text, "--dry-run", "--cache-dir", str(root))
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "unknown duration unit" in line, line
    for unit in ("s (seconds)", "m (minutes)", "h (hours)", "d (days)", "w (weeks)"):
        assert unit in line


def test_durations_with_units_still_select(root):
    write_fake_entry(root)
    for text in ("30d", "12h", "90m", "45s", "2w", "1.5d"):
        proc = run_cli("ls", "-q", "--older-than", text, "--cache-dir", str(root))
        assert proc.returncode == 0, (text, proc.stderr)
