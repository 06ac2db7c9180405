"""The suite's own machinery works as pyproject.toml says: ``--dist loadgroup`` keeps an
``xdist_group`` in one process (the GPU tests share one GPU one at a time; session fixtures are
built once per group). pytest 9.2 with xdist 3.8.0 silently spread a group over every worker."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

GROUPED = '''
import os, pytest, time

@pytest.mark.parametrize("i", range(6))
@pytest.mark.xdist_group("one")
def test_grouped(i):
    time.sleep(0.05)
    with open(os.environ["OUT"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
'''


def test_an_xdist_group_runs_in_one_worker(tmp_path: Path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    out = tmp_path / "workers.txt"
    # its own --basetemp: by default a pytest run deletes all but the last three runs' temporary
    # trees under /tmp/pytest-of-<user>, seconds of unlinking (the suite's own start did it already)
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-n", "2",
                        "--dist", "loadgroup", "-o", "addopts=", "--basetemp", str(tmp_path / "basetemp"),
                        str(tmp_path / "test_grouped.py")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**__import__("os").environ,
                                                                                       "OUT": str(out)})
    assert p.returncode == 0, p.stdout + p.stderr
    workers = out.read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, f"one xdist group ran on {sorted(set(workers))}"


# --- the CLI fork server (tests/support/zygote.py): run_cli's processes behave as fresh ones ---

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _zygote_on(monkeypatch):
    """These tests are about the zygote: on even where FIA_TEST_FRESH_CLI=1 runs the rest fresh."""
    monkeypatch.delenv("FIA_TEST_FRESH_CLI", raising=False)


def _both(*args, **kw):
    from .conftest import run_cli

    z, f = run_cli(*args, **kw), run_cli(*args, fresh=True, **kw)
    assert z.via_zygote and not f.via_zygote
    return z, f


def test_a_zygote_command_prints_and_exits_as_a_fresh_one(tmp_path):
    for args in (["ls", "--bogus"], ["--help"], ["ls", "--help"], ["import", "--help"], ["--version"],
                 ["ls", "--cache-dir", str(tmp_path / "absent")], ["plan", "--model", "no/such-model", "--tp", "1"]):
        z, f = _both(*args)
        assert (z.returncode, z.stdout, z.stderr) == (f.returncode, f.stdout, f.stderr), args
    z, f = _both("ls", "--bogus")
    assert z.returncode == 2 and "Usage:" not in z.stderr and z.stderr.startswith("fi-autotune: error: ")


def test_environment_changes_reach_the_zygote_child(tmp_path, monkeypatch):
    import os

    from .conftest import run_cli
    from .support import zygotes

    missing = str(tmp_path / "absent")
    run_cli("--version")  # this environment's zygote exists before the changes below
    monkeypatch.setenv("FI_AUTOTUNE_DEBUG", "1")  # an error's traceback
    z, f = _both("ls", "--cache-dir", missing)
    assert z.returncode == f.returncode == 1 and z.stderr == f.stderr and "Traceback" in z.stderr
    monkeypatch.delenv("FI_AUTOTUNE_DEBUG")
    z, f = _both("ls", "--cache-dir", missing)
    assert z.stderr == f.stderr and "Traceback" not in z.stderr
    # --layout's help names each root's source, read when the help is shown: one zygote serves both
    # environments, and each prints what a fresh process prints
    served = []
    for value in (None, str(tmp_path / "sglang")):
        if value is None:
            monkeypatch.delenv("SGLANG_CACHE_DIR", raising=False)
        else:
            monkeypatch.setenv("SGLANG_CACHE_DIR", value)
        z, f = _both("ls", "--help")
        assert z.stdout == f.stdout and ("($SGLANG_CACHE_DIR)" in z.stdout) == (value is not None)
        served.append(zygotes.POOL.zygote_for(dict(os.environ)))
        zygotes.POOL.done(served[-1])
    assert served[0] is not None and served[0] is served[1]
    z, f = _both("ls", "--json", cwd=tmp_path)  # cwd, and the variable's value at run time
    assert (z.returncode, z.stdout, z.stderr) == (f.returncode, f.stdout, f.stderr)


def test_a_variable_a_preloaded_module_keeps_by_its_prefix_gets_its_own_zygote():
    """tqdm (preloaded: huggingface_hub imports it) keeps every ``TQDM_*`` variable at import by
    walking the environment, as fsspec keeps ``FSSPEC*``: a command run with one set must not be
    forked from a zygote that imported tqdm without it. A variable nothing read at import changes
    nothing: the same zygote serves."""
    import os

    from .conftest import run_cli
    from .support import zygote, zygotes

    run_cli("--version")  # this environment's zygote, and what zygotes read at import
    reads = zygotes.POOL.reads
    assert reads and "<iterated>" not in reads, reads  # else any variable would pick a zygote of its own

    def key(**extra):  # the pool picks a zygote by this (``zygote_for``)
        return zygote.signature({**os.environ, **extra}, reads)

    assert key(FIA_TEST_NOTHING_READS_THIS="1") == key()
    assert key(TQDM_DISABLE="1") != key() and key(FSSPEC_TEST_OPTION="1") != key()


def _interrupted(sig, **kw):
    import os
    import signal as S
    import time

    from .support import zygotes

    # TMPDIR: the dry run's scratch, which a kill leaves, stays in the test's directory
    env = {**{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}, "TMPDIR": str(kw["tmp_path"])}
    args = ["import", "-", "--dry-run", "--cache-dir", str(kw["tmp_path"] / "tree")]
    out = {}
    for how in ("zygote", "fresh"):
        if how == "zygote":
            p = zygotes.popen(args, env=env, cwd=zygotes.REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        else:
            p = subprocess.Popen([sys.executable, "-m", "fi_autotune_cli", *args], env=env, cwd=zygotes.REPO,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(kw.get("wait", 1.0))  # reading stdin: past its imports (0.3 CPU-s fresh) either way
        p.send_signal(sig)
        stdout, stderr = p.communicate(timeout=60)
        out[how] = (p.returncode, stdout, stderr)
    assert out["zygote"] == out["fresh"], out
    return out["zygote"]


def test_sigint_to_the_client_is_ctrl_c_to_the_command(tmp_path):
    import signal as S

    code, _, stderr = _interrupted(S.SIGINT, tmp_path=tmp_path)
    assert code == 130 and stderr.endswith("fi-autotune: interrupted\n") and "Traceback" not in stderr


def test_sigterm_kills_the_command_and_the_client_reports_it(tmp_path):
    import signal as S

    code, _, _ = _interrupted(S.SIGTERM, tmp_path=tmp_path)
    assert code == -S.SIGTERM


def test_sigterm_at_once_is_never_lost(tmp_path):
    """Passed on while the child is still being set up, a signal waits (blocked) for the fresh
    interpreter's dispositions: -15, never a command that lives on and reads its stdin."""
    import signal as S

    for _ in range(3):
        code, _, _ = _interrupted(S.SIGTERM, tmp_path=tmp_path, wait=0.05)
        assert code == -S.SIGTERM


