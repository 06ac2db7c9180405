"""Hostile HTTP servers on loopback: silent, trickling and lying stores."""

from __future__ import annotations

import functools
import gzip
import http.server
import io
import os
import random
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .common import REPO, Row, SG, cli, statuses
from .exact import _tree_entries


class HostileHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a real store's files (with directory indexes, which an HTTP store lists through),
    except the one object under attack (``server.target``: marker, record, bundle or listing),
    which gets ``server.attack``."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):  # noqa: D401 - quiet
        pass

    def _targeted(self) -> bool:
        path, target = self.path.split("?")[0], self.server.target  # type: ignore[attr-defined]
        return (target == "all" or (target == "marker" and path.endswith("/fi-autotune-store.json"))
                or (target == "record" and path.startswith("/index/") and path.endswith(f"{self.server.key}.json"))
                or (target == "bundle" and path.startswith("/bundles/") and f"/{self.server.key}/" in path
                    and path.endswith(".tar.gz"))
                or (target == "listing" and path.endswith("/")))

    def do_HEAD(self):
        self.do_GET(head=True)

    def do_GET(self, head: bool = False):
        if not self._targeted():
            return super().do_HEAD() if head else super().do_GET()
        attack, stop = self.server.attack, self.server.stop  # type: ignore[attr-defined]
        self.server.hits += 1  # type: ignore[attr-defined]
        w = self.wfile
        try:
            if attack == "silent":
                stop.wait(120)
            elif attack == "trickle":
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\nContent-Type: application/json\r\n\r\n{")
                w.flush()
                while not head and not stop.wait(0.5):  # one byte every 0.5 s: inside every read timeout
                    w.write(b" ")
                    w.flush()
            elif attack == "trickle-slow":
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n{")
                w.flush()
                while not head and not stop.wait(3):  # a byte every 3 s: past the 1 s timeout
                    w.write(b" ")
                    w.flush()
            elif attack == "garbage":
                body = self.server.rng.randbytes(self.server.rng.randrange(1, 5000))  # type: ignore[attr-defined]
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + (b"" if head else body))
            elif attack == "garbage-status":
                w.write(b"HTTP/1.1 999 \xff\xfe\r\nX: \x00\r\n\r\n")
            elif attack == "not-http":
                w.write(self.server.rng.randbytes(3000))  # type: ignore[attr-defined]
            elif attack == "endless":
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
                chunk = b"[" * 65536
                t0 = time.monotonic()
                while not head and not stop.is_set() and time.monotonic() - t0 < 60:
                    w.write(chunk)
            elif attack == "huge-length":
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000000\r\n\r\n")
                t0 = time.monotonic()
                while not head and not stop.is_set() and time.monotonic() - t0 < 60:
                    w.write(b"{" * 65536)
            elif attack == "gzip-bomb":
                body = self.server.bomb  # type: ignore[attr-defined]
                w.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body)
                        + (b"" if head else body))
            elif attack == "redirect-file":
                w.write(b"HTTP/1.1 302 Found\r\nLocation: file://%s%s\r\nContent-Length: 0\r\n\r\n"
                        % (str(self.server.victim).encode(), self.path.encode()))  # type: ignore[attr-defined]
            elif attack == "redirect-loop":
                w.write(b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % self.path.encode())
            elif attack == "redirect-other":  # the attacked object is sent from another entry's place
                other = self.path.replace(self.server.key, self.server.other_key)  # type: ignore[attr-defined]
                if other.endswith(".tar.gz"):
                    d = Path(self.directory) / other.lstrip("/").rsplit("/", 1)[0]
                    other = "/" + str(next(d.iterdir()).relative_to(self.directory))
                w.write(b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % other.encode())
            elif attack == "missing":
                w.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            w.flush()
        except OSError:
            pass
        self.close_connection = True

class HostileServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

HTTP_ATTACKS = [("silent", "all"), ("trickle", "marker"), ("trickle", "record"), ("trickle", "bundle"),
                ("trickle", "listing"), ("trickle-slow", "marker"), ("trickle-slow", "bundle"),
                ("garbage", "marker"), ("garbage", "record"), ("garbage", "bundle"), ("garbage", "listing"),
                ("garbage-status", "marker"), ("not-http", "all"), ("endless", "marker"), ("endless", "record"),
                ("endless", "bundle"), ("endless", "listing"), ("huge-length", "marker"), ("huge-length", "record"),
                ("huge-length", "bundle"), ("gzip-bomb", "marker"), ("gzip-bomb", "record"), ("gzip-bomb", "bundle"),
                ("redirect-file", "marker"), ("redirect-file", "record"), ("redirect-file", "bundle"),
                ("redirect-loop", "marker"), ("redirect-loop", "bundle"), ("redirect-other", "record"),
                ("redirect-other", "bundle"), ("missing", "bundle")]

HTTP_HANG = 30  # seconds a command against a hostile server may take (its --timeout is 1 s)

