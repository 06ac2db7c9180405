"""A fork server for the tests' CLI processes ("zygote"): ``run_cli`` without ~0.3 CPU-s of imports per run.

The suite starts ~1,300 real ``python -m fi_autotune_cli`` processes; each spent 0.25-0.3 CPU-s
importing click and our package (0.8 with s3fs for an S3 command) before doing anything: over
half of the suite's CPU (docs/results/test_time_profile.md). The zygote imports all of that once
per test process, then for each command forks a child that IS the command: a real process (its
own pid, exit status, signals, file descriptors) running the real ``python -m fi_autotune_cli``
code path (``runpy._run_module_as_main``, what ``-m`` calls), set up as a fresh interpreter is:

- ``os.environ`` replaced wholesale by the request's (``putenv``/``unsetenv`` too: what the command
  starts sees it), the request's working directory and umask, ``sys.argv``/``sys.orig_argv`` and
  ``sys.path[0]`` as ``python -m`` sets them;
- file descriptors 0, 1, 2 are the caller's (received over the socket, SCM_RIGHTS), every other
  descriptor of the zygote closed; ``sys.stdin/stdout/stderr`` rebuilt on them as the
  interpreter builds them (encoding and errors of this interpreter, line buffering where a tty,
  stderr always line-buffered, ``newline="\\n"``);
- every signal disposition back to what a fresh interpreter has (SIGINT: KeyboardInterrupt;
  SIGPIPE, SIGXFSZ: ignored; the rest default), no blocked signals, no wakeup fd;
- the end as the interpreter ends: ``SystemExit`` codes as Python maps them, an uncaught exception
  printed by ``sys.excepthook`` (exit 1), an uncaught ``KeyboardInterrupt`` re-raised as a SIGINT
  death; then non-daemon threads joined, atexit handlers, stdout and stderr flushed (a failed flush:
  "Exception ignored", exit 120), ``os._exit``.
- ``random`` reseeds itself in a forked child (its own ``os.register_at_fork``); ``tempfile`` names
  follow the pid. Shared with the zygote (not per process as in a fresh interpreter): the str hash
  seed. Its process group is the zygote's, which is the test process's, as for ``subprocess``.

It runs as ``python -c "from tests.support.zygote import serve; serve()" SOCKET READY_FD
PARENT_FD`` with the environment of the run that started it, and serves one UNIX socket;
``run_cli`` asks it from the test process itself (``tests/support/zygote_call.py``: the ends of its
own pipes as the command's fds, the command's status read here). Where a process must stand for the
command (a ``Popen`` whose signals reach the command, a shell's ``fi-autotune``),
``tests/support/zygote_client.py`` is that process (it forwards signals and exits with the
command's status); both send the same request. It exits when its test process does (EOF on
PARENT_FD, a pipe whose other end only the test process holds), and on SIGTERM.

Environment read at import time (what a child would inherit from the zygote instead of reading
its own). Found by tracing every ``os.environ`` access while the zygote imports what it preloads
(``IMPORT_TIME_READS`` below is filled the same way on every start, so a new import-time read
is caught, not assumed away):

- our package: none. ``--layout``'s help names each layout's root source (``$SGLANG_CACHE_DIR``,
  ``~/.cache/sglang``...), read from the environment when ``--help`` shows it (cli/params.py
  ``HelpWhenShown``), not at import.
- fsspec.config reads every ``FSSPEC_*`` variable (it copies the environment and keeps ``FSSPEC*``)
  and ``FSSPEC_CONFIG_DIR`` into its ``conf`` at import; s3fs ``S3FS_LOGGING_LEVEL``; botocore
  ``HOME`` (default paths) and ``AWS_NEW_RETRIES_2026``; aiohttp ``AIOHTTP_NO_EXTENSIONS``,
  ``PYTHONASYNCIODEBUG``; yarl/multidict/propcache/frozenlist/wrapt their ``*_NO_EXTENSIONS``;
  ssl ``SSLKEYLOGFILE``; gettext (click) ``LANGUAGE``, ``LC_ALL``, ``LC_MESSAGES``, ``LANG``;
  platformdirs ``ANDROID_DATA``: matched by exact value. tqdm reads every ``TQDM_*`` variable
  (its ``envwrap`` walks the environment for them): all of those are part of the signature.
- not preloaded, because they keep environment-derived constants: huggingface_hub (``HF_HOME``,
  ``HF_HUB_OFFLINE``, and ``XDG_CACHE_HOME``, which every test sets to its own, in
  ``huggingface_hub.constants``), torch, flashinfer. What huggingface_hub imports is preloaded
  (yaml, filelock, tqdm: two thirds of its import): a command that looks for a model's config in
  the HF cache imports only huggingface_hub's own modules.
- botocore's data files (S3's model, endpoint rules, partitions) are parsed once too, from the
  default search path that botocore fixes at import (``HOME``, above): ``_prime_botocore`` (two
  thirds of what an S3 command cost after its imports).
- the interpreter itself: every ``PYTHON*`` variable and the locale (``LANG``, ``LC_ALL``,
  ``LC_CTYPE``) shape startup (stdio encoding, hash seed, paths, warnings): exact value.

``run_cli`` (tests/conftest.py) keeps one zygote per distinct ``signature(env)`` (at most a few
per test process) and runs the command fresh where the signature's ``PYTHON*`` part differs
from the test process's own.
"""

