"""``doctor`` on paths that are not log files: a FIFO with no writer, ``/dev/zero``, a link to
it, a sparse giant. Each is refused in one line before its first byte is read (exit 2); the
command runs under a deadline, so a regression fails here rather than hangs the suite."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from ..conftest import run_cli

#: Far above what a refusal takes (an open, an fstat); far below "for ever".
DEADLINE_S = 20


def _refused(path: str, needle: str) -> None:
    t0 = time.monotonic()
    proc = run_cli("doctor", path, timeout=DEADLINE_S)
    took = time.monotonic() - t0
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "internal error" not in proc.stderr and took < DEADLINE_S


def test_fifo_without_writer_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "server.log"
    os.mkfifo(fifo)
    _refused(str(fifo), "is a FIFO, not a log file")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_dev_zero_is_refused_not_read_until_memory_runs_out(tmp_path):
    _refused("/dev/zero", "is a character device, not a log file")
    link = tmp_path / "zero.log"
    link.symlink_to("/dev/zero")
    _refused(str(link), "is a character device, not a log file")


def test_log_over_the_cap_is_refused_before_it_is_read(tmp_path):
    giant = tmp_path / "giant.log"
    with open(giant, "wb") as f:  # sparse: 1 GiB + 1 byte on no disk
        f.truncate((1 << 30) + 1)
    _refused(str(giant), "is over 1 GiB")


# --- a tuning pass whose bars cannot be read whole is still a tuning pass (issue 44) ---------------------

LOGS = Path(__file__).resolve().parents[1] / "data" / "engine_logs"
_BAR = re.compile(r"\[AutoTuner\]: Tuning ")


def _cut_after_percentage(line: str) -> str:
    return _BAR.sub(lambda m: m[0], re.sub(r"(\[AutoTuner\]: Tuning \S+: +\d+%)[^\[\r\n]*", r"\1", line))


MANGLE = {
    "cut after the percentage": _cut_after_percentage,
    "cut mid-bar": lambda line: re.sub(r"(\[AutoTuner\]: Tuning \S+: +\d+%\|[^|]{0,3})[^\[\r\n]*", r"\1", line),
    "redraws by CR, cut": lambda line: "\r".join("[AutoTuner]: Tuning " + p[: max(8, len(p) // 3)]
                                                 for p in line.split("[AutoTuner]: Tuning ")[1:]),
    "ANSI and garbage between": lambda line: line.replace("%|", "%\x1b[2K\x1b[1A|\x00\x7f").replace("| ", "|?? "),
    "another process writing into it": lambda line: line.replace("%|", "% [pod] hello |").replace("/21 [", "/2X1 ["),
}


def _mangled(tmp_path, how: str) -> Path:
    src = (LOGS / "sglang-miss-other-tp.log").read_text().split("\n")
    out = [MANGLE[how](ln) if "[AutoTuner]: Tuning" in ln else ln for ln in src]
    log = tmp_path / "mangled.log"
    log.write_text("\n".join(out))
    return log


@pytest.mark.parametrize("how", list(MANGLE))
def test_a_miss_whose_bars_are_mangled_is_never_nothing_tuned(tmp_path, how):
    log = _mangled(tmp_path, how)
    assert "[AutoTuner]: Tuning" in log.read_text()
    proc = run_cli("doctor", str(log), "--cache-dir", str(tmp_path), "--json", timeout=DEADLINE_S)
    assert proc.returncode == 1, (how, proc.stdout[-2000:], proc.stderr)
    report = json.loads(proc.stdout)
    (server,) = report["servers"]
    assert report["tuned"] is True and server["tuned"] is True
    assert server["shared_tuning"] or server["shared_unreadable"]
    human = run_cli("doctor", str(log), "--cache-dir", str(tmp_path), timeout=DEADLINE_S)
    assert human.returncode == 1 and "nothing tuned" not in human.stdout