RSS_LIMIT = 1 << 30  # bytes of memory a command may hold before it is killed and counted as a hang

def watched(argv: list, env: dict, timeout: float, rss_limit: int) -> tuple[subprocess.CompletedProcess | None, str]:
    """``argv`` run to its end, or killed past ``timeout`` s or ``rss_limit`` bytes resident (then
    None and why)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=err)
        t0, peak = time.monotonic(), 0
        while p.poll() is None:
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    rss = next((int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS")), 0)
            except (OSError, StopIteration):
                rss = 0
            peak = max(peak, rss)
            why = (f"still running after {timeout:g} s" if time.monotonic() - t0 > timeout else
                   f"{rss >> 20} MB resident after {time.monotonic() - t0:.1f} s (killed)" if rss > rss_limit else "")
            if why:
                p.kill()
                p.wait()
                return None, why
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, p.returncode, out.read(), err.read()), ""

def _rank_bytes(root: Path) -> dict[str, dict[str, bytes]]:
    """entry id -> {rank file name: bytes} for every entry dir in a tree."""
    out: dict[str, dict[str, bytes]] = {}
    base = SG.base(root)
    if not base.exists():
        return out
    for p in base.glob("[!.]*/[!.]*/[!.]*/rank_*.json"):
        out.setdefault(str(p.parent.relative_to(base)), {})[p.name] = p.read_bytes()
    return out

def hostile_http(tmp: Path, rng: random.Random, attacks=HTTP_ATTACKS) -> Row:
    """Each attack x (``ls URL``, a full ``pull``, ``pull ID`` of the attacked entry), ``--timeout 1``.
    Checks: no traceback; done within HTTP_HANG s (hangs); a pull that fails installs nothing
    (half); whatever is installed is byte-for-byte the honest store's entry (wrong installs: the
    victim store a file:// redirect points at holds other entries); nothing changes outside the
    destination (escapes)."""
    row = Row()
    work = tmp / "http"
    src, victim_src = work / "src", work / "victim-src"
    ids = _tree_entries("http", src, 3)
    honest = _rank_bytes(src)
    store, victim = work / "store", work / "victim"
    env = {"XDG_CACHE_HOME": str(work / "xdg")}
    assert cli("push", f"file://{store}", "--cache-dir", src, env=env).returncode == 0
    _tree_entries("victim", victim_src, 2, seed0=40)
    assert cli("push", f"file://{victim}", "--cache-dir", victim_src, env=env).returncode == 0
    victim_before = _snapshot(victim)
    bomb = io.BytesIO()
    with gzip.GzipFile(fileobj=bomb, mode="wb", compresslevel=9) as gz:
        for _ in range(1024):  # 1 GiB of "[" in about 1 MB
            gz.write(b"[" * (1 << 20))
    server = HostileServer(("127.0.0.1", 0), functools.partial(HostileHandler, directory=str(store)))
    server.stop, server.rng, server.bomb, server.victim, server.hits = threading.Event(), rng, bomb.getvalue(), victim, 0
    server.key, server.other_key = ids[0].split("/")[-1], ids[1].split("/")[-1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for attack, target in attacks:
            server.attack, server.target = attack, target
            for cmd in (["ls", url], ["pull", url, "--any-env"], ["pull", url, ids[0], "--any-env"]):
                dest = work / "dest"
                shutil.rmtree(dest, ignore_errors=True)
                what = f"{attack} {target}: {' '.join(cmd[:1] + cmd[2:3])}"
                row["attempts"] += 1
                t0 = time.monotonic()
                args = [*cmd, "--timeout", "1"] + (["--cache-dir", dest] if cmd[0] == "pull" else [])
                p, why = watched([sys.executable, "-m", "fi_autotune_cli", *map(str, args)], {**os.environ, **env},
                                 HTTP_HANG, RSS_LIMIT)
                if why:
                    row.fail("hangs", f"{what}: {why}")
                took = time.monotonic() - t0
                if p is not None:
                    row.proc(p)
                    err = p.stderr.decode(errors="replace").strip()
                    row.details.append(f"note: {what}: exit {p.returncode} in {took:.1f} s: {err.splitlines()[-1][:150] if err else ''}")
                    got = _rank_bytes(dest)
                    if cmd[0] == "pull" and p.returncode != 0 and got:
                        row.fail("half", f"{what}: exit {p.returncode} but {len(got)} entries installed")
                    for eid, files in got.items():
                        if honest.get(eid) != files:
                            row.fail("wrong installs", f"{what}: {eid} installed with other bytes than the store's")
                    bad = [e for e, s in statuses(dest, row).items() if s != "complete"]
                    row.fail("half", f"{what}: {bad} not complete", len(bad))
                if _snapshot(victim) != victim_before:
                    row.fail("escapes", f"{what}: the victim store changed")
                    victim_before = _snapshot(victim)
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()
    shutil.rmtree(work, ignore_errors=True)
    return row

def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file() and ".fi-autotune-locks" not in p.parts}
