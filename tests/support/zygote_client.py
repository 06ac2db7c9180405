"""The process a test sees in place of ``python -m fi_autotune_cli`` when the zygote runs the command
(tests/support/zygote.py). Run as ``python -I -S zygote_client.py SOCKET MARKER_FD -- ARGS...``:
stdlib only, no site (~0.02 CPU-s).

It sends the zygote its argv, its environment, its working directory and umask, and its own file
descriptors 0, 1 and 2 (SCM_RIGHTS), so the command reads and writes exactly what this process
was given (pipes, files, /dev/null). Once the zygote has forked the command it writes ``S`` to
MARKER_FD (so ``run_cli`` knows the command started: before that, any failure here is a
zygote that is gone, and ``run_cli`` runs the command fresh instead). SIGINT, SIGTERM, SIGHUP and
SIGQUIT sent to this process go on to the command. Its end: the command's exit status, or the
command's death by a signal re-raised here (``returncode == -n``, as ``subprocess`` reports it).
Killed itself (``subprocess.run``'s timeout), the zygote sees the connection close and kills the
command, as ``subprocess.run`` kills the process it started.
"""

import json
import os
import signal
import socket
import struct
import sys

NOT_STARTED = 197  # never an exit status of fi-autotune's (0, 1, 2, 130); run_cli checks the marker too
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def main() -> None:
    path, marker_fd = sys.argv[1], int(sys.argv[2])
    args = sys.argv[4:]
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
        signal.signal(s, forward)
    try:
        umask = os.umask(0)
        os.umask(umask)
        request = json.dumps({"argv": args, "env": dict(os.environ), "cwd": os.getcwd(), "umask": umask}).encode()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        socket.send_fds(conn, [struct.pack("!I", len(request))], [0, 1, 2])
        conn.sendall(request)
        f = conn.makefile("rb")
        line = f.readline()
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
        line = f.readline()
    except Exception:  # noqa: BLE001
        line = b""
    if not line.startswith(b"X"):
        # the zygote died while the command ran: its status is lost (never seen in a test run)
        os.write(2, b"zygote_client: the zygote went away while the command ran; its exit status is lost\n")
        os._exit(NOT_STARTED)
    status = int(line[1:])
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # only where the signal does not kill (never for the ones that ended the command)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
