"""The process that stands for a command the zygote runs (tests/support/zygote.py), where a process
must: a ``Popen`` whose signals reach the command (``zygotes.popen``), a shell's ``fi-autotune``
(``zygotes.cli_on_path``). ``run_cli`` needs none: the test process sends the same request itself
(tests/support/zygote_call.py). Run as ``python -I -S zygote_client.py SOCKET MARKER_FD [SCRIPT] -- ARGS...``:
stdlib only, no site (~0.02 CPU-s). With SCRIPT the command is ``python SCRIPT ARGS...`` instead
(tests/standins/fault_cli.py: the CLI killed at an exact step).

It sends the zygote its argv, its environment, its working directory and umask, and its own file
descriptors 0, 1 and 2 (SCM_RIGHTS), so the command reads and writes exactly what this process
was given (pipes, files, /dev/null). Once the zygote has forked the command it writes ``S`` to
MARKER_FD (so its caller knows the command started: before that, any failure here is a
zygote that is gone, and the caller runs the command fresh instead). SIGINT, SIGTERM, SIGHUP and
SIGQUIT sent to this process go on to the command. Its end: the command's exit status, or the
command's death by a signal re-raised here (``returncode == -n``, as ``subprocess`` reports it).
Killed itself (``subprocess.run``'s timeout), the zygote sees the connection close and kills the
command, as ``subprocess.run`` kills the process it started.
"""

import os
import sys

import _signal  # the C modules: ``signal``, ``socket`` and ``json`` would double this process's start
import _socket

NOT_STARTED = 197  # never an exit status of fi-autotune's (0, 1, 2, 130); run_cli checks the marker too
FORWARDED = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT)


def request_bytes(args: list[str], script: str, cwd: str, umask: int, env) -> bytes:
    """cwd, umask, script ("": ``-m fi_autotune_cli``), argv, environment as NUL-separated fields
    (tests/support/zygote.py ``parse_request``); tests/support/zygote_call.py sends the same."""
    pairs = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]
    fields = [os.fsencode(cwd), b"%d" % umask, os.fsencode(script), b"%d" % len(args), *map(os.fsencode, args), *pairs]
    return b"\0".join(fields)


def main() -> None:
    path, marker_fd = sys.argv[1], int(sys.argv[2])
    script = "" if sys.argv[3] == "--" else sys.argv[3]
    args = sys.argv[5:] if script else sys.argv[4:]
    pending: list[int] = []
    child = [0]

    def forward(signum, frame):  # noqa: ARG001
        if child[0]:
            try:
                os.kill(child[0], signum)
            except ProcessLookupError:
                pass
        else:
            pending.append(signum)

    for s in FORWARDED:
        _signal.signal(s, forward)
    buf = b""

    def readline() -> bytes:
        nonlocal buf
        while b"\n" not in buf:
            chunk = conn.recv(4096)
            if not chunk:
                return b""
            buf += chunk
        line, _, buf = buf.partition(b"\n")
        return line

    try:
        umask = os.umask(0)
        os.umask(umask)
        request = request_bytes(args, script, os.getcwd(), umask, os.environ)
        conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        conn.connect(path)
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
        conn.sendmsg([len(request).to_bytes(4, "big")], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        conn.sendall(request)
        line = readline()
        if not line.startswith(b"P"):
            os._exit(NOT_STARTED)
        child[0] = int(line[1:])
    except Exception:  # noqa: BLE001 - the zygote is gone: run_cli runs the command fresh
        os._exit(NOT_STARTED)
    os.write(marker_fd, b"S")
    os.close(marker_fd)
    for s in pending:
        forward(s, None)
    try:
        line = readline()
    except Exception:  # noqa: BLE001
        line = b""
    if not line.startswith(b"X"):
        # the zygote died while the command ran: its status is lost (never seen in a test run)
        os.write(2, b"zygote_client: the zygote went away while the command ran; its exit status is lost\n")
        os._exit(NOT_STARTED)
    status = int(line[1:])
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (_signal.SIGKILL, _signal.SIGSTOP):  # those two have no handler to reset
            _signal.signal(sig, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # only where the signal does not kill (never for the ones that ended the command)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
