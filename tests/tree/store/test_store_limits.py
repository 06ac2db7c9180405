"""A store is someone else's server: a silent or trickling one, a malformed record, a huge
marker or a FIFO must each cost one line (or one warning), never minutes, memory or the store."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from autotune_cache.registry import default_layout
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.tree.store.store import Store, bundle_of
from devtools.synthetic import default_fields, write_fake_entry

from tests.conftest import REPO, run_cli
from tests.support.servers import LoopbackServer
from tests.tree.store.test_pull_verify import pushed, store  # noqa: F401 - the store fixture (file:// and S3)


def HangingServer(trickle: bool = False, gap: float = 3.0) -> LoopbackServer:  # noqa: N802 - a server's name
    """A real TCP server on loopback that accepts and then says nothing, or (``trickle``) sends the
    headers of a large body and then one byte every ``gap`` seconds."""

    def drip(server: LoopbackServer, conn: socket.socket, request: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\nContent-Type: application/json\r\n\r\n{")
        while not server.stop.wait(gap):
            conn.sendall(b" ")

    return LoopbackServer(drip if trickle else None)


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


def test_a_server_trickling_faster_than_the_timeout_fails_at_its_deadline(tmp_path):
    """One byte every 0.3 s keeps every read inside a 1 s timeout: before, ``pull`` waited for the
    whole 1,000,000-byte body (about 3.5 days). Now each request has a deadline for the whole of
    it (twice the timeout plus its byte cap at 256 KiB/s: 2.25 s for the marker), named in the error."""
    server = HangingServer(trickle=True, gap=0.3)
    url = f"http://127.0.0.1:{server.port}/caches"
    try:
        for args in (["ls", url], ["pull", url, "--cache-dir", str(tmp_path / "dest"), "--any-env"]):
            t0 = time.monotonic()
            proc = run_cli(*args, "--timeout", "1", timeout=60)
            took = time.monotonic() - t0
            assert proc.returncode == 1, (args, proc.stderr)
            (line,) = proc.stderr.strip().splitlines()
            assert f"127.0.0.1:{server.port}" in line and "not done within 2.25 s" in line, line
            assert "twice the 1 s timeout, plus 65537 bytes at 256 KiB/s" in line, line
            assert took < 20, took
    finally:
        server.close()


def test_every_request_to_a_remote_store_has_a_deadline():
    """The deadline is fsspec's own for an asynchronous backend (the request is cancelled): the
    exact call our code makes, checked on a stand-in of fsspec's sync wrapper."""
    from autotune_cache.tree.store.storeio import DeadlinePassed, bounded
    from fsspec.exceptions import FSTimeoutError

    calls = []

    class AsyncFs:
        async_impl = True

        def cat_file(self, path, timeout=None, **kw):
            calls.append((path, timeout, kw))
            raise FSTimeoutError

    with pytest.raises(DeadlinePassed, match="not done within 6 s"):
        bounded(AsyncFs(), AsyncFs().cat_file, "p", start=0, timeout=1.0, size=4 * (256 << 10))
    assert calls == [("p", 6.0, {"start": 0})]


def test_a_bad_timeout_setting_is_a_usage_error(tmp_path):
    proc = run_cli("ls", f"file://{tmp_path}", env={"FI_AUTOTUNE_STORE_TIMEOUT": "soon"})
    assert proc.returncode == 2 and "FI_AUTOTUNE_STORE_TIMEOUT" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name, raw, said", [
    ("FI_AUTOTUNE_STORE_TIMEOUT", "soon", "above 0"), ("FI_AUTOTUNE_STORE_TIMEOUT", "0", "above 0"),
    ("FI_AUTOTUNE_STORE_TIMEOUT", "inf", "above 0"), ("FI_AUTOTUNE_STORE_GRACE", "-1", "(0 or more)"),
    ("FI_AUTOTUNE_STORE_GRACE", "nan", "(0 or more)"), ("FI_AUTOTUNE_STORE_GRACE", "1h", "(0 or more)"),
])
def test_a_bad_seconds_setting_names_itself_in_one_line(tmp_path, name, raw, said):
    """Both settings of seconds go through one parser (``storeio.env_seconds``) and say the same:
    the variable, its value, what to give; exit 2. The grace period may be 0, a timeout not."""
    root = tmp_path / "tree"
    write_fake_entry(root)
    url = f"file://{tmp_path / 'store'}"
    assert run_cli("push", url, "--cache-dir", str(root)).returncode == 0
    proc = run_cli("ls", url, env={name: raw})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"fi-autotune: error: {name}={raw!r}: give a number of seconds {said}"], proc.stderr


