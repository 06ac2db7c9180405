"""Faults come only through the test launcher (tests/standins/fault_cli.py), never from the environment.

The library's crash points and its RENAME_EXCHANGE switch (``autotune_cache.tree.crashsafe.faults``) are
inert until a launcher installs a hook in its own process; ``fi-autotune`` itself reads no
variable for them, so a user's environment can never make it kill itself mid-commit or commit
another way. Real processes, real files: the launcher runs the real CLI."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from devtools.synthetic import default_fields, write_fake_entry

from tests.standins.fault_cli import crash_at
from tests.conftest import run_cli
from tests.tree.crashsafe.test_reliability import finish_with_a_writer, leftovers, listed, seeded_archive

#: what once turned fault injection on; now nothing reads them
OLD_VARIABLES = {"FI_AUTOTUNE_CRASH_AT": "txn.journaled", "FI_AUTOTUNE_NO_EXCHANGE": "1"}


def replacing(tmp_path: Path, name: str = "dest") -> tuple[Path, list[str], Path]:
    """An archive of two entries and a tree ``name`` holding older versions of both: importing it
    with ``--force`` swaps both in (RENAME_EXCHANGE, or the journaled pair of renames without it)."""
    archive, eids = seeded_archive(tmp_path, 2, f"{name}.tgz")
    root = tmp_path / name
    for i in (0, 1):
        write_fake_entry(root, fields=default_fields(f"org/m{i}", tp=2, dp=2), arch="sm90", seed=99, buckets=(1, 2))
    return archive, eids, root


def test_a_crash_point_in_the_environment_kills_nothing(tmp_path):
    archive, eids, root = replacing(tmp_path)
    plain = run_cli("import", str(archive), "--force", "--cache-dir", str(root), env=OLD_VARIABLES)
    assert plain.returncode == 0, plain.stderr
    assert listed(root) == {e: "complete" for e in eids} and leftovers(root) == []
    # the step is reached: the launcher, told to, is killed there
    archive, eids, root = replacing(tmp_path, "again")
    killed = run_cli("import", str(archive), "--force", "--cache-dir", str(root), launcher=crash_at("txn.journaled"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr


@pytest.mark.parametrize("no_exchange,env,killed", [
    (True, {}, True),  # the launcher's --no-exchange: the pair of renames, so the step is reached
    (False, {}, False),  # RENAME_EXCHANGE: one syscall, no step between two renames
    (False, OLD_VARIABLES, False),  # the old variable turns nothing off
])
def test_only_the_launcher_turns_rename_exchange_off(tmp_path, no_exchange, env, killed):
    archive, eids, root = replacing(tmp_path)
    proc = run_cli("import", str(archive), "--force", "--cache-dir", str(root), env=env,
                   launcher=crash_at("txn.between_renames", no_exchange=no_exchange))
    assert proc.returncode == (-signal.SIGKILL if killed else 0), proc.stderr
    finish_with_a_writer(root)  # killed after the journal: ls changes nothing, the next writer finishes
    assert listed(root) == {e: "complete" for e in eids}


def test_the_launcher_is_the_real_command_line(tmp_path):
    """With no fault asked, the launcher is ``fi-autotune``: same output, same exit codes."""
    root = tmp_path / "tree"
    write_fake_entry(root)
    for args in (("ls", "--json", "--cache-dir", str(root)),  # (the table says "5s ago": not comparable)
                 ("show", "no/such/entry", "--cache-dir", str(root)), ("ls", "--no-such-option")):
        plain, launched = run_cli(*args), run_cli(*args, launcher=crash_at())
        assert (launched.returncode, launched.stdout, launched.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert run_cli("ls", "--no-such-option", launcher=crash_at()).returncode == 2
