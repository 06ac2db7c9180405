from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .support import zygotes
from .support.servers import SECRET, free_port, wait_for


def pytest_configure(config):
    """Compile the package's bytecode once, before any test runs. The suite starts about 1,300 real
    ``fi-autotune`` processes; where ``PYTHONDONTWRITEBYTECODE`` is set (this project's machines and
    CI set it) none of them may write ``__pycache__``, so each compiled every module from source
    again (0.09 CPU-s of a 0.23 CPU-s start). An installed wheel ships its bytecode; an editable
    checkout gets it here. Python still checks each file's source stamp, so an edited module is
    recompiled as usual."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
        return
    import compileall

    for folder in ("autotune_cache", "cli", "devtools", "tests/standins", "tests/support"):
        compileall.compile_dir(str(REPO / folder), quiet=1, workers=1)
    _rewrite_test_modules_once(config)


def _rewrite_test_modules_once(config) -> None:
    """pytest keeps each test module's assert-rewritten code in ``__pycache__`` (``*-pytest-*.pyc``),
    but writes it only where ``PYTHONDONTWRITEBYTECODE`` is unset; it reads it either way. Unwritten,
    every test process rewrote every test module again while collecting: about 3 CPU-s of each
    process's 6.6. Written here once, before the test processes start; from pytest's own functions
    (pinned below 9.2), so that a change there costs the cache and never a test: the processes then
    rewrite as before."""
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return
    if config.getoption("assertmode", "rewrite") != "rewrite":
        return

    class _Quiet:
        trace = staticmethod(lambda *a: None)

    for fn in sorted(REPO.glob("tests/**/*.py")):
        if not fn.name.startswith("test_") and fn.name != "conftest.py":
            continue
        try:
            pyc = rewrite.get_cache_dir(fn) / (fn.name[:-3] + rewrite.PYC_TAIL)
            if rewrite._read_pyc(fn, pyc, _Quiet.trace) is not None:  # noqa: SLF001
                continue
            pyc.parent.mkdir(exist_ok=True)
            stat, code = rewrite._rewrite_test(fn, config)  # noqa: SLF001
            rewrite._write_pyc(_Quiet(), code, stat, pyc)  # noqa: SLF001
        except Exception:  # noqa: BLE001 - a cache: the test process rewrites the module itself
            continue

REPO = Path(__file__).resolve().parent.parent
CLI_ARGV = [sys.executable, "-m", "fi_autotune_cli"]
#: tests/standins/fault_cli.py's ``FAULT_CLI`` (not imported here: it imports the whole CLI)
FAULT_CLI = [sys.executable, str(Path(__file__).resolve().parent / "standins" / "fault_cli.py")]
#: tests/support/fake_gpus.py's ``FAKE_GPU_CLI``: the CLI on stand-in GPUs
FAKE_GPU_CLI = [sys.executable, str(Path(__file__).resolve().parent / "standins" / "fake_gpu_cli.py")]
#: tests/standins/deploy_steps.py: the docs recipes' GPU steps (``env``, ``warm``) on no GPU; a recipe's
#: shell runs it as ``"$FI_GPU_STEPS" ARGS`` (zygotes.cli_on_path: forked by a zygote where one serves)
GPU_STEPS = {"FI_GPU_STEPS": Path(__file__).resolve().parent / "standins" / "deploy_steps.py"}
#: launchers the zygote runs as ``python SCRIPT`` (each a script that runs the CLI in its process)
ZYGOTE_SCRIPTS = (FAULT_CLI, FAKE_GPU_CLI)

# No test may wait on the Hugging Face hub (CI has no network); the hub path is exercised through
# a real local cache in test_config_spec.py.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# A shell starts background jobs (`pytest &`, CI runners, nohup) with SIGINT ignored, and an ignored
# signal stays ignored in every child: the tests that press Ctrl-C on a command (exit 130, the commit
# that defers it) would then see nothing happen. A user's terminal delivers it: so do the tests.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def _homes(tmp_path_factory) -> Path:
    """One directory per test process for every test's own home (``_own_home_caches``)."""
    return tmp_path_factory.mktemp("homes")


_HOME_NUMBERS = itertools.count()
_TMP_NUMBERS = itertools.count()