def test_a_zygote_that_is_gone_means_a_fresh_process(tmp_path, monkeypatch):
    import os
    import signal as S

    from .conftest import run_cli
    from .support import zygotes

    first = run_cli("ls", "--bogus")
    assert first.via_zygote
    same = lambda p: (p.returncode, p.stdout, p.stderr) == (first.returncode, first.stdout, first.stderr)  # noqa: E731
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    z = zygotes.POOL.zygote_for(env)
    zygotes.POOL.done(z)
    # gone between the pool's look and the command (its socket answers no more): run fresh
    monkeypatch.setattr(z, "socket_path", str(tmp_path / "nobody.sock"))
    gone = run_cli("ls", "--bogus")
    assert not gone.via_zygote and same(gone)
    # killed: the next command gets a new zygote
    os.kill(z.proc.pid, S.SIGKILL)
    again = run_cli("ls", "--bogus")
    assert same(again)
    assert run_cli("ls", "--bogus").via_zygote
    now = zygotes.POOL.zygote_for(env)
    zygotes.POOL.done(now)
    assert now is not z


STEP = r"""
import os, signal, subprocess, sys, time
what = sys.argv[1]
if what == "echo":  # stdin past a pipe's buffer, both ways; a status; newlines to translate
    data = sys.stdin.read()
    sys.stdout.write(data.upper() * 3)
    sys.stderr.write("cr-lf\r\ncr\rend " + os.getcwd() + " %o" % os.umask(0) + "\n")
    sys.exit(5)
if what == "signal":
    print("before", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
if what == "grandchild":  # it holds stdout after the command has exited
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3); print('late')"])
    print("early", flush=True)
if what == "sleep":
    open(sys.argv[2], "w").write(str(os.getpid()))
    time.sleep(60)
"""


