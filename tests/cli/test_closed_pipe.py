"""A reader that stops reading (``fi-autotune ls | head -1``): one status, every time."""

from __future__ import annotations

import os
import subprocess
import sys

from devtools.synthetic import default_fields, write_fake_entry

from ..conftest import REPO


def _run_into_closed_pipe(*args: str) -> tuple[int, str]:
    """The command with its stdout a pipe whose reader has already gone (the worst case of
    ``| head -1``: every write fails), its exit status and stderr."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run([sys.executable, "-m", "fi_autotune_cli", *args], stdout=w, stderr=subprocess.PIPE,
                              text=True, cwd=REPO, timeout=120)
    finally:
        os.close(w)
    return proc.returncode, proc.stderr


def test_a_closed_pipe_ends_every_listing_with_0_and_nothing_on_stderr(root):
    for i in range(3):
        write_fake_entry(root, fields=default_fields(model=f"m{i}"), seed=i)
    for args in (["ls"], ["ls", "--json"], ["ls", "-q"], ["ls", "--dir"]):
        for _ in range(3):
            code, err = _run_into_closed_pipe(*args, "--cache-dir", str(root))
            assert (code, err) == (0, ""), args


def test_a_closed_pipe_after_some_output_is_0_too(root):
    """``| head -1`` that reads the first line, then closes: the rest is dropped, exit 0."""
    for i in range(40):
        write_fake_entry(root, fields=default_fields(model=f"m{i}"), seed=i)
    for _ in range(5):
        head = subprocess.Popen(["head", "-c", "10"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        proc = subprocess.run([sys.executable, "-m", "fi_autotune_cli", "ls", "--json", "--cache-dir", str(root)],
                              stdout=head.stdin, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120)
        head.stdin.close()
        head.wait()
        assert (proc.returncode, proc.stderr) == (0, "")


def test_binary_output_cut_short_is_a_failure(root):
    """``export -o -`` into a reader that stopped: the archive is cut short, exit 1, one line."""
    write_fake_entry(root)
    code, err = _run_into_closed_pipe("export", "-o", "-", "--cache-dir", str(root))
    assert code == 1 and len(err.strip().splitlines()) == 1, err


def test_an_archive_whose_reader_stops_part_way_is_a_failure(root):
    """The reader takes 10 bytes and exits while the archive (over the 64 KiB a pipe holds) is
    being written: the kernel takes part of the write, and the rest must not vanish with exit 0."""
    for i in range(50):
        write_fake_entry(root, fields=default_fields(model=f"m{i}"), seed=i)
    for _ in range(3):
        reader = subprocess.Popen([sys.executable, "-c", "import os; os.read(0, 10)"], stdin=subprocess.PIPE)
        proc = subprocess.run([sys.executable, "-m", "fi_autotune_cli", "export", "-o", "-", "--cache-dir", str(root)],
                              stdout=reader.stdin, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120)
        reader.stdin.close()
        reader.wait()
        assert proc.returncode == 1 and "cut short" in proc.stderr and "Exported" not in proc.stderr, proc.stderr