from __future__ import annotations

import io
import json
import os
import selectors
import signal
import socket
import struct
import sys

#: preloaded in the zygote: the CLI and every command module (not warm's or verify's torch,
#: imported only when such a command runs), the engines the registry names (imported by the first
#: command that plans, lists or checks: about 0.2 CPU-s a run), and what an S3 command imports.
PRELOAD = ("click", "fi_autotune_cli.entry", "fi_autotune_cli.main", "autotune_cache.engines.sglang.engine",
           "autotune_cache.engines.vllm.engine", "autotune_cache.tree.layout_kinds.flashinfer_v2.layout",
           # the package's public names are imported when first used (autotune_cache/__init__.py): the
           # modules behind them, which nearly every command imports, loaded once here
           "autotune_cache.tree.scanner.scan", "autotune_cache.tree.manifest", "autotune_cache.tune.workers.lm_head")
PRELOAD_OPTIONAL = ("s3fs", "fsspec", "aiobotocore.session", "botocore.session",
                    # what a command that plans imports through huggingface_hub (not preloaded itself: see
                    # above), and the user-cache paths (the digest index, work dirs)
                    "yaml", "filelock", "tqdm", "tqdm.auto", "platformdirs",
                    # what every child runs the command through, and what fsspec imports to open any URL
                    "runpy", "fsspec.implementations.chained")

#: what tests/support/zygote_client.py passes on to the command (the process that stands for it)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
#: read by the interpreter at startup
STARTUP_EXACT = ("LANG", "LC_ALL", "LC_CTYPE")
#: the variables read while importing PRELOAD; "<iterated>" where something other than a PREFIX_READERS
#: module walked the whole environment (then every variable counts)
IMPORT_TIME_READS: set[str] = set()
#: modules that walk the whole environment at import and keep the variables of one prefix: those
#: variables are always part of the signature, the rest of the walk is not a read
PREFIX_READERS = {os.path.join("fsspec", "config.py"): "FSSPEC", os.path.join("tqdm", "utils.py"): "TQDM_"}


def signature(env: dict, reads) -> tuple:
    """What a zygote started with ``env`` has baked in at import: two environments with the same
    signature give the same imports; ``reads``: the variables the zygote read while importing."""
    if "<iterated>" in reads:
        return tuple(sorted(env.items()))
    names = set(reads) | {k for k in env if k.startswith(("PYTHON", *PREFIX_READERS.values()))} | set(STARTUP_EXACT)
    return tuple(sorted((n, env.get(n)) for n in names))