@pytest.fixture(scope="session")
def _tmp_paths(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("t")


@pytest.fixture
def tmp_path(request, _tmp_paths) -> Path:
    """pytest's ``tmp_path`` (a new directory per test, named after it, kept as pytest keeps them),
    numbered here for the reason ``_own_home_caches`` gives: pytest finds its next number by
    listing the whole base directory, which each test's directory grows (~1,000 per test process)."""
    path = _tmp_paths / (re.sub(r"\W", "_", request.node.name)[:30] + str(next(_TMP_NUMBERS)))
    path.mkdir()
    return path


@pytest.fixture(autouse=True)
def _own_home_caches(_homes, monkeypatch):
    """Keep every test off this machine's home, both ways. `ls` without --cache-dir lists each
    layout whose default root exists, so a FlashInfer store left under ~/.cache/flashinfer/autotune
    (by an engine, or by anything run on a shared CI host) would show up in tests that expect none;
    and our own digest index and work dirs (platformdirs' user cache) must not pile up in the
    user's ~/.cache/fi-autotune. Each test gets its own not-yet-existing store root and its own
    user cache; tests of those name their own.

    Numbered here, under one directory: ``tmp_path_factory.mktemp`` finds its next number by
    listing the base directory, which every test's directories fill (~2,000 per test process), so
    ~1,000 calls cost ~2 million name parses, a few CPU-s per process."""
    home = _homes / f"home{next(_HOME_NUMBERS)}"
    home.mkdir()
    monkeypatch.setenv("FLASHINFER_AUTOTUNE_CACHE_DIR", str(home / "no-flashinfer-v2"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "xdg-cache"))


def run_cli(*args: str, env: dict | None = None, input: str | None = None, timeout: float = 120,
            launcher: list[str] | None = None, fresh: bool = False, **kw) -> subprocess.CompletedProcess:
    """The real command in a real process, as a user runs it; ``launcher``: the command that
    runs it instead of ``python -m fi_autotune_cli`` (tests/standins/fault_cli.py's ``crash_at``).

    The process is forked by this test process's CLI fork server (tests/support/zygote.py: the
    same ``python -m fi_autotune_cli`` code path and process semantics, without ~0.3 CPU-s of
    imports each time), except where it must be a fresh interpreter: ``fresh=True``, a
    ``launcher`` other than the fault launcher's and the stand-in GPUs' (which the zygote runs as
    ``python SCRIPT``), extra
    ``subprocess`` arguments (``preexec_fn``...), ``PYTHON*`` variables other than this process's,
    or ``FIA_TEST_FRESH_CLI=1`` (every command fresh: the suite as before)."""
    # the runner's terminal (xdist workers export COLUMNS) must not shape what a test reads
    full_env = {**{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}, **(env or {})}
    cwd = kw.pop("cwd", REPO)
    if launcher is None and not fresh and not kw:
        return zygotes.run(args, env=full_env, input=input, timeout=timeout, cwd=cwd, fresh_argv=CLI_ARGV)
    script = next((s for s in ZYGOTE_SCRIPTS if launcher is not None and launcher[:2] == s), None)
    if script is not None and not fresh and not kw:  # the CLI killed at a step, or on stand-in GPUs
        return zygotes.run([*launcher[2:], *args], env=full_env, input=input, timeout=timeout, cwd=cwd,
                           fresh_argv=script, script=script[1])
    proc = subprocess.run(
        [*(launcher or CLI_ARGV), *args], capture_output=True, text=True,
        env=full_env, input=input, timeout=timeout, cwd=cwd, **kw,
    )
    proc.via_zygote = False
    return proc


def imported_packages(stderr: str) -> set[str]:
    """The top-level packages a command run with ``PYTHONPROFILEIMPORTTIME=1`` imported (its stderr's
    "import time:" lines; through a zygote, only what the zygote had not preloaded)."""
    return {line.split("|")[-1].strip().split(".")[0] for line in stderr.splitlines() if line.startswith("import time:")}


def error_lines(stderr: str) -> list[str]:
    """A command's stderr without ``PYTHONPROFILEIMPORTTIME``'s lines."""
    return [line for line in stderr.splitlines() if not line.startswith("import time:")]


def run_json(*args: str, **kw):
    proc = run_cli(*args, "--json", **kw)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def host_env() -> subprocess.CompletedProcess:
    """``fi-autotune env --json --allow-unknown`` run once per test process, as a user runs it (a
    real process; it imports torch and flashinfer: about 5 CPU-seconds). This host's fingerprint
    does not change while the tests run; the tests that read it share the one run. They are in
    the ``host-env`` xdist group so that one test process runs it - but pytest-xdist 3.8's
    ``--dist loadgroup`` does nothing under pytest >= 9.2 (it suffixes ``item._nodeid``, which
    pytest no longer reads), so today each worker may run it once. Tests of ``env``'s other forms
    (without ``--allow-unknown``, the table) run those themselves."""
    return run_cli("env", "--json", "--allow-unknown")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "sglang-cache"
    r.mkdir()
    return r


#: collected first (docs/results/test_time_profile.md: where the time goes)
SLOW_FIRST = ("tests/tree/", "tests/tune/")

#: The test modules that import torch and FlashInfer into the test process (to compare with their
#: own functions, or to build layers on CPU). Each test process that runs one pays ~4.5 CPU-s for
#: the import, so they are one xdist group ("torch"): one process imports them. Found by running
#: each module alone; ``_torch_stays_in_its_group`` fails a test elsewhere that imports torch.
IMPORTS_TORCH = tuple(f"tests/{m}.py::" for m in (
    "autotuner/test_buckets", "autotuner/test_fingerprint", "engines/test_sglang_oracle", "engines/test_v2_bundles",
    "engines/test_v2store", "engines/test_vllm_plan", "engines/test_vllm_single_rank", "engines/test_vllm_sm100",
    "tune/careful/test_exhaustive", "tune/careful/test_race_context", "tune/careful/test_span",
    "tune/workers/test_kernel_modules", "tune/workers/test_skeleton"))


@pytest.fixture(autouse=True)
def _torch_stays_in_its_group(request):
    """A test outside ``IMPORTS_TORCH`` that brings torch into the test process fails, naming the
    list: seen when it is the first in its process to import it (always so in a process that runs
    none of the group), which is enough to keep the list true."""
    before = "torch" in sys.modules
    yield
    if before or "gpu" in request.node.keywords:  # the GPU tests are a group of their own
        return
    if "torch" in sys.modules and not request.node.nodeid.startswith(IMPORTS_TORCH):
        pytest.fail(f"{request.node.nodeid} imported torch into the test process: add its module to "
                    "tests/conftest.py IMPORTS_TORCH (one xdist group, so that one process imports it)")


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than the cores this process may use. Part of the suite waits
    rather than computes - store timeouts against silent servers, served workers' idle exits,
    killed commands' survivors, moto answering - and with a worker per core a core sits idle
    through each wait. On 2 cores, 3 workers ran the suite in 171 s against 180 s with 2 (the
    same run, one after the other; 4 workers: 174 s, more CPU for nothing): see
    docs/results/test_time_profile.md. ``-n N`` still says exactly how many."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return cores + 1


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups
def pytest_collection_modifyitems(config, items):
    """GPU tests need CUDA; skip them (visibly) on machines without a GPU. Where they run, they run
    one after another in one test process (``--dist loadgroup``): they time kernels, and two tuning
    runs on one GPU would measure each other.

    The slow folders (stores, kills and served workers) are handed out first, the many short tests
    last, so that both test processes finish at about the same time (in collection order the
    slowest files came last and one process ran them alone). Same tests, same ids; within a file
    the order is the file's. The modules of ``IMPORTS_TORCH`` are one group."""
    items.sort(key=lambda item: 0 if item.nodeid.startswith(SLOW_FIRST) else 1)  # stable
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("gpu"))
        elif item.nodeid.startswith(IMPORTS_TORCH):
            item.add_marker(pytest.mark.xdist_group("torch"))
    try:
        has_gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine (these tests tune on a real GPU: run them there with -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def unprivileged(argv: list[str]) -> list[str]:
    """``argv`` run so that file permissions apply: as root, without the capabilities that
    override them (the interpreter may live under root's 0700 home, so no uid change); as any
    other user, unchanged. Skips the test where neither is possible."""
    if os.geteuid() != 0:
        return argv
    import shutil

    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot drop the permission-override capabilities")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", *argv]