def test_run_cli_through_a_zygote_is_subprocess_run_of_a_fresh_process(tmp_path):
    """``run_cli``'s zygote path has no client process (tests/support/zygote_call.py): what the test
    reads is what ``subprocess.run(capture_output=True, text=True)`` of a fresh process gives: the
    status (a death by a signal too), stdout and stderr with newlines translated, ``input`` past a
    pipe's buffer, the working directory and umask, output a grandchild writes after the command
    ended; a timeout raises ``TimeoutExpired`` and the command is killed."""
    import os
    import signal
    import time

    from .support import zygotes

    script = tmp_path / "step.py"
    script.write_text(STEP)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    fresh_argv = [sys.executable, str(script)]
    text = "ab\r\ncd\n" * 40_000
    for args, given in ((["echo"], text), (["signal"], None), (["grandchild"], None)):
        z = zygotes.run(args, env=env, input=given, timeout=60, cwd=tmp_path, fresh_argv=fresh_argv, script=str(script))
        f = subprocess.run([*fresh_argv, *args], env=env, input=given, timeout=60, cwd=tmp_path, capture_output=True,
                           text=True)
        assert z.via_zygote and (z.args, z.returncode, z.stdout, z.stderr) == (f.args, f.returncode, f.stdout, f.stderr)
        assert z.returncode == {"echo": 5, "signal": -signal.SIGTERM, "grandchild": 0}[args[0]], z.stderr
    assert len(z.stdout) == len("early\nlate\n")
    pid_file = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):  # the command sleeps 60 s: ignoring the timeout returns
        zygotes.run(["sleep", str(pid_file)], env=env, input=None, timeout=2, cwd=tmp_path, fresh_argv=fresh_argv,
                    script=str(script))
    pid = int(pid_file.read_text())
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the command outlived its timeout")


