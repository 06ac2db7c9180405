"""Served workers (``fi-autotune workers``): started once, used by every warm that may use them,
and never by one that may not. Real processes throughout: the real CLI on stand-in GPUs, the
stand-in worker served through the same loop and socket protocol as the real one."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from autotune_cache.tune.workers.servedstate import ServedWorker

from tests.support.fake_gpus import FAKE_GPU_CLI, REPO, gpu_env, run_gpu_cli

QWEN = ["--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass"]
SCHEMA = json.loads((REPO / "docs" / "schemas" / "workers.schema.json").read_text())


@pytest.fixture
def served(tmp_path):
    """Start two served stand-in workers; stopped whatever the test does."""
    env = gpu_env(tmp_path)

    def start(*extra: str, **more_env) -> dict:
        p = run_gpu_cli("workers", "start", "--json", *extra, env={**env, **more_env})
        assert p.returncode == 0, p.stderr
        data = json.loads(p.stdout)
        jsonschema.validate(data, SCHEMA)
        return data

    yield env, start
    run_gpu_cli("workers", "stop", env=env)


def warm(env: dict, root: Path, *extra: str, **more_env) -> tuple[subprocess.CompletedProcess, dict]:
    p = run_gpu_cli("warm", *QWEN, "--cache-dir", str(root), "--json", *extra, env={**env, **more_env})
    return p, (json.loads(p.stdout) if p.stdout.strip() else {})


def warm_until_a_bucket_is_saved(env: dict, root: Path, **popen) -> subprocess.Popen:
    """A warm on stand-ins that take 0.3 s an item, returned once its first bucket is saved."""
    proc = subprocess.Popen([*FAKE_GPU_CLI, "warm", *QWEN, "--cache-dir", str(root)], cwd=REPO,
                            env={**os.environ, **env, "FAKE_ITEM_SLEEP": "0.3"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **popen)
    work = Path(env["XDG_CACHE_HOME"]) / "fi-autotune" / "work"
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size for p in work.rglob("*.done")):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    return proc


def rank_bytes(root: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(root.rglob("rank_*.json"))}


def test_a_warm_uses_the_served_workers_and_writes_what_its_own_would(served, tmp_path):
    env, start = served
    started = start("--idle-timeout", "300")
    assert started["started"] is True and [w["alive"] for w in started["workers"]] == [True, True]
    pids = {w["pid"] for w in started["workers"]}

    p, data = warm(env, tmp_path / "served")
    assert p.returncode == 0, p.stderr
    assert data["timings"]["pool"] == {"source": "served"}
    own_env = gpu_env(tmp_path / "own")  # another cache home: the served workers are not there
    q, own = warm(own_env, tmp_path / "own")
    assert q.returncode == 0 and own["timings"]["pool"] == {"source": "started"}
    assert rank_bytes(tmp_path / "served") == rank_bytes(tmp_path / "own") != {}

    # A second warm is served by the same processes (nothing was restarted), from a clean session.
    p2, again = warm(env, tmp_path / "served2")
    assert p2.returncode == 0 and again["timings"]["pool"] == {"source": "served"}
    assert rank_bytes(tmp_path / "served2") == rank_bytes(tmp_path / "own")
    human = run_gpu_cli("warm", *QWEN, "--cache-dir", str(tmp_path / "served3"), env=env)
    assert human.returncode == 0 and "on 2 GPU(s) on served workers in" in human.stdout
    status = run_gpu_cli("workers", "status", "--json", env=env)
    assert status.returncode == 0
    assert {w["pid"] for w in json.loads(status.stdout)["workers"]} == pids

    # `start` again: already running, nothing started.
    assert start()["started"] is False
    stop = run_gpu_cli("workers", "stop", "--json", env=env)
    assert sorted(json.loads(stop.stdout)["stopped"]) == sorted(pids)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or b"--serve" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    gone = run_gpu_cli("workers", "status", env=env)
    assert gone.returncode == 1 and "no served workers" in gone.stdout


def test_another_environment_is_not_served_and_says_why(served, tmp_path):
    env, start = served
    start()
    p, data = warm(env, tmp_path / "root", FLASHINFER_LOGLEVEL="3")
    assert p.returncode == 0, p.stderr
    assert data["timings"]["pool"]["source"] == "started"
    assert "FLASHINFER_LOGLEVEL" in data["timings"]["pool"]["note"]
    assert "FLASHINFER_LOGLEVEL" in p.stderr and "starts its own workers" in p.stderr
    human = run_gpu_cli("warm", *QWEN, "--cache-dir", str(tmp_path / "r2"), env={**env, "FLASHINFER_LOGLEVEL": "3"})
    assert human.returncode == 0 and "another environment" in human.stderr and "on served workers" not in human.stdout


def test_busy_served_workers_leave_a_second_warm_its_own(served, tmp_path):
    env, start = served
    start()
    lock = Path(env["XDG_CACHE_HOME"]) / "fi-autotune" / "workers" / "session.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a warm using them right now
        p, data = warm(env, tmp_path / "root")
    finally:
        os.close(fd)
    assert p.returncode == 0, p.stderr
    assert data["timings"]["pool"] == {"source": "started", "note": "the served workers are busy with another warm; "
                                                                    "this warm starts its own workers"}
    p, data = warm(env, tmp_path / "root2")  # the lock is free again
    assert data["timings"]["pool"] == {"source": "served"}


def test_a_dead_served_worker_is_not_used(served, tmp_path):
    env, start = served
    workers = start()["workers"]
    os.kill(workers[1]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{workers[1]['pid']}/cmdline").exists() and Path(f"/proc/{workers[1]['pid']}/cmdline").read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    p, data = warm(env, tmp_path / "root")
    assert p.returncode == 0, p.stderr
    assert data["timings"]["pool"]["source"] == "started" and "1 have exited" in data["timings"]["pool"]["note"]
    status = run_gpu_cli("workers", "status", "--json", env=env)
    assert [w["alive"] for w in json.loads(status.stdout)["workers"]] == [True, False]


def test_a_killed_warm_leaves_the_served_worker_serving(served, tmp_path):
    env, start = served
    start(FAKE_ITEM_SLEEP="0.3")
    proc = warm_until_a_bucket_is_saved(env, tmp_path / "root", start_new_session=True)
    os.killpg(proc.pid, signal.SIGKILL)  # the warm and its stand-ins for the served workers
    proc.wait()
    # The same served workers finish the work: the next warm resumes what the killed one saved.
    p, data = warm(env, tmp_path / "root", FAKE_ITEM_SLEEP="0.3")
    assert p.returncode == 0, p.stderr
    assert data["timings"]["pool"] == {"source": "served"} and data["status"] == "written"
    assert data["profiles_tuned"] < data["profiles_total"]


def test_a_failed_session_ends_the_worker_and_the_warm_says_so(served, tmp_path):
    env, start = served
    workers = start(FAKE_WORKER_MODE="oom")["workers"]
    p, data = warm(env, tmp_path / "root", FAKE_WORKER_MODE="oom")
    assert p.returncode == 1
    failed = int(re.search(r"worker on GPU (\d) failed", p.stderr)[1])  # the first to fail; the warm then stops the other
    assert "out of GPU memory" in p.stderr and "Traceback" not in p.stderr
    assert not list((tmp_path / "root").rglob("rank_*.json"))
    pid = workers[failed]["pid"]
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/cmdline").exists() and b"--serve" in Path(f"/proc/{pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "a worker whose session failed must stop serving"
        time.sleep(0.05)
    status = json.loads(run_gpu_cli("workers", "status", "--json", env=env).stdout)
    assert status["workers"][failed]["alive"] is False
    q, again = warm(env, tmp_path / "root2")  # the next warm does not use a pool with an exited worker
    assert q.returncode == 0 and again["timings"]["pool"]["source"] == "started" and "have exited" in q.stderr


def test_served_workers_exit_when_idle_and_remove_their_sockets(served, tmp_path):
    env, start = served
    workers = start("--idle-timeout", "1")["workers"]
    deadline = time.monotonic() + 20
    # a worker removes its socket, then exits: status asked in between still sees it alive
    while any(Path(w["socket"]).exists() or ServedWorker(**{k: w[k] for k in ServedWorker.__annotations__}).alive()
              for w in workers):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    status = run_gpu_cli("workers", "status", "--json", env=env)
    assert status.returncode == 1 and [w["alive"] for w in json.loads(status.stdout)["workers"]] == [False, False]
    p, data = warm(env, tmp_path / "root")
    assert p.returncode == 0 and data["timings"]["pool"]["source"] == "started"


def test_a_worker_refuses_a_hello_that_is_not_its_environment(served):
    env, start = served
    sock = start()["workers"][0]["socket"]
    assert oct(os.stat(sock).st_mode & 0o777) == "0o600"  # nobody else may hand it a task
    other = json.dumps({"fingerprint": {"python": "/other"}, "cwd": "/"}).encode()
    for line, event in ((b"hello " + other + b"\n", "refused"), (b"GET / HTTP/1.0\n", "refused"),
                        (b"ping\n", "pong")):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(sock)
            s.sendall(line)
            answer = json.loads(s.recv(65536).split(b"\n")[0])
            assert answer["event"] == event
            assert s.recv(65536) == b""  # and the connection is closed: no session
    status = run_gpu_cli("workers", "status", "--json", env=env)
    assert all(w["alive"] for w in json.loads(status.stdout)["workers"])


def test_status_and_stop_need_neither_torch_nor_flashinfer(tmp_path):
    """Blocked the way Python blocks an import: the workers' bookkeeping runs without them."""
    code = ("import sys; sys.modules['torch'] = None; sys.modules['flashinfer'] = None\n"
            "from fi_autotune_cli.main import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    env = {**os.environ, **gpu_env(tmp_path)}
    for args, rc in ((["workers", "status"], 1), (["workers", "stop"], 0)):
        p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=REPO,
                           timeout=60)
        assert p.returncode == rc and "Traceback" not in p.stderr, p.stderr


