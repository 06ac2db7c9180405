"""Files a user names to a command other than doctor - the serving image's fingerprint
(``--env-from``) and a fleet's targets file (``--targets``) - are opened as doctor's logs are
(``autotune_cache/safeopen.py``): a FIFO with no writer, ``/dev/zero`` or a link to it is refused
in one line (exit 2) before its first byte is read. Each command runs under a deadline, so a
regression fails here rather than hangs the suite."""

from __future__ import annotations

import os

import pytest

from ..conftest import run_cli

DEADLINE_S = 20
QWEN = ["--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--arch", "sm90"]


def _refused(args: list[str], needle: str) -> None:
    proc = run_cli(*args, timeout=DEADLINE_S)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", [
    lambda p: ["check", *QWEN, "--env-from", p],
    lambda p: ["plan", "--targets", p],
    lambda p: ["check", "--targets", p],
], ids=["env-from", "plan-targets", "check-targets"])
def test_a_fifo_or_a_device_named_as_a_file_is_refused_before_it_is_read(tmp_path, command):
    fifo = tmp_path / "named.json"
    os.mkfifo(fifo)
    _refused(command(str(fifo)), "is a FIFO, not a regular file")
    if os.path.exists("/dev/zero"):
        link = tmp_path / "zero.json"
        link.symlink_to("/dev/zero")
        _refused(command(str(link)), "is a character device, not a regular file")
