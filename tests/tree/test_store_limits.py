"""A store is someone else's server: a silent or trickling one, a malformed record, a huge
marker or a FIFO must each cost one line (or one warning), never minutes, memory or the store."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from ..conftest import run_cli


class HangingServer:
    """A real TCP server on loopback that accepts and then says nothing (``headers=False``), or
    sends the headers of a large body and then one byte every ``gap`` seconds (a trickle)."""

    def __init__(self, trickle: bool = False, gap: float = 3.0):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.trickle, self.gap = trickle, gap
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)
            if self.trickle:
                threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\nContent-Type: application/json\r\n\r\n{")
            while not self.stop.wait(self.gap):
                conn.sendall(b" ")
        except OSError:
            pass

    def close(self) -> None:
        self.stop.set()
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.mark.parametrize("trickle", [False, True], ids=["silent", "trickling"])
def test_a_silent_or_trickling_http_store_fails_within_its_timeout(tmp_path, trickle):
    server = HangingServer(trickle=trickle)
    url = f"http://127.0.0.1:{server.port}/caches"
    try:
        for args in (["ls", url], ["pull", url, "--cache-dir", str(tmp_path / "dest"), "--any-env"]):
            t0 = time.monotonic()
            proc = run_cli(*args, env={"FI_AUTOTUNE_STORE_TIMEOUT": "1"}, timeout=60)
            took = time.monotonic() - t0
            assert proc.returncode == 1, (args, proc.stderr)
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
            assert "no answer within 1 s" in lines[0] and f"127.0.0.1:{server.port}" in lines[0], lines[0]
            assert took < 20, took  # aiohttp's default would wait 300 s
            assert not (tmp_path / "dest").exists() or not any((tmp_path / "dest").rglob("rank_*"))
    finally:
        server.close()


def test_a_bad_timeout_setting_is_a_usage_error(tmp_path):
    proc = run_cli("ls", f"file://{tmp_path}", env={"FI_AUTOTUNE_STORE_TIMEOUT": "soon"})
    assert proc.returncode == 2 and "FI_AUTOTUNE_STORE_TIMEOUT" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_silent_s3_endpoint_fails_within_its_timeout(tmp_path):
    pytest.importorskip("s3fs")
    server = HangingServer()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.port}", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1", "FI_AUTOTUNE_STORE_TIMEOUT": "1"}
    try:
        t0 = time.monotonic()
        proc = run_cli("ls", "s3://bucket/caches", env=env, timeout=120)
        assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "no answer within 1 s" in proc.stderr and "s3://bucket/caches" in proc.stderr, proc.stderr
        assert time.monotonic() - t0 < 30  # botocore's default read timeout is 60 s, per attempt
    finally:
        server.close()