def _command_modules() -> list[str]:
    import fi_autotune_cli.main as m

    return [f"fi_autotune_cli.{target.partition(':')[0]}" for target in m.COMMANDS.values()]


def _preload() -> None:
    """Import what the CLI imports, recording every environment variable read while doing so."""
    import importlib.util

    env_class = type(os.environ)
    reads = IMPORT_TIME_READS

    def by_prefix_reader() -> bool:
        # fsspec.config copies the whole environment (``dict(os.environ)``) and keeps the FSSPEC*
        # variables, tqdm keeps the TQDM_* ones (``PREFIX_READERS``)
        f = sys._getframe(2)  # noqa: SLF001
        for _ in range(8):
            if f is None:
                return False
            if f.f_code.co_filename.endswith(tuple(PREFIX_READERS)):
                return True
            f = f.f_back
        return False

    class Traced(env_class):
        def __getitem__(self, key):
            if not by_prefix_reader():
                reads.add(key)
            return super().__getitem__(key)

        def __iter__(self):
            if not by_prefix_reader():
                reads.add("<iterated>")  # anyone else: every variable counts (never so far)
            return super().__iter__()

    os.environ.__class__ = Traced
    try:
        for name in PRELOAD:
            importlib.import_module(name)
        for name in _command_modules():
            importlib.import_module(name)
        for name in PRELOAD_OPTIONAL:
            try:
                importlib.import_module(name)
            except ImportError as e:
                if e.name == name and importlib.util.find_spec(name.partition(".")[0]) is not None:
                    raise  # the package is there, the module is not: a name here that is out of date
                # an extra that is not installed (s3fs without the [s3] extra...): the command imports it
    finally:
        os.environ.__class__ = env_class
    _prime_botocore()
    for forbidden in ("torch", "flashinfer", "huggingface_hub"):
        assert forbidden not in sys.modules, f"the zygote must not preload {forbidden}"
    # fork copies only the calling thread: a thread started by an import would be missing (and
    # might hold a lock) in every child; then the zygote does not start and run_cli runs fresh
    assert len(os.listdir("/proc/self/task")) == 1, "an import started a thread"


def _prime_botocore() -> None:
    """Read botocore's data files once, for every child: ~0.2 of an S3 command's ~0.3 CPU-s.

    Each botocore session makes its own data loader, which parses S3's service model, its endpoint
    rules, the partitions and the retry and default configs afresh (JSON of a few MB). Here one
    loader reads them, through a client made as an S3 command makes one, and a child's session is
    handed that loader where it asks for the default search path and the user's own models
    directory (``~/.aws/models``, which botocore searches first) is absent, as it was when the
    loader read: then the files are botocore's own, the same in every process, already parsed in
    memory the child inherits. Anywhere else (a data path of the session's own, ``AWS_DATA_PATH`` or
    a config file's ``data_path``; a models directory, made before or after this zygote started)
    the session gets a new loader and reads for itself, as in a fresh interpreter. Where the
    priming fails (a profile the zygote's environment names and no config holds), nothing is
    handed on. What a client writes into the loaded data (botocore fills in the endpoints it
    resolved, S3's handlers rewrite a request URI) comes out the same when written again: a child's
    client resolves the same endpoints as one on a fresh loader (checked across regions, dual-stack
    and FIPS, by a review of this change)."""
    try:
        import botocore.loaders
        import botocore.session
    except ImportError:
        return
    user_models = botocore.loaders.Loader.CUSTOMER_DATA_PATH  # ``~`` as botocore expanded it at import
    loader = botocore.loaders.create_loader()
    try:
        session = botocore.session.Session()
        session.register_component("data_loader", loader)
        session.create_client("s3", region_name="us-east-1", aws_access_key_id="zygote",
                              aws_secret_access_key="zygote")
    except Exception:  # noqa: BLE001 - an optimisation only: each child then reads for itself
        return
    fresh = botocore.session.create_loader

    def create_loader(search_path_string=None):
        if search_path_string is None and not os.path.lexists(user_models):
            return loader
        return fresh(search_path_string)

    botocore.session.create_loader = create_loader