def test_a_silent_s3_endpoint_fails_within_its_timeout(tmp_path):
    pytest.importorskip("s3fs")
    server = HangingServer()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.port}", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1", "FI_AUTOTUNE_STORE_TIMEOUT": "1"}
    try:
        t0 = time.monotonic()
        proc = run_cli("ls", "s3://bucket/caches", env=env, timeout=120)
        assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        # s3fs retries a read that timed out: the request's deadline (twice the timeout) ends it
        assert "not done within 2 s (twice the 1 s timeout" in proc.stderr and "s3://bucket/caches" in proc.stderr, \
            proc.stderr
        assert time.monotonic() - t0 < 15  # botocore's default read timeout is 60 s, per attempt
    finally:
        server.close()


# --- one bad record, an unreadable marker, an entry deleted under a push -------------------------

@pytest.mark.parametrize("bad", ["garbage", "format-99"])
def test_one_bad_record_is_named_and_the_others_list_and_pull(store, tmp_path, bad):
    src = tmp_path / "src"
    a = pushed(store, src)
    b = pushed(store, src, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1)
    if bad == "garbage":
        store.put(f"index/sglang/{a}.json", b'{"tool": "fi-autotune", "format": 1, "lay')
    else:
        store.put_record(a, {**store.record(a), "format": 99})
    listed = run_cli("ls", store.url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [e["id"] for e in json.loads(listed.stdout)["entries"]] == [b]
    warning = listed.stderr.strip().splitlines()
    assert len(warning) == 1 and "warning" in warning[0] and f"index/sglang/{a}.json" in warning[0], listed.stderr
    quiet = run_cli("ls", "-q", store.url)
    assert quiet.stdout.split() == [b] and f"{a}.json" in quiet.stderr
    dest = tmp_path / "dest"
    proc = run_cli("pull", store.url, "--cache-dir", str(dest), "--any-env")
    assert proc.returncode == 0 and f"pulled     {b}" in proc.stdout, proc.stderr
    assert f"{a}.json" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (dest / "flashinfer/autotune" / a).exists()
    as_json = run_cli("pull", store.url, "--cache-dir", str(tmp_path / "dj"), "--any-env", "--json")
    (unreadable,) = json.loads(as_json.stdout)["unreadable"]  # a program sees what was not pulled
    assert as_json.returncode == 0 and f"index/sglang/{a}.json" in unreadable, as_json.stdout
    named = run_cli("pull", store.url, a, "--cache-dir", str(tmp_path / "d2"), "--any-env")
    assert named.returncode == 1 and len(named.stderr.strip().splitlines()) == 1 and a in named.stderr, named.stderr


@pytest.mark.parametrize("damage", ["truncated", "not-a-marker", "huge"])
def test_a_sealed_store_with_an_unreadable_marker_is_never_written(store, tmp_path, damage):
    src = tmp_path / "src"
    a = pushed(store, src)
    write_fake_entry(src, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1)
    sealed = run_cli("push", store.url, a, "--read-only", "--cache-dir", str(src))
    assert sealed.returncode == 0, sealed.stderr
    marker = store.get("fi-autotune-store.json")
    broken = {"truncated": marker[: len(marker) // 2], "not-a-marker": b'{"format": "1"}',
              "huge": b'{"format": 1, "read_only": true, "pad": "' + b" " * (1 << 20) + b'"}'}[damage]
    store.put("fi-autotune-store.json", broken)
    proc = run_cli("push", store.url, "--cache-dir", str(src))
    assert proc.returncode == 1 and "may be sealed" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert store.get("fi-autotune-store.json") == broken  # never reset to read_only: false
    assert [e["id"] for e in json.loads(run_cli("ls", store.url, "--json").stdout)["entries"]] == [a]


def test_push_skips_an_entry_deleted_under_it(store, tmp_path):
    """What ``push`` does between listing and bundling, with a real ``rm`` in between."""
    src = tmp_path / "src"
    a = str(write_fake_entry(src))
    b = str(write_fake_entry(src, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1))
    layout = default_layout()
    entries = scan_cache(src, layout).entries
    assert run_cli("rm", "-y", a, "--cache-dir", str(src)).returncode == 0
    result = Store(store.url).push(layout, [(e, bundle_of(layout, e)) for e in entries])
    assert result.vanished == (a,) and result.pushed == (b,)
    assert [e["id"] for e in json.loads(run_cli("ls", store.url, "--json").stdout)["entries"]] == [b]


# --- size limits before reading --------------------------------------------------------------

MAXRSS = ("import resource, subprocess, sys\n"
          "p = subprocess.run([sys.executable, '-m', 'fi_autotune_cli', *sys.argv[1:]], capture_output=True, text=True)\n"
          "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n"
          "sys.stderr.write(p.stderr)\n")


def _rss_of(*args: str) -> tuple[int, int, str]:
    """(exit code, peak RSS in MB, stderr) of one fi-autotune command in a fresh process."""
    p = subprocess.run([sys.executable, "-c", MAXRSS, *args], capture_output=True, text=True, cwd=REPO, timeout=120)
    rc, mb = map(int, p.stdout.split())
    return rc, mb, p.stderr


def test_a_600_mb_record_and_marker_on_a_file_store_are_refused_unread(tmp_path):
    src, root = tmp_path / "src", tmp_path / "store"
    url = f"file://{root}"
    a = str(write_fake_entry(src))
    b = str(write_fake_entry(src, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1))
    assert run_cli("push", url, "--cache-dir", str(src)).returncode == 0
    record = root / "index/sglang" / f"{a}.json"
    with open(record, "r+b") as f:  # sparse: 600 MB that cost no disk
        f.truncate(600 << 20)
    rc, mb, err = _rss_of("ls", "-q", url)
    assert rc == 0 and f"{a}.json" in err and "larger than" in err, err
    assert mb < 150, mb  # before: 631 MB
    ls_mb = mb
    marker = root / "fi-autotune-store.json"
    with open(marker, "r+b") as f:
        f.truncate(600 << 20)
    rc, mb, err = _rss_of("push", url, "--cache-dir", str(src))
    assert rc == 1 and "may be sealed" in err and mb < 150, (rc, mb, err)  # before: 1.2 GB
    print(f"600 MB record: ls -q peak RSS {ls_mb} MB; 600 MB marker: push peak RSS {mb} MB")
    assert run_cli("ls", "-q", url).stdout.split() == [b]  # the others still list


def test_an_oversized_record_on_s3_is_refused_by_its_size(s3, tmp_path):
    src = tmp_path / "src"
    a = str(write_fake_entry(src))
    assert run_cli("push", s3["url"], "--cache-dir", str(src)).returncode == 0
    s3["client"].put_object(Bucket=s3["bucket"], Key=f"caches/index/sglang/{a}.json", Body=b" " * (4 << 20))
    proc = run_cli("ls", "-q", s3["url"])
    assert proc.returncode == 0 and proc.stdout.split() == [] and "larger than" in proc.stderr, proc.stderr
    named = run_cli("pull", s3["url"], a, "--cache-dir", str(tmp_path / "d"), "--any-env")
    assert named.returncode == 1 and "larger than" in named.stderr and len(named.stderr.strip().splitlines()) == 1


def test_a_record_naming_another_entrys_bundle_is_refused_and_deletes_nothing(store, tmp_path):
    """Issue 32 (found by the reliability benchmark): a record of A edited to name B's bundle
    (with B's sha256, so the bytes check out) would have ``rm URL A`` delete B's bundle from
    under B's record, and ``pull A`` install B. It is now an unreadable record: named in one
    warning, never pulled, never deleted through; B lists, pulls, and keeps its bundle."""
    src = tmp_path / "src"
    a = pushed(store, src)
    b = pushed(store, src, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1)
    rb = store.record(b)
    store.put_record(a, {**store.record(a), "bundle": rb["bundle"], "sha256": rb["sha256"], "size": rb["size"]})
    listed = run_cli("ls", store.url, "--json")
    assert [e["id"] for e in json.loads(listed.stdout)["entries"]] == [b]
    assert "not its own" in listed.stderr, listed.stderr
    assert run_cli("rm", "-y", store.url, a).returncode == 1
    assert run_cli("pull", store.url, a, "--cache-dir", str(tmp_path / "d1"), "--any-env").returncode == 1
    pulled = run_cli("pull", store.url, b, "--cache-dir", str(tmp_path / "d2"), "--any-env", "--json")
    assert pulled.returncode == 0 and json.loads(pulled.stdout)["imported"] == [b], pulled.stderr


def test_an_endless_bundle_body_with_no_length_is_cut_at_its_records_size(tmp_path):
    """Issue 32 (found by the reliability benchmark): an HTTP server that streams a bundle with
    no Content-Length and never ends grew ``pull`` to 1 GiB in seconds. The record says the
    bundle's size: no more than that (plus one byte) is read, then one line, exit 1."""
    import http.server
    import functools

    src, files = tmp_path / "src", tmp_path / "store"
    entry = str(write_fake_entry(src))
    assert run_cli("push", f"file://{files}", "--cache-dir", str(src)).returncode == 0

    class Endless(http.server.SimpleHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self):  # noqa: N802 - http.server's name
            if not self.path.endswith(".tar.gz"):
                return super().do_GET()
            self.send_response(200)
            self.send_header("Content-Type", "application/gzip")
            self.end_headers()
            try:
                for _ in range(3_000):  # about 200 MB, if nobody stops reading
                    self.wfile.write(b"\0" * 65536)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Endless, directory=str(files)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        t0 = time.monotonic()
        proc = run_cli("pull", url, entry, "--cache-dir", str(tmp_path / "dest"), "--any-env", "--timeout", "5")
        assert proc.returncode == 1 and "larger than" in proc.stderr and "its record says" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert time.monotonic() - t0 < 30
    finally:
        server.shutdown()
        server.server_close()