def test_what_subprocess_refuses_or_times_out_fails_the_same_way_through_a_zygote(tmp_path):
    """A NUL in an argument (the request's separator) or ``=`` in a variable's name is refused as
    ``subprocess`` refuses it, never sent; a missing working directory fails as a fresh process's
    and leaves the zygote serving (a command it runs meanwhile is not lost); a zygote that does not
    answer within the timeout is ``TimeoutExpired``, not a fresh run with a new timeout."""
    import os
    import signal
    import threading
    import time

    from .support import zygotes

    script = tmp_path / "step.py"
    script.write_text(STEP)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    run = dict(env=env, input=None, timeout=60, fresh_argv=[sys.executable, str(script)], script=str(script))
    for args, extra in ((["echo", "a\0ZZ=injected"], {}), (["echo"], {"A=B": "1"})):
        with pytest.raises(ValueError) as zyg:
            zygotes.run(args, **{**run, "env": {**env, **extra}}, cwd=tmp_path)
        with pytest.raises(ValueError) as fresh:
            subprocess.run([*run["fresh_argv"], *args], env={**env, **extra}, cwd=tmp_path)
        assert str(zyg.value) == str(fresh.value)
    z = zygotes.POOL.zygote_for(env)
    zygotes.POOL.done(z)
    pid_file = tmp_path / "pid"
    running = []

    def sleeper():
        try:
            running.append(zygotes.run(["sleep", str(pid_file)], **{**run, "timeout": 3}, cwd=tmp_path))
        except subprocess.TimeoutExpired:
            running.append("timeout")

    t = threading.Thread(target=sleeper, daemon=True)
    t.start()
    for _ in range(200):
        if pid_file.exists():
            break
        time.sleep(0.05)
    with pytest.raises(FileNotFoundError):
        zygotes.run(["echo"], **run, cwd=tmp_path / "absent")
    again = zygotes.run(["signal"], **run, cwd=tmp_path)
    assert again.via_zygote and not z.dead and zygotes.POOL.zygote_for(env) is z
    zygotes.POOL.done(z)
    t.join(60)
    assert running == ["timeout"], running  # it ran to its own timeout, not to a zygote stopped under it (197)
    os.kill(z.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            zygotes.run(["echo"], **{**run, "timeout": 1, "input": "x"}, cwd=tmp_path)
    finally:
        os.kill(z.proc.pid, signal.SIGCONT)


def test_fia_test_fresh_cli_runs_every_command_fresh(monkeypatch):
    from .conftest import run_cli

    monkeypatch.setenv("FIA_TEST_FRESH_CLI", "1")
    assert not run_cli("--version").via_zygote


def test_the_fault_launcher_runs_in_the_zygote_and_dies_where_asked(tmp_path):
    """tests/standins/fault_cli.py (the CLI killed at an exact step) runs as ``python SCRIPT`` in a
    zygote child: unkilled, its output is a fresh launcher's byte for byte; killed, the test sees
    the same SIGKILL death, and the kill left the same thing behind (a journal to roll forward)."""
    import signal

    from devtools.synthetic import write_fake_entry

    from .conftest import FAULT_CLI, run_cli
    from .standins.fault_cli import crash_at

    assert crash_at()[:2] == FAULT_CLI  # conftest's copy (it does not import the CLI) names the same launcher
    src = tmp_path / "src"
    write_fake_entry(src)
    archive = tmp_path / "a.tgz"
    assert run_cli("export", "-o", str(archive), "--cache-dir", str(src)).returncode == 0
    plain = [*FAULT_CLI, "--"]
    z, f = _both("ls", "--cache-dir", str(src), launcher=plain)
    assert (z.returncode, z.stdout, z.stderr) == (f.returncode, f.stdout, f.stderr) and z.returncode == 0
    z, f = _both("ls", "--bogus", launcher=plain)
    assert (z.returncode, z.stdout, z.stderr) == (f.returncode, f.stdout, f.stderr) and z.returncode == 2
    left = {}
    for fresh in (False, True):
        dest = tmp_path / f"dest-{fresh}"
        killed = run_cli("import", str(archive), "--cache-dir", str(dest), fresh=fresh,
                         launcher=[*FAULT_CLI, "--crash-at", "txn.journaled", "--"])
        assert killed.returncode == -signal.SIGKILL and killed.via_zygote is not fresh, killed.stderr
        left[fresh] = sorted(p.parent.name for p in dest.rglob("*.json") if p.parent.name == ".fi-autotune-journal")
    assert left[False] == left[True] == [".fi-autotune-journal"]


def test_fi_autotune_on_a_shells_path_is_the_console_script(tmp_path):
    """``zygotes.cli_on_path`` (the recipes' and docs examples' shells): the shell's ``fi-autotune`` is
    the installed console script forked by a zygote, and prints and exits as that script run fresh;
    a command whose environment differs from the zygote's in what it read at import (another
    ``$HOME``, which fsspec and botocore read at import, exported by the shell) is refused by the
    zygote and runs fresh."""
    import os

    from .support import zygotes

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the installed fi-autotune
    absent = str(tmp_path / "absent")
    script = (f"fi-autotune ls --bogus; echo rc=$?; fi-autotune --version; fi-autotune ls --cache-dir {absent}; "
              f"echo rc=$?; HOME={tmp_path} fi-autotune ls --help; echo rc=$?\n")
    fresh = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    with zygotes.cli_on_path(env) as shell_env:
        found = subprocess.run(["bash", "-c", "type -p fi-autotune"], env=shell_env, capture_output=True, text=True)
        assert found.stdout.strip() != shutil.which("fi-autotune", path=env["PATH"]), found.stdout
        z = subprocess.run(["bash", "-c", script], env=shell_env, capture_output=True, text=True, timeout=120)
    assert (z.returncode, z.stdout, z.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert z.stdout.count("rc=") == 3 and "rc=2" in z.stdout and "rc=1" in z.stdout, z.stdout
    # the zygote itself: it takes a request in its own environment, refuses one that differs at import
    taken = []
    for extra in ({}, {"HOME": str(tmp_path)}):
        zyg = zygotes.POOL.zygote_for(env)
        marker_r, marker_w = os.pipe()
        try:
            p = subprocess.run([*zygotes.client_argv(zyg, marker_w), "--version"], env={**env, **extra},
                               capture_output=True, text=True, pass_fds=(marker_w,), timeout=60)
        finally:
            zygotes.POOL.done(zyg)
            os.close(marker_w)
        taken.append((p.returncode, os.read(marker_r, 1)))
        os.close(marker_r)
    assert taken == [(0, b"S"), (197, b"")], taken  # 197: zygote_client.NOT_STARTED (run_cli: fresh)


def test_a_stand_in_script_a_shell_runs_is_forked_by_the_zygote_else_fresh(tmp_path, monkeypatch):
    """``cli_on_path(env, scripts)``: ``"$VAR" ARGS`` in the shell runs ``python SCRIPT ARGS``, in a
    zygote child where one serves the shell's environment (the docs recipes' GPU steps), fresh
    where none does; the same arguments, output and exit status either way."""
    import os

    from .support import zygotes

    script = tmp_path / "step.py"
    script.write_text("import sys\nprint(sys.argv[1:], 'tests.support.zygote' in sys.modules)\nsys.exit(3)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    seen = {}
    for how in ("zygote", "fresh"):
        if how == "fresh":
            monkeypatch.setenv("FIA_TEST_FRESH_CLI", "1")  # no zygote serves any environment
        with zygotes.cli_on_path(env, {"FI_STEP": script}) as shell_env:
            seen[how] = subprocess.run(["bash", "-c", '"$FI_STEP" env --json; echo rc=$?'], env=shell_env,
                                       capture_output=True, text=True, timeout=60).stdout
    assert seen == {"zygote": "['env', '--json'] True\nrc=3\n", "fresh": "['env', '--json'] False\nrc=3\n"}, seen


def test_the_stand_in_gpus_cli_runs_in_the_zygote_as_a_fresh_one_would(tmp_path):
    """tests/standins/fake_gpu_cli.py (the CLI on stand-in GPUs, its workers fake_worker.py) runs as
    ``python SCRIPT`` in a zygote child, its checkout-only PYTHONPATH included: a warm writes what a
    fresh launcher's warm writes, and a usage error is the same line and exit status."""
    from .conftest import FAKE_GPU_CLI, REPO, run_cli
    from .support.fake_gpus import FAKE_GPU_CLI as SUPPORT_COPY, gpu_env, run_gpu_cli

    if os.environ.get("PYTHONPATH", str(REPO)) != str(REPO):
        pytest.skip("a PYTHONPATH of the runner's own: commands with the stand-in GPUs' PYTHONPATH run fresh")

    assert SUPPORT_COPY == FAKE_GPU_CLI  # conftest's copy names the same launcher
    qwen = ["--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass"]
    written = {}
    for fresh in (False, True):
        env = gpu_env(tmp_path / str(fresh))
        if fresh:
            proc = run_cli("warm", *qwen, "--cache-dir", str(tmp_path / f"root-{fresh}"), env=env,
                           launcher=FAKE_GPU_CLI, fresh=True)
        else:
            proc = run_gpu_cli("warm", *qwen, "--cache-dir", str(tmp_path / f"root-{fresh}"), env=env)
        assert proc.returncode == 0 and proc.via_zygote is not fresh, proc.stderr
        root = tmp_path / f"root-{fresh}"
        written[fresh] = sorted((str(p.relative_to(root)), p.read_bytes()) for p in root.rglob("rank_*.json"))
    assert written[False] == written[True] and len(written[False]) == 2
    z = run_gpu_cli("warm", "--bogus", env=gpu_env(tmp_path))
    f = run_cli("warm", "--bogus", env=gpu_env(tmp_path), launcher=FAKE_GPU_CLI, fresh=True)
    assert (z.returncode, z.stdout, z.stderr, z.via_zygote) == (f.returncode, f.stdout, f.stderr, not f.via_zygote) == \
        (2, "", f.stderr, True)


#: Packages that cost a worker seconds to import: a test module loads them inside the tests that
#: need them (tests/support/lazy.py), never while every worker collects.
HEAVY_AT_COLLECTION = ("torch", "flashinfer", "boto3", "botocore", "moto", "s3fs", "gcsfs")


def _heavy_top_level(tree) -> list[str]:
    """The heavy packages a module imports, or asks ``pytest.importorskip`` for, at its top level."""
    import ast

    found = []
    for node in tree.body:
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, (ast.Expr, ast.Assign)) and isinstance(node.value, ast.Call):
            f = node.value.func
            if isinstance(f, ast.Attribute) and f.attr == "importorskip" and node.value.args and \
                    isinstance(node.value.args[0], ast.Constant):
                names = [node.value.args[0].value]
        found += [n for n in names if n.split(".")[0] in HEAVY_AT_COLLECTION]
    return found


def test_no_test_module_imports_torch_flashinfer_or_the_s3_stack_while_collecting():
    """Each xdist worker collects every test module: a module-level ``import torch`` or
    ``pytest.importorskip("flashinfer...")`` cost each worker ~5 CPU-s (3 workers: 15 of the
    suite's CPU-s), whether or not it ran one of that module's tests."""
    import ast

    heavy = {}
    for path in sorted(Path(__file__).resolve().parent.rglob("test_*.py")):
        if names := _heavy_top_level(ast.parse(path.read_text())):
            heavy[str(path.relative_to(Path(__file__).resolve().parent.parent))] = names
    assert heavy == {}, "use tests/support/lazy.py's importorskip_lazily: " + repr(heavy)
    bad = ast.parse('import os\ncore = pytest.importorskip("flashinfer.jit.core")\nfrom moto import server\n')
    assert _heavy_top_level(bad) == ["flashinfer.jit.core", "moto"]  # the check itself sees both forms


_HOMES_SEEN: list[str] = []


@pytest.mark.xdist_group("own-homes")
@pytest.mark.parametrize("i", range(3))
def test_each_test_has_its_own_home_caches_off_the_users(i):
    """``_own_home_caches`` (tests/conftest.py): a store root that does not exist and a user cache
    of the test's own, numbered without listing a directory; never the user's ~/.cache."""
    xdg, store = Path(os.environ["XDG_CACHE_HOME"]), Path(os.environ["FLASHINFER_AUTOTUNE_CACHE_DIR"])
    assert xdg.parent == store.parent and xdg.parent.is_dir() and not store.exists()
    assert Path.home() not in xdg.parents
    assert str(xdg) not in _HOMES_SEEN, "two tests shared a home"
    _HOMES_SEEN.append(str(xdg))


BOTOCORE_LOADER = """
import hashlib, json, sys
import botocore.session

loader = botocore.session.Session().get_component("data_loader")
parsed = sorted({key[1] for key in getattr(loader, "_cache", {}) if key[0] == "load_service_model"})
model = loader.load_service_model("s3", "service-2")
print(json.dumps({"parsed": parsed, "paths": loader.search_paths,
                  "retries": loader.load_data("_retry")["retry"]["__default__"]["max_attempts"],
                  "model": hashlib.sha256(json.dumps(model, sort_keys=True).encode()).hexdigest()}))
"""


def test_a_zygote_child_reads_s3_model_the_zygote_parsed_and_the_same_as_a_fresh_one(tmp_path):
    """The zygote parses botocore's data files once (``_prime_botocore``): a child's session is handed
    that loader, with S3's model already in it and equal to what a fresh process reads. A session with
    a data path of its own (``AWS_DATA_PATH``), or where the user's ``~/.aws/models`` has appeared since
    the zygote started, reads for itself, as it does in a fresh process."""
    import json
    import os

    botocore_loaders = pytest.importorskip("botocore.loaders")
    from .support import zygotes

    script = tmp_path / "loader.py"
    script.write_text(BOTOCORE_LOADER)
    home = tmp_path / "home"  # a zygote of its own (HOME is read at import), with no ~/.aws/models yet
    home.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k != "AWS_DATA_PATH"}, "HOME": str(home)}
    own = tmp_path / "models"
    own.mkdir()

    def both(extra: dict) -> tuple[dict, dict]:
        z = zygotes.run([], env={**env, **extra}, input=None, timeout=60, cwd=tmp_path,
                        fresh_argv=[sys.executable, str(script)], script=str(script))
        f = subprocess.run([sys.executable, str(script)], env={**env, **extra}, timeout=60, cwd=tmp_path,
                           capture_output=True, text=True)
        assert z.via_zygote and z.returncode == f.returncode == 0, z.stderr + f.stderr
        return json.loads(z.stdout), json.loads(f.stdout)

    primed, fresh = both({})
    assert primed["parsed"] == ["s3"] and fresh["parsed"] == [], (primed, fresh)
    assert {**primed, "parsed": []} == fresh
    own_zygote, own_fresh = both({"AWS_DATA_PATH": str(own)})
    assert own_zygote["parsed"] == [] and own_zygote == own_fresh and str(own) in own_zygote["paths"], own_zygote
    # the user's models directory, made after the zygote started: botocore reads it before its own
    retry = json.loads((Path(botocore_loaders.Loader.BUILTIN_DATA_PATH) / "_retry.json").read_text())
    retry["retry"]["__default__"]["max_attempts"] = fresh["retries"] + 7
    (home / ".aws" / "models").mkdir(parents=True)
    (home / ".aws" / "models" / "_retry.json").write_text(json.dumps(retry))
    users, users_fresh = both({})
    assert users["parsed"] == [] and users == users_fresh and users["retries"] == fresh["retries"] + 7, users