def _stdio(fd: int, mode: str, like) -> io.TextIOWrapper:
    """``sys.stdin/stdout/stderr`` as the interpreter's create_stdio builds them."""
    raw = io.FileIO(fd, mode[0], closefd=False)
    raw.name = {0: "<stdin>", 1: "<stdout>", 2: "<stderr>"}[fd]
    buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
    line_buffering = fd == 2 or (fd != 0 and raw.isatty())
    text = io.TextIOWrapper(buffered, encoding=like.encoding, errors=like.errors, newline="\n",
                            line_buffering=line_buffering, write_through=False)
    text.mode = mode
    return text


def _finish(code: int, kill_with_sigint: bool) -> None:
    import threading

    try:
        threading._shutdown()  # noqa: SLF001 - as Py_FinalizeEx waits for non-daemon threads
    except BaseException:  # noqa: BLE001
        pass
    import atexit

    atexit._run_exitfuncs()  # noqa: SLF001
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            if stream is not None and not getattr(stream, "closed", False):
                stream.flush()
        except BaseException:  # noqa: BLE001 - as flush_std_files: "Exception ignored", exit 120
            sys.unraisablehook(_Unraisable(sys.exc_info(), stream))
            code = 120
    if kill_with_sigint:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


class _Unraisable:
    def __init__(self, exc_info, obj):
        self.exc_type, self.exc_value, self.exc_traceback = exc_info
        self.err_msg = None
        self.object = obj


def _exit_code(e: SystemExit) -> int:
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        sys.stderr.write(f"{code}\n")
    except BaseException:  # noqa: BLE001
        pass
    return 1


