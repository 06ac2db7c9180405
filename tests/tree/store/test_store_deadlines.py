"""An HTTP store's deadline runs from the first byte (issue 44): a server that trickles its status
line and headers (one byte every 0.5 s keeps each read alive) fails within the documented time,
one line naming the URL; an HTTP answer that is not a store (random bytes, an HTML page) is "not a
store" (exit 1), never an empty one. Real servers on loopback, the real command in a process."""

from __future__ import annotations

import json
import os
import time

import pytest

from autotune_cache.tree.store.storeio import MIN_RATE, deadline

from tests.conftest import run_cli
from tests.support.servers import LoopbackServer

TIMEOUT = 2.0  # issue 44 timed `ls http://... --timeout 2` against 0.5 s gaps: each read is alive
#: The marker's cap (store.py's MAX_MARKER_BYTES) is what ``ls`` reads first: its deadline.
MARKER_DEADLINE = deadline(TIMEOUT, 64 << 10)
#: A fresh CLI process, its imports and its exit, on a busy 2-core machine.
PROCESS_SLACK_S = 12


def trickle_headers(server: LoopbackServer, conn, request: bytes = b"") -> None:
    """The status line and headers, one byte every 0.5 s: they never end within any deadline."""
    head = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 10_000 + b"\r\n\r\n"
    for b in head:
        if server.stop.wait(0.5):
            return
        conn.sendall(bytes([b]))


def _body(status: bytes, ctype: bytes, body: bytes):
    def answer(server, conn, request=b""):
        conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        conn.close()
    return answer


@pytest.fixture
def serve():
    servers = []

    def start(answer) -> str:
        servers.append(LoopbackServer(answer))
        return f"http://127.0.0.1:{servers[-1].port}/caches"
    yield start
    for s in servers:
        s.close()


@pytest.mark.parametrize("command", ["ls", "pull"])
def test_a_server_that_trickles_its_headers_fails_within_the_deadline(serve, tmp_path, command):
    url = serve(trickle_headers)
    args = ["ls", url] if command == "ls" else ["pull", url, "--cache-dir", str(tmp_path / "dest"), "--any-env"]
    t0 = time.monotonic()
    proc = run_cli(*args, "--timeout", f"{TIMEOUT:g}", timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert url.split("/caches")[0] in lines[0] and "not done within" in lines[0], lines[0]
    assert took < MARKER_DEADLINE + PROCESS_SLACK_S, f"{command} took {took:.1f} s against a deadline of {MARKER_DEADLINE:.2f} s"


@pytest.mark.parametrize("body,ctype", [
    (os.urandom(4096), b"application/octet-stream"),
    (b"<!doctype html><html><body><h1>Welcome</h1><a href='index/'>index</a></body></html>", b"text/html"),
    (b'{"format": "x"}', b"application/json"),
], ids=["random bytes", "an HTML page", "JSON that is no marker"])
def test_an_http_answer_that_is_no_store_is_not_a_store_not_an_empty_one(serve, body, ctype):
    url = serve(_body(b"200 OK", ctype, body))
    proc = run_cli("ls", url, "--timeout", f"{TIMEOUT:g}", timeout=120)
    assert proc.returncode == 1 and "not a fi-autotune store" in proc.stderr, (proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and url in proc.stderr
    assert "0 entries" not in proc.stdout


def test_the_deadline_is_the_documented_one():
    assert deadline(TIMEOUT, 64 << 10) == 2 * TIMEOUT + (64 << 10) / MIN_RATE


def _marker_then_trickle(server, conn, request: bytes) -> None:
    """A store's marker, answered at once; any other request (the listing) trickles its headers."""
    from autotune_cache.tree.store.store import MARKER, STORE_FORMAT

    if MARKER.encode() in request:
        _body(b"200 OK", b"application/json", json.dumps({"format": STORE_FORMAT, "read_only": False}).encode())(server, conn)
    else:
        trickle_headers(server, conn)


@pytest.mark.slow  # a listing's deadline is 2 x the timeout + 8 s (LISTING_BYTES, 2 MiB, at MIN_RATE): about 9 s here
def test_a_listing_that_trickles_fails_within_the_listings_deadline(serve):
    """``ls`` lists the index after the marker: that request is bounded too (storeio.LISTING_BYTES)."""
    from autotune_cache.tree.store.storeio import LISTING_BYTES

    url = serve(_marker_then_trickle)
    t0 = time.monotonic()
    proc = run_cli("ls", url, "--timeout", f"{TIMEOUT:g}", timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert took < deadline(TIMEOUT, LISTING_BYTES) + MARKER_DEADLINE + PROCESS_SLACK_S, took
