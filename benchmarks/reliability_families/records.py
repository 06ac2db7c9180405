"""Swapped and edited index records, on file:// and on a real S3 server (moto)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from .common import Row, cli
from .exact import _tree_entries
from .http import _rank_bytes


class FileBackend:
    def __init__(self, store: Path):
        self.store, self.url = store, f"file://{store}"

    def keys(self) -> list[str]:
        return sorted(str(p.relative_to(self.store)) for p in self.store.rglob("*")
                      if p.is_file() and ".fi-autotune-locks" not in p.parts)

    def get(self, key: str) -> bytes:
        return (self.store / key).read_bytes()

    def put(self, key: str, data: bytes) -> None:
        (self.store / key).parent.mkdir(parents=True, exist_ok=True)
        (self.store / key).write_bytes(data)

    def env(self) -> dict:
        return {}

class S3Backend:
    def __init__(self, endpoint: str, bucket: str):
        import boto3
        self.endpoint, self.bucket, self.url = endpoint, bucket, f"s3://{bucket}/caches"
        self.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing")
        self.client.create_bucket(Bucket=bucket)

    def keys(self) -> list[str]:
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix="caches/"):
            out += [o["Key"][len("caches/"):] for o in page.get("Contents", [])
                    if ".fi-autotune-locks" not in o["Key"]]
        return sorted(out)

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=f"caches/{key}")["Body"].read()

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=f"caches/{key}", Body=data)

    def env(self) -> dict:
        return s3_env(self.endpoint)

def s3_env(endpoint: str) -> dict:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}

class MotoServer:
    """A real S3 server on loopback (moto's server mode), as the tests start it."""

    def __init__(self, tmp: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = open(tmp / "moto.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.1)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.log.close()

def _record_edits(a: dict, b: dict) -> list[tuple[str, object]]:
    """(what, new record for A's place or a function of the store) for each edit of A's record."""
    def edit(**kw):
        return {**a, **kw}
    return [
        ("B's record at A's place", dict(b)),
        ("A's record names B's bundle and sha", edit(bundle=b["bundle"], sha256=b["sha256"], size=b["size"])),
        ("A's record names B's bundle", edit(bundle=b["bundle"])),
        ("sha256 edited", edit(sha256="0" * 64)),
        ("metadata gpu edited", edit(metadata={**a["metadata"], "gpu": "NVIDIA B200"})),
        ("metadata emptied", edit(metadata={})),
        ("rank_files edited", edit(rank_files=a["rank_files"] + 6)),
        ("id edited to B", edit(id=b["id"], parts=b["parts"])),
        ("bundle path escapes the store", edit(bundle="../victim/keep.json")),
        ("bundle path absolute", edit(bundle="/etc/hostname")),
        ("bundle path into index", edit(bundle=a["bundle"].replace("bundles/", "index/", 1))),
        ("size huge", edit(size=10 ** 15)),
        ("format 99", edit(format=99)),
        ("layout edited", edit(layout="vllm")),
        ("truncated", None),
    ]

S3_EDITS = ("B's record at A's place", "A's record names B's bundle and sha", "bundle path escapes the store",
            "sha256 edited")

def edited_records(tmp: Path, moto: "MotoServer | None") -> Row:
    """A store of A, B and C; A's index record replaced by each edit (B's record at A's place, A's
    record naming B's bundle, edited sha256/metadata/rank count/id/layout/format, a bundle path
    out of the store or absolute, truncated); then ``ls URL``, ``pull URL``, ``pull URL A``,
    ``rm URL A -y`` and ``prune URL --model m -y``; over file:// and over a real S3 server.
    Checks: whatever a pull installs is byte-for-byte the honest entry of that id (wrong
    installs); a delete removes nothing but A's own record and bundle - B, C and a victim file
    next to the store stay (wrong deletes, escapes)."""
    row = Row()
    src = tmp / "rec-src"
    ids = _tree_entries("rec", src, 3)
    honest = _rank_bytes(src)
    backends = ["file"] + (["s3"] if moto else [])
    for kind in backends:
        for n, (what, _) in enumerate(_record_edits(*[{"metadata": {}, "rank_files": 0, "bundle": "", "sha256": "", "size": 0, "id": "", "parts": []}] * 2)):
            if kind == "s3" and what not in S3_EDITS:
                continue  # S3 requests are slow here: the edits that reach for another entry's objects
            work = tmp / f"rec-{kind}-{n}"
            victim = work / "victim"
            victim.mkdir(parents=True)
            (victim / "keep.json").write_text("{}")
            be = FileBackend(work / "store") if kind == "file" else S3Backend(moto.endpoint, f"rec{n}")
            env = {"XDG_CACHE_HOME": str(work / "xdg"), **be.env()}
            p = cli("push", be.url, "--cache-dir", src, env=env)
            assert p.returncode == 0, p.stderr
            recs = {json.loads(be.get(k))["id"]: k for k in be.keys() if k.startswith("index/")}
            a, b = json.loads(be.get(recs[ids[0]])), json.loads(be.get(recs[ids[1]]))
            new = dict(_record_edits(a, b))[what]
            be.put(recs[ids[0]], be.get(recs[ids[0]])[:40] if new is None else json.dumps(new).encode())
            before = {k: be.get(k) for k in be.keys()}
            for cmd in (["ls", be.url], ["pull", be.url, "--any-env", "--cache-dir", work / "dest"],
                        ["pull", be.url, ids[0], "--any-env", "--cache-dir", work / "dest"],
                        ["rm", be.url, ids[0], "-y"], ["prune", be.url, "--model", "org/rec0", "-y"]):
                where = f"{kind} {what}: {cmd[0]}{' A' if ids[0] in cmd else ''}"
                row["attempts"] += 1
                p = row.proc(cli(*cmd, env=env))
                got = _rank_bytes(work / "dest")
                for eid, files in got.items():
                    if honest.get(eid) != files:
                        row.fail("wrong installs", f"{where}: {eid} installed with other bytes than its own")
                if p is not None and cmd[0] == "pull" and p.returncode != 0 and got:
                    row.fail("half", f"{where}: exit {p.returncode} but {len(got)} entries installed")
                shutil.rmtree(work / "dest", ignore_errors=True)
                now = set(be.keys())
                a_own = {recs[ids[0]], a["bundle"]}
                wrong = [k for k in before if k not in now and k not in a_own]
                row.fail("wrong deletes", f"{where}: {wrong} deleted", len(wrong))
                if not (victim / "keep.json").exists() or len(list(victim.iterdir())) != 1:
                    row.fail("escapes", f"{where}: the file next to the store was touched")
                for k in wrong:  # put back what was wrongly deleted, to go on
                    be.put(k, before[k])
            shutil.rmtree(work, ignore_errors=True)
    return row