def _child(request: dict, fds: list[int], close: list) -> None:
    """In the forked child: become ``python -m fi_autotune_cli ARGS`` started by the client."""
    for s in range(1, signal.NSIG):
        if s in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(s, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.set_wakeup_fd(-1)
    for obj in close:
        obj.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.closerange(3, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 65536)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    like = (sys.__stdin__, sys.__stdout__, sys.__stderr__)
    sys.stdin = sys.__stdin__ = _stdio(0, "r", like[0])
    sys.stdout = sys.__stdout__ = _stdio(1, "w", like[1])
    sys.stderr = sys.__stderr__ = _stdio(2, "w", like[2])
    cwd = os.getcwd()
    script = request.get("script") or ""
    if script:  # ``python SCRIPT ARGS`` (the fault launcher): argv[0] and sys.path[0] as a script has them
        sys.path[0] = os.path.dirname(os.path.realpath(script))
        sys.argv = [script, *request["argv"]]
        sys.orig_argv = [sys.executable, script, *request["argv"]]
    else:
        sys.path[0] = cwd
        sys.argv = ["-m", *request["argv"]]  # runpy sets argv[0] to the module's file, as -m does
        sys.orig_argv = [sys.executable, "-m", "fi_autotune_cli", *request["argv"]]
    main = sys.modules["__main__"]
    for key in [k for k in vars(main) if k != "__builtins__"]:
        delattr(main, key)
    import runpy

    code, sigint = 0, False
    try:
        # forked with the forwarded signals blocked (serve): one the client passed on while this
        # child was being set up arrives now, to a fresh interpreter's dispositions, not lost
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if script:
            runpy.run_path(script, run_name="__main__")  # what `python SCRIPT` runs
        else:
            runpy._run_module_as_main("fi_autotune_cli")  # noqa: SLF001 - what `python -m` calls
    except SystemExit as e:
        code = _exit_code(e)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code, sigint = 1, True
    except BaseException:  # noqa: BLE001 - as the interpreter: the traceback, exit 1
        sys.excepthook(*sys.exc_info())
        code = 1
    _finish(code, sigint)


def parse_request(data: bytes) -> dict:
    """What tests/support/zygote_client.py ``request_bytes`` makes (and zygote_call.py sends):
    NUL-separated cwd, umask, argc, argv, then the environment's ``NAME=value`` pairs."""
    fields = data.split(b"\0")
    argc = int(fields[3])
    env = dict(os.fsdecode(f).partition("=")[::2] for f in fields[4 + argc:] if f)
    return {"cwd": os.fsdecode(fields[0]), "umask": int(fields[1]), "script": os.fsdecode(fields[2]),
            "argv": [os.fsdecode(a) for a in fields[4:4 + argc]], "env": env}


def serve() -> None:
    path, ready_fd, parent_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    start_env = dict(os.environ)  # what this zygote's imports read (before any child replaces it)
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the test run ends it through parent_fd
    try:
        _preload()
    except BaseException as e:  # noqa: BLE001
        os.write(ready_fd, f"failed {type(e).__name__}: {e}\n".encode())
        raise
    import gc

    gc.collect()
    gc.freeze()  # the children share the preloaded heap without touching (copying) it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    # A request whose environment differs from this zygote's in what the imports read is refused
    # (no fork: the connection closes, the client exits NOT_STARTED, and the caller runs the
    # command fresh). run_cli only sends matching requests (tests/support/zygotes.py picks the
    # zygote by this signature); a ``fi-autotune`` on a shell's PATH (zygotes.cli_on_path) sends
    # whatever the shell exports.
    own = signature(start_env, IMPORT_TIME_READS)
    os.write(ready_fd, ("ready " + json.dumps(sorted(IMPORT_TIME_READS)) + "\n").encode())
    os.close(ready_fd)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(parent_fd, selectors.EVENT_READ, "parent")
    conns: dict[int, dict] = {}  # pidfd -> {"conn", "pid"}

    def receive(conn):
        msg, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
        if len(msg) < 4 or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            raise OSError("a short request")
        (size,) = struct.unpack("!I", msg[:4])
        data = msg[4:]
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                raise OSError("a short request")
            data += chunk
        return parse_request(data), fds

    while True:
        for key, _ in sel.select():
            what = key.data
            if what == "parent":
                os._exit(0)  # the test process is gone
            if what == "accept":
                conn, _ = listener.accept()
                conn.setblocking(True)
                try:
                    request, fds = receive(conn)
                except (OSError, ValueError):
                    conn.close()
                    continue
                if signature(request["env"], IMPORT_TIME_READS) != own:
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    continue
                others = [c["conn"] for c in conns.values()]
                mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
                pid = os.fork()
                if pid == 0:
                    try:
                        _child(request, fds, [sel, listener, conn, *others])
                    finally:
                        os._exit(70)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                conns[pidfd] = {"conn": conn, "pid": pid}
                sel.register(pidfd, selectors.EVENT_READ, ("child", pidfd))
                sel.register(conn, selectors.EVENT_READ, ("conn", pidfd))
                try:
                    conn.sendall(b"P%d\n" % pid)
                except OSError:
                    pass
                continue
            kind, pidfd = what
            entry = conns.get(pidfd)
            if entry is None:
                continue
            if kind == "conn":
                # the caller went away (a timeout; the client killed): kill the command, as subprocess.run does
                try:
                    data = entry["conn"].recv(1)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(entry["conn"])
                    try:
                        os.kill(entry["pid"], signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                continue
            _, status = os.waitpid(entry["pid"], 0)
            sel.unregister(pidfd)
            os.close(pidfd)
            del conns[pidfd]
            try:
                sel.unregister(entry["conn"])
            except KeyError:
                pass
            try:
                entry["conn"].sendall(b"X%d\n" % status)
            except OSError:
                pass
            entry["conn"].close()