def run_cli_unprivileged(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(unprivileged([sys.executable, "-m", "fi_autotune_cli", *args]), capture_output=True,
                          text=True, env={**os.environ}, timeout=120, cwd=REPO, **kw)


@pytest.fixture
def tmpfs(tmp_path):
    """A small tmpfs (root only): ``tmpfs(size="2m", options="noatime") -> Path``; skipped where
    mounting is not allowed."""
    mounted: list[Path] = []

    def make(size: str = "2m", options: str = "") -> Path:
        target = tmp_path / f"tmpfs{len(mounted)}"
        target.mkdir()
        opts = f"size={size}" + (f",{options}" if options else "")
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(target)], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()[:100]}")
        mounted.append(target)
        return target

    yield make
    for target in mounted:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


@pytest.fixture(scope="session")
def s3_server_log(tmp_path_factory) -> Path:
    """Where the S3 server logs each request it answers, one line each (its method and path):
    what a test counts a command's requests in."""
    return tmp_path_factory.mktemp("moto") / "server.log"


@pytest.fixture(scope="session")
def s3_server(s3_server_log):
    """A real S3 server on loopback (moto's server mode), one per test process (xdist worker)."""
    pytest.importorskip("moto")
    port = free_port()
    # Its log goes to a file, never to a pipe nobody reads: the server logs every request, and
    # once a pipe's buffer is full it blocks on the write and stops answering.
    log = s3_server_log
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        wait_for(port, proc, log=log)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def s3(s3_server, s3_server_log, monkeypatch, request):
    """A fresh bucket and the environment every S3 client (ours and boto3) reads."""
    pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    env = {
        "AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    bucket = f"b{abs(hash(request.node.nodeid)) % 10**10}"  # the server is shared by the whole session
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key=SECRET)
    client.create_bucket(Bucket=bucket)
    return {"url": f"s3://{bucket}/caches", "bucket": bucket, "client": client, "env": env, "log": s3_server_log}
