"""state.json of served workers trusted for nothing ``workers start`` did not write (issue 44):
a FIFO or a link to ``/dev/zero`` in its place, a giant, JSON nested 100,000 deep, pids out of the
kernel's range, a ``runtime_dir`` of ``/`` or the state dir, keys it never writes - each is one
line and exit 1 from ``status`` and ``stop``, with nothing signalled or removed, within a deadline.
And ``stop`` never says "not running" while workers answer on the recorded sockets."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from autotune_cache.tune.workers.servedstate import (PID_MAX, RUNTIME_PREFIX, ServedPool, ServedWorker, StateError,
                                                      make_runtime_dir, remove_runtime_dir)
from tests.support.fake_gpus import gpu_env, run_gpu_cli
from tests.tune.workers.test_served import served  # noqa: F401 - the fixture

#: Far above what reading a state file takes; far below "for ever".
DEADLINE_S = 60


def good_state(base: Path, runtime: Path, pids=(4242, 4243)) -> dict:
    return {"workers": [{"index": i, "pid": pid, "socket": str(runtime / f"w{i}.sock"), "device": str(i),
                         "log": str(base / f"worker{i}.log")} for i, pid in enumerate(pids)],
            "fingerprint": {"python": "x"}, "started": 1.0, "idle_s": 60.0, "runtime_dir": str(runtime), "ready": True}


def _base(tmp_path) -> Path:
    base = tmp_path / "state"
    base.mkdir()
    return base


def test_the_state_start_writes_loads(tmp_path):
    base = _base(tmp_path)
    (base / "state.json").write_text(json.dumps(good_state(base, tmp_path / "fia-abc")))
    pool = ServedPool.load(base)
    assert [w.pid for w in pool.workers] == [4242, 4243] and pool.runtime_dir == str(tmp_path / "fia-abc")


def _edits(base: Path, runtime: Path) -> dict:
    g = good_state(base, runtime)
    w0 = g["workers"][0]
    return {
        "pid 2**70": {**g, "workers": [{**w0, "pid": 2**70}, g["workers"][1]]},
        "pid past the kernel's limit": {**g, "workers": [{**w0, "pid": PID_MAX + 1}, g["workers"][1]]},
        "pid 1 (init)": {**g, "workers": [{**w0, "pid": 1}, g["workers"][1]]},
        "two workers, one pid": {**g, "workers": [w0, {**g["workers"][1], "pid": w0["pid"]}]},
        "index out of order": {**g, "workers": [{**w0, "index": 5}, g["workers"][1]]},
        "runtime_dir /": {**g, "runtime_dir": "/"},
        "runtime_dir the state dir": {**g, "runtime_dir": str(base)},
        "runtime_dir relative": {**g, "runtime_dir": "fia-x"},
        "runtime_dir with ..": {**g, "runtime_dir": str(runtime) + "/../fia-y"},
        "a socket outside runtime_dir": {**g, "workers": [{**w0, "socket": "/tmp/elsewhere/w0.sock"},
                                                          g["workers"][1]]},
        "a key it never writes": {**g, "extra": 1},
        "ready not a bool": {**g, "ready": "yes"},
    }


@pytest.mark.parametrize("edit", list(_edits(Path("/b"), Path("/r/fia-x"))))
def test_a_hand_edited_state_is_refused(tmp_path, edit):
    base = _base(tmp_path)
    (base / "state.json").write_text(json.dumps(_edits(base, tmp_path / "fia-abc")[edit]))
    with pytest.raises(StateError, match="state.json is not what `fi-autotune workers start` writes"):
        ServedPool.load(base)


def test_json_nested_100000_deep_is_a_state_error_not_a_recursion_error(tmp_path):
    base = _base(tmp_path)
    (base / "state.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StateError, match="nested too deeply"):
        ServedPool.load(base)


def test_a_giant_state_is_refused_by_its_size(tmp_path):
    base = _base(tmp_path)
    with open(base / "state.json", "wb") as f:
        f.truncate(1 << 40)  # sparse
    with pytest.raises(StateError, match="over 8 MiB"):
        ServedPool.load(base)


def _make(kind: str, path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("command", ["status", "stop"])
def test_state_that_is_no_regular_file_is_one_line_not_a_hang(tmp_path, kind, command):
    """A FIFO (a plain open waits for a writer for ever) or a link to /dev/zero (read until memory
    runs out): refused before a byte is read, exit 1, and the path is left as it was."""
    env = gpu_env(tmp_path)
    base = Path(env["XDG_CACHE_HOME"]) / "fi-autotune" / "workers"
    base.mkdir(parents=True)
    _make(kind, base / "state.json")
    t0 = time.monotonic()
    p = run_gpu_cli("workers", command, env=env, timeout=DEADLINE_S)
    assert time.monotonic() - t0 < DEADLINE_S
    assert p.returncode == 1 and "not a regular file" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) <= 2 and "Traceback" not in p.stderr and "internal error" not in p.stderr
    assert os.path.lexists(base / "state.json"), f"`workers {command}` removed what it could not read"


@pytest.mark.parametrize("edit", ["pid 2**70", "runtime_dir /", "runtime_dir the state dir"])
def test_stop_with_an_edited_state_signals_and_removes_nothing(tmp_path, edit):
    env = gpu_env(tmp_path)
    base = Path(env["XDG_CACHE_HOME"]) / "fi-autotune" / "workers"
    base.mkdir(parents=True)
    state = json.dumps(_edits(base, tmp_path / "fia-abc")[edit])
    (base / "state.json").write_text(state)
    p = run_gpu_cli("workers", "stop", env=env, timeout=DEADLINE_S)
    assert p.returncode == 1 and "nothing was stopped" in p.stderr, p.stderr
    assert "no served workers were running" not in p.stdout
    assert (base / "state.json").read_text() == state


def test_stop_never_says_not_running_while_workers_answer_on_their_sockets(served):
    """pids edited to ones that are not the workers (a dead pid, in range): the workers still
    answer on the recorded sockets, so `stop` says so (exit 1) and leaves them and the state."""
    env, start = served
    workers = start()["workers"]
    base = Path(env["XDG_CACHE_HOME"]) / "fi-autotune" / "workers"
    good = (base / "state.json").read_text()
    d = json.loads(good)
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)  # a pid that is certainly no served worker now
    for w in d["workers"]:
        w["pid"] = gone
    d["workers"] = d["workers"][:1]
    edited = json.dumps(d)
    (base / "state.json").write_text(edited)
    try:
        p = run_gpu_cli("workers", "stop", env=env, timeout=DEADLINE_S)
        assert p.returncode == 1 and "answer on their sockets" in p.stderr, (p.stdout, p.stderr)
        assert (base / "state.json").read_text() == edited
        assert all(b"--serve" in Path(f"/proc/{w['pid']}/cmdline").read_bytes() for w in workers)
    finally:
        (base / "state.json").write_text(good)


def _runtime_files(d: Path) -> ServedWorker:
    (d / "fingerprint.json").write_text("{}")
    (d / "w0.sock").write_text("")
    return ServedWorker(index=0, pid=999999, socket=str(d / "w0.sock"), device="0", log="/dev/null")


@pytest.mark.parametrize("where", ["a directory of the user's", "named like ours, outside the temp dir"])
def test_removing_a_runtime_dir_leaves_a_directory_this_tool_did_not_make(tmp_path, where):
    """The last guard before files are unlinked (the state's own checks refuse such a runtime_dir
    first, so `workers stop` alone cannot show this one): a directory that is not a sockets' dir
    this tool made keeps the files that share our names, and stays."""
    d = tmp_path / ("precious" if where.startswith("a directory") else f"{RUNTIME_PREFIX}x")
    d.mkdir(mode=0o700)
    worker = _runtime_files(d)
    remove_runtime_dir(str(d), (worker,))
    assert sorted(p.name for p in d.iterdir()) == ["fingerprint.json", "w0.sock"]


def test_removing_a_runtime_dir_this_tool_made_removes_it_whole():
    d = Path(make_runtime_dir())
    worker = _runtime_files(d)
    remove_runtime_dir(str(d), (worker,))
    assert not d.exists()
