"""Served workers (``fi-autotune workers``) misused: stale or hand-edited state, concurrent starts, a
warm during a start, another environment, sessions that fail. Written as an adversarial review
(each failed before its fix); the real CLI on stand-in GPUs, as test_served.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from tests.support.fake_gpus import FAKE_GPU_CLI, REPO, gpu_env, run_gpu_cli
from tests.tune.workers.test_served import QWEN, SCHEMA, served, warm, warm_until_a_bucket_is_saved  # noqa: F401 - the fixture

FAKE_WORKER = REPO / "tests" / "standins" / "fake_worker.py"


def state_base(env: dict) -> Path:
    return Path(env["XDG_CACHE_HOME"]) / "fi-autotune" / "workers"


def write_state(env: dict, workers: list[dict], runtime_dir: str, **extra) -> Path:
    base = state_base(env)
    base.mkdir(parents=True, exist_ok=True)
    (base / "state.json").write_text(json.dumps({"workers": workers, "fingerprint": {}, "started": 0.0,
                                                 "idle_s": 60.0, "runtime_dir": runtime_dir, **extra}))
    return base


def serving_pids(env: dict) -> list[int]:
    """Stand-in served workers started with this test's XDG_CACHE_HOME (never another session's)."""
    out, mark = [], f"XDG_CACHE_HOME={env['XDG_CACHE_HOME']}".encode()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
                environ = (d / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"--serve" in cmd and b"fake_worker.py" in cmd and mark in environ:
                out.append(int(d.name))
    return out


@pytest.fixture
def sleeper():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p
    p.kill()
    p.wait()


# --- a slip must never delete where it should not -------------------------------------------------------


@pytest.mark.parametrize("command", ["stop", "start"])
def test_stale_state_never_deletes_a_directory_that_is_not_a_runtime_dir(tmp_path, command):
    """state.json's runtime_dir (stale, hand-edited, from another version) is rmtree'd by `stop`,
    and by `start` when the recorded workers have exited: any directory the user can write."""
    env = gpu_env(tmp_path)
    precious = tmp_path / "precious"
    (precious / "sub").mkdir(parents=True)
    (precious / "sub" / "thesis.tex").write_text("years of work")
    (precious / "fingerprint.json").write_text("a file of the user's that shares a name with ours")
    write_state(env, [{"index": 0, "pid": 999999, "socket": "/tmp/fia-gone/w0.sock", "device": "0",
                       "log": "/dev/null"}], str(precious))
    run_gpu_cli("workers", command, "--gpus", "1", env=env) if command == "start" else run_gpu_cli("workers", "stop", env=env)
    try:
        assert (precious / "sub" / "thesis.tex").exists(), f"`workers {command}` deleted {precious}"
        assert (precious / "fingerprint.json").exists(), f"`workers {command}` deleted a file in {precious}"
    finally:
        run_gpu_cli("workers", "stop", env=env)


# --- a slip must never kill a process that is not a served worker ----------------------------------------


@pytest.mark.parametrize("sock", ["", "time", "-c"])
def test_stop_never_kills_another_process_named_by_a_hand_edited_state(tmp_path, sleeper, sock):
    """A socket in state.json that is empty or a word of another process's command line: the
    record is refused (one line, exit 1, nothing stopped), never matched by substring."""
    env = gpu_env(tmp_path)
    write_state(env, [{"index": 0, "pid": sleeper.pid, "socket": sock, "device": "0", "log": "/dev/null"}],
                str(tmp_path / "runtime"))
    stop = run_gpu_cli("workers", "stop", "--json", env=env)
    time.sleep(0.2)
    assert sleeper.poll() is None, f"`workers stop` killed pid {sleeper.pid}, which is no served worker"
    assert stop.returncode == 1 and "not a served worker's record" in stop.stderr and "nothing was stopped" in stop.stderr


def test_stop_never_kills_a_process_whose_command_line_only_contains_the_socket(tmp_path):
    """The socket path inside another argument (not after --serve) is not a served worker."""
    env = gpu_env(tmp_path)
    sock = str(tmp_path / "fia-runtime" / "w0.sock")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"x{sock}", "--serve"])
    try:
        write_state(env, [{"index": 0, "pid": other.pid, "socket": sock, "device": "0", "log": "/dev/null"}],
                    str(tmp_path / "fia-runtime"))
        stop = run_gpu_cli("workers", "stop", "--json", env=env)
        assert stop.returncode == 0 and json.loads(stop.stdout)["stopped"] == [] and other.poll() is None
    finally:
        other.kill()
        other.wait()


# --- a stale or hand-edited state.json: one clear line, never a traceback, never "OK" --------------------


@pytest.mark.parametrize("worker", [
    {"index": 0, "pid": 1, "socket": None, "device": "0", "log": "x"},
    {"index": 0, "pid": 1, "socket": 5, "device": "0", "log": "x"},
    {"index": 0, "pid": "abc", "socket": "/tmp/x.sock", "device": "0", "log": "x"},
])
@pytest.mark.parametrize("command", ["status", "stop", "start"])
def test_a_hand_edited_state_gives_no_traceback(tmp_path, worker, command):
    env = gpu_env(tmp_path)
    write_state(env, [worker], str(tmp_path / "runtime"))
    try:
        p = run_gpu_cli("workers", command, "--json", env=env)
        assert "Traceback" not in p.stderr and "internal error" not in p.stderr, p.stderr
        assert p.returncode in (0, 1, 2)
        if p.stdout.strip():
            jsonschema.validate(json.loads(p.stdout), SCHEMA)
    finally:
        run_gpu_cli("workers", "stop", env=env)


def test_an_unreadable_state_is_not_reported_as_no_workers(served):
    """state.json that is not JSON (truncated, hand-edited) while the workers run: `status` says
    "no served workers", `stop` says "no served workers were running" (exit 0) and leaves them
    running, and `start` starts a second set: an unknown reads as OK, and processes leak."""
    env, start = served
    pids = [w["pid"] for w in start()["workers"]]
    state = state_base(env) / "state.json"
    good = state.read_text()
    state.write_text(good[: len(good) // 2])
    try:
        status = run_gpu_cli("workers", "status", env=env)
        stop = run_gpu_cli("workers", "stop", env=env)
        assert "no served workers" not in status.stdout, "an unreadable state.json read as 'no served workers'"
        assert not (stop.returncode == 0 and "no served workers were running" in stop.stdout), \
            "stop said nothing was running while two workers run"
    finally:
        state.write_text(good)
        run_gpu_cli("workers", "stop", env=env)
        assert all(not Path(f"/proc/{p}/cmdline").exists() or b"--serve" not in Path(f"/proc/{p}/cmdline").read_bytes()
                   for p in pids)


# --- concurrency ----------------------------------------------------------------------------------------


def test_two_concurrent_starts_leave_one_set_of_workers(tmp_path):
    """Two `workers start` at once (two CI steps, a retry): no lock, both spawn a set and the
    last state.json wins; the other set is leaked (invisible to status and stop) until idle."""
    env = gpu_env(tmp_path)
    procs = [subprocess.Popen([*FAKE_GPU_CLI, "workers", "start", "--idle-timeout", "60"], cwd=REPO,
                              env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    for p in procs:
        p.communicate(timeout=60)
    try:
        mine = set(serving_pids(env))
        assert len(mine) == 2, f"{len(mine)} served workers run for a 2-GPU machine after two concurrent starts"
    finally:
        run_gpu_cli("workers", "stop", env=env)
        for pid in serving_pids(env):  # the set state.json forgot
            os.kill(pid, 9)


def test_a_warm_during_start_does_not_fail(tmp_path):
    """`workers start &` then `warm` (a CI job that starts the workers in the background): state.json
    is written before the workers listen, claim() only checks that the pids are alive, so the warm
    attaches to a socket that does not exist yet and fails instead of starting its own workers."""
    slow = tmp_path / "slow_worker.py"
    slow.write_text("import runpy, sys, time\ntime.sleep(4)\n"
                    f"sys.argv[0] = {str(FAKE_WORKER)!r}\nrunpy.run_path({str(FAKE_WORKER)!r}, run_name='__main__')\n")
    env = gpu_env(tmp_path, FAKE_WORKER=str(slow))
    starter = subprocess.Popen([*FAKE_GPU_CLI, "workers", "start"], cwd=REPO, env={**os.environ, **env},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (state_base(env) / "state.json").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        p, data = warm(env, tmp_path / "root")
        assert p.returncode == 0, p.stderr
    finally:
        starter.communicate(timeout=60)
        run_gpu_cli("workers", "stop", env=env)


# --- `start` reports incompatible or partly dead workers as running -----------------------------------


def test_start_in_another_environment_does_not_keep_workers_no_warm_will_use(served, tmp_path):
    """`workers start` where workers of another environment run: not "already running" (no warm
    here could use them) but one line saying what differs and to stop them first."""
    env, start = served
    start()
    p = run_gpu_cli("workers", "start", "--json", env={**env, "FLASHINFER_LOGLEVEL": "3"})
    assert p.returncode == 1 and p.stdout == ""
    assert "another environment (FLASHINFER_LOGLEVEL differ)" in p.stderr and "workers stop` first" in p.stderr


def test_start_after_a_worker_died_restarts_it_or_says_so(served):
    env, start = served
    workers = start()["workers"]
    os.kill(workers[1]["pid"], 9)
    time.sleep(0.5)
    p = run_gpu_cli("workers", "start", "--json", env=env)
    data = json.loads(p.stdout) if p.stdout.strip() else {}
    assert not (p.returncode == 0 and data.get("started") is False and not all(w["alive"] for w in data["workers"])), \
        "start exited 0 with 'already running' while a worker is dead"


# --- bad input: one line and exit 2 -------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "1e309"])
def test_idle_timeout_that_is_not_a_finite_number_is_a_usage_error(tmp_path, value):
    env = gpu_env(tmp_path)
    try:
        p = run_gpu_cli("workers", "start", "--idle-timeout", value, env=env, timeout=60)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (p.returncode, p.stderr[-500:])
    finally:
        run_gpu_cli("workers", "stop", env=env)


# --- what a served session runs in must be what a fresh worker would run in ------------------------------

PROBE = '''import json, os, sys
sys.path.insert(0, {repo!r})
sys.argv[0] = {fake!r}
import runpy
fake = runpy.run_path({fake!r})  # the stand-in's functions, without running its __main__

def session():
    um = os.umask(0); os.umask(um)
    env = {{k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED")}}
    with open({out!r}, "a") as f:
        f.write(json.dumps({{"cwd": os.getcwd(), "umask": um, "env": env}}) + "\\n")
    return fake["main"]()

if __name__ == "__main__":
    from autotune_cache.tune.workers.serve import serve_args, serve_sessions
    serving = serve_args(sys.argv[1:])
    sys.exit(serve_sessions(*serving, session) if serving else session())
'''


def _cli(args, env, cwd, umask=0o022):
    def pre():
        os.umask(umask)
    return subprocess.run([*FAKE_GPU_CLI, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, **env}, preexec_fn=pre)


@pytest.mark.parametrize("difference", ["cwd", "umask", "CXX"])
def test_a_served_session_runs_where_and_as_a_fresh_worker_would(tmp_path, difference):
    """The fingerprint covers a list of variable prefixes, but not the working directory, the umask,
    or variables such as CXX/CC/MAX_JOBS/TMPDIR (FlashInfer's JIT build), OMP_NUM_THREADS: a warm in
    a shell that differs only there is served by a worker that runs with the starting shell's."""
    out = tmp_path / "probe.jsonl"
    worker = tmp_path / "probe_worker.py"
    worker.write_text(PROBE.format(repo=str(REPO), fake=str(FAKE_WORKER), out=str(out)))
    env = gpu_env(tmp_path, FAKE_WORKER=str(worker))
    other_dir = tmp_path / "elsewhere"
    other_dir.mkdir()
    warm_env, warm_cwd, warm_umask = dict(env), str(REPO), 0o022
    if difference == "cwd":
        warm_cwd = str(other_dir)
    elif difference == "umask":
        warm_umask = 0o077
    else:
        warm_env[difference] = {"CXX": "clang++", "TMPDIR": str(other_dir), "MAX_JOBS": "1",
                                "OMP_NUM_THREADS": "1"}[difference]
    assert _cli(["workers", "start", "--gpus", "1"], env, str(REPO)).returncode == 0
    try:
        args = ["warm", *QWEN, "--gpus", "1", "--json"]
        p = _cli([*args, "--cache-dir", str(tmp_path / "a")], warm_env, warm_cwd, warm_umask)
        assert p.returncode == 0, p.stderr
        if json.loads(p.stdout)["timings"]["pool"]["source"] != "served":
            return  # not served: it said why, and ran its own worker
        fresh_env = {**warm_env, "XDG_CACHE_HOME": str(tmp_path / "xdg2")}  # no served workers there
        q = _cli([*args, "--cache-dir", str(tmp_path / "b")], fresh_env, warm_cwd, warm_umask)
        assert q.returncode == 0 and json.loads(q.stdout)["timings"]["pool"]["source"] == "started"
        served_view, fresh_view = (json.loads(line) for line in out.read_text().splitlines()[:2])
        fresh_view["env"]["XDG_CACHE_HOME"] = served_view["env"]["XDG_CACHE_HOME"]
        for k in ("cwd", "umask"):
            assert served_view[k] == fresh_view[k], f"served session's {k}: {served_view[k]!r}, a fresh worker's: {fresh_view[k]!r}"
        differ = sorted(k for k in set(served_view["env"]) | set(fresh_view["env"])
                        if served_view["env"].get(k) != fresh_view["env"].get(k))
        assert not differ, f"served session's environment differs from a fresh worker's in {differ}"
    finally:
        _cli(["workers", "stop"], env, str(REPO))


# --- a failed session must end the worker, and the warm must say what happened ---------------------------

FAILING = '''import sys
sys.path.insert(0, {repo!r})
import runpy
fake = runpy.run_path({fake!r})

def session():
    fake["emit"]("imported", import_s=0.0)
    sys.stdin.readline()
    raise {exc}

if __name__ == "__main__":
    from autotune_cache.tune.workers.serve import serve_args, serve_sessions
    serving = serve_args(sys.argv[1:])
    sys.exit(serve_sessions(*serving, session) if serving else session())
'''


@pytest.mark.parametrize("exc", ["OSError(28, 'No space left on device')", "ValueError('bad task')"])
def test_a_session_that_raises_ends_the_worker(tmp_path, exc):
    """serve_sessions treats OSError and ValueError from the *session* as "the client went away":
    a session that fails with ENOSPC/EACCES/a bad task sends no exit event, the warm reports "the
    connection closed ... (it died)", and the worker - which did not die - keeps serving the next
    warm after a failed session (serve.py says a failed session ends the worker)."""
    worker = tmp_path / "failing_worker.py"
    worker.write_text(FAILING.format(repo=str(REPO), fake=str(FAKE_WORKER), exc=exc))
    env = gpu_env(tmp_path, FAKE_WORKER=str(worker))
    assert run_gpu_cli("workers", "start", "--gpus", "1", env=env).returncode == 0
    try:
        p, _ = warm(env, tmp_path / "root", "--gpus", "1")
        assert p.returncode == 1 and "Traceback" not in p.stderr
        time.sleep(1.0)
        status = json.loads(run_gpu_cli("workers", "status", "--json", env=env).stdout)
        assert not status["workers"][0]["alive"], "the worker whose session failed still serves"
    finally:
        run_gpu_cli("workers", "stop", env=env)


def test_stop_during_a_warm_keeps_what_was_finished_and_says_why(served, tmp_path):
    env, start = served
    start(FAKE_ITEM_SLEEP="0.3")
    proc = warm_until_a_bucket_is_saved(env, tmp_path / "root", text=True)
    stop = run_gpu_cli("workers", "stop", env=env)
    assert stop.returncode == 0
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in err, err
    p, data = warm(env, tmp_path / "root")
    assert p.returncode == 0 and data["timings"]["pool"]["source"] == "started"
    assert data["profiles_tuned"] < data["profiles_total"], "the buckets finished before the stop were lost"


def test_a_start_waits_for_another_start_or_stop(tmp_path):
    """While another start (or stop) holds the start lock, a start waits; then it runs."""
    env = gpu_env(tmp_path)
    base = state_base(env)
    base.mkdir(parents=True)
    fd = os.open(base / "start.lock", os.O_RDWR | os.O_CREAT)
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)
    starter = subprocess.Popen([*FAKE_GPU_CLI, "workers", "start", "--json"], cwd=REPO, env={**os.environ, **env},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            starter.wait(timeout=3)
        assert not (base / "state.json").exists()
        os.close(fd)
        out, err = starter.communicate(timeout=60)
        assert starter.returncode == 0 and json.loads(out)["started"] is True, err
    finally:
        starter.kill()
        run_gpu_cli("workers", "stop", env=env)


@pytest.mark.parametrize("death,said", [("kill", "killed by SIGKILL"), ("exit-3", "exit status 3")])
def test_a_worker_that_dies_silently_while_starting_says_how_it_ended(tmp_path, death, said):
    """A worker killed before it logs a line (the OOM killer, ``kill -9``) has no last line to
    show: the start says how it ended, one line, exit 1, and leaves no worker and no state."""
    env = gpu_env(tmp_path, FAKE_SERVE_START=death)
    proc = run_gpu_cli("workers", "start", "--gpus", "2", env=env)
    try:
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, proc.stderr
        assert f"exited while starting ({said}): no message" in lines[0], lines[0]
        assert serving_pids(env) == [] and not (state_base(env) / "state.json").exists()
    finally:
        run_gpu_cli("workers", "stop", env=env)


def test_a_warm_does_not_use_workers_whose_start_has_not_finished(served, tmp_path):
    """state.json says ``ready: false`` until every worker answered its start (here: a start killed
    while waiting): a warm starts its own and says why, even though the workers answer."""
    env, start = served
    start()
    state = state_base(env) / "state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "ready": False}))
    p, data = warm(env, tmp_path / "root")
    assert p.returncode == 0 and data["timings"]["pool"]["source"] == "started"
    assert "still starting" in data["timings"]["pool"]["note"]


def test_a_warm_does_not_wait_on_a_worker_that_does_not_answer(served, tmp_path):
    """A served worker stopped (SIGSTOP: a hung GPU call looks the same) is not handed the warm:
    within seconds the warm starts its own, saying which one did not answer."""
    env, start = served
    workers = start()["workers"]
    os.kill(workers[1]["pid"], signal.SIGSTOP)
    try:
        p, data = warm(env, tmp_path / "root")  # without the ping it waits out the hello (120 s), then fails
        assert p.returncode == 0 and data["timings"]["pool"]["source"] == "started", p.stderr
        assert "worker(s) 1 did not answer" in data["timings"]["pool"]["note"]
    finally:
        os.kill(workers[1]["pid"], signal.SIGCONT)


# --- only a session is use: pings and silent clients never keep a worker up ------------------------------

IDLE_SERVER = '''import sys
sys.path.insert(0, {repo!r})
from autotune_cache.tune.workers.serve import serve_sessions
sys.exit(serve_sessions({sock!r}, 1.0, {{"fp": 1}}, lambda: 0))
'''


def _idle_server(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    sock = tmp_path / "w.sock"
    proc = subprocess.Popen([sys.executable, "-c", IDLE_SERVER.format(repo=str(REPO), sock=str(sock))],
                            stdout=subprocess.PIPE, text=True)
    assert json.loads(proc.stdout.readline())["event"] == "serving"
    return proc, sock


def _send(sock: Path, line: str | None) -> "socket.socket":
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.connect(str(sock))
    if line is not None:
        s.sendall(line.encode() + b"\n")
    return s


@pytest.mark.parametrize("client", ["ping", "refused hello"])
def test_pings_and_refused_hellos_do_not_keep_a_worker_up(tmp_path, client):
    """``workers status`` (or a readiness probe looping on it) pings every worker; a client from
    another environment is refused. Neither is use: a worker with a 1 s idle timeout pinged four
    times a second still goes, where each connection used to restart its idle clock."""
    proc, sock = _idle_server(tmp_path)
    line = "ping" if client == "ping" else 'hello {"fingerprint": {"fp": 2}, "cwd": "/"}'
    try:
        answered = 0
        for _ in range(40):  # up to 10 s of connections, 4 a second
            if proc.poll() is not None:
                break
            try:
                with _send(sock, line) as s:
                    answered += bool(s.makefile().readline())
            except OSError:  # it has gone: its socket is removed
                pass
            time.sleep(0.25)
        assert proc.poll() == 0, f"still serving after {answered} answered {client}s"
        assert answered >= 1 and not sock.exists()
    finally:
        proc.kill()


def test_a_client_that_says_nothing_does_not_hold_a_worker_forever(tmp_path):
    """A connection that never sends its first line (a stuck client, a port scanner on a shared
    runtime dir) is dropped after the handshake time, and the worker goes when idle."""
    proc, sock = _idle_server(tmp_path)
    silent = _send(sock, None)
    try:
        assert proc.wait(timeout=30) == 0
        assert not sock.exists()
    finally:
        silent.close()
        proc.kill()
