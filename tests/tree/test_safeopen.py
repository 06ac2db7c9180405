"""``open_bounded``: what a path names is asked before its first byte is read. A FIFO with no
writer, a device, a directory are refused at once; a regular file over the cap is refused by its
size, and one that grows past the cap while read stops there. Each case runs in a child process
with a deadline, so a regression (a blocking open) fails rather than hangs."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap

import pytest

from autotune_cache.safeopen import FileRefused, FileTooLarge, open_bounded, read_bounded

_CHILD = textwrap.dedent("""
    import sys
    from autotune_cache.safeopen import FileRefused, read_bounded
    try:
        read_bounded(sys.argv[1], 1 << 20, what="state file")
    except FileRefused as e:
        print(e.kind)
    except IsADirectoryError:
        print("directory")
""")


def _kind_in_child(path) -> str:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_fifo_without_writer_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "f")
    assert _kind_in_child(tmp_path / "f") == "FIFO"


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_devices_and_links_to_them_are_refused(tmp_path):
    (tmp_path / "z").symlink_to("/dev/zero")
    assert _kind_in_child("/dev/zero") == "character device"
    assert _kind_in_child(tmp_path / "z") == "character device"


def test_directory_is_refused_as_open_refuses_it(tmp_path):
    assert _kind_in_child(tmp_path) == "directory"


def test_a_file_over_the_cap_is_refused_by_its_size(tmp_path):
    p = tmp_path / "big"
    with open(p, "wb") as f:
        f.truncate(1 << 40)  # sparse: a terabyte on no disk
    with pytest.raises(FileTooLarge, match=r"over 1 MiB \(1099511627776 bytes\)"):  # by its size: nothing read
        read_bounded(p, 1 << 20, what="state file")
    p.write_bytes(b"x" * 10)
    assert read_bounded(p, 10) == b"x" * 10


def test_a_stream_is_read_only_to_the_cap(tmp_path):
    r, w = os.pipe()
    os.write(w, b"y" * 5000)
    os.close(w)
    with open_bounded(f"/proc/self/fd/{r}", 4096, stream_ok=True) as f, pytest.raises(FileTooLarge):
        f.read()
    os.close(r)
    r, w = os.pipe()
    try:
        with pytest.raises(FileRefused, match="FIFO, not a regular file"):
            open_bounded(f"/proc/self/fd/{r}", 4096)
    finally:
        os.close(r)
        os.close(w)


def test_reads_are_not_left_non_blocking(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    with open_bounded(p, 100) as f:
        assert not fcntl.fcntl(f.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
        assert f.read() == b"abc"