def test_stop_never_kills_a_process_that_reused_a_workers_pid(tmp_path):
    """A state file whose pid now belongs to another process (the workers exited, the pid was
    reused): stop forgets the workers and leaves that process alone."""
    env = gpu_env(tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        base = Path(env["XDG_CACHE_HOME"]) / "fi-autotune" / "workers"
        base.mkdir(parents=True)
        (base / "state.json").write_text(json.dumps({
            "workers": [{"index": 0, "pid": other.pid, "socket": str(tmp_path / "fia-runtime" / "gone.sock"),
                         "device": "0", "log": str(base / "worker0.log")}],
            "fingerprint": {}, "started": 0.0, "idle_s": 60.0, "runtime_dir": str(tmp_path / "fia-runtime")}))
        status = run_gpu_cli("workers", "status", "--json", env=env)
        assert status.returncode == 1 and json.loads(status.stdout)["workers"][0]["alive"] is False
        stop = run_gpu_cli("workers", "stop", "--json", env=env)
        assert stop.returncode == 0 and json.loads(stop.stdout)["stopped"] == []
        assert other.poll() is None, "stop killed a process that is not a served worker"
        assert not (base / "state.json").exists()
    finally:
        other.kill()
        other.wait()


def test_start_on_a_machine_without_a_gpu_is_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "fi_autotune_cli", "workers", "start"], capture_output=True, text=True,
                       env={**os.environ, **gpu_env(tmp_path), "CUDA_VISIBLE_DEVICES": ""}, cwd=REPO, timeout=60)
    # the empty mask hides every GPU, on a GPU machine too (NVML lists them all: CUDA would see none)
    assert p.returncode == 2 and p.stderr == ("fi-autotune: error: no CUDA GPU found (CUDA_VISIBLE_DEVICES is empty): "
                                              "served workers need one\n")
    assert not (Path(gpu_env(tmp_path)["XDG_CACHE_HOME"]) / "fi-autotune" / "workers" / "state.json").exists()
