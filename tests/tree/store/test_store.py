"""Remote stores against a real S3 server on loopback (moto's server mode, as s3fs's own tests
run it), a file:// store and a read-only HTTP store served by ``python -m http.server``.
Nothing leaves 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools.synthetic import DEFAULT_METADATA, default_fields, write_fake_entry

from tests.standins.fault_cli import crash_at
from tests.support.servers import SECRET, free_port as _free_port, wait_for as _wait_for
from tests.conftest import REPO, run_cli
from tests.support.lazy import importorskip_lazily

importorskip_lazily("s3fs")
importorskip_lazily("moto")
boto3 = importorskip_lazily("boto3")

GLM_ID = "0.7.2.post1/sm100/d99390dfa961185d"


def cli(*args, **kw) -> subprocess.CompletedProcess:
    proc = run_cli(*args, **kw)
    assert SECRET not in proc.stdout + proc.stderr, "a credential was printed"
    return proc


def ok_json(*args, **kw):
    proc = cli(*args, "--json", **kw)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def seeded(root: Path, n: int = 2) -> list[str]:
    ids = [str(write_fake_entry(root))]
    for i in range(1, n):
        ids.append(str(write_fake_entry(root, fields=default_fields(f"org/m{i}", tp=2, dp=1), arch="sm90", seed=i)))
    return sorted(ids)


def test_push_ls_pull_roundtrip_on_s3(s3, tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    ids = seeded(src, 3)
    pushed = ok_json("push", s3["url"], "--cache-dir", str(src))
    assert sorted(pushed["pushed"]) == ids and pushed["uploaded_bytes"] > 0
    listed = ok_json("ls", s3["url"])
    assert sorted(e["id"] for e in listed["entries"]) == ids
    assert cli("ls", "-q", s3["url"], "--arch", "sm90").stdout.split() == [i for i in ids if "/sm90/" in i]
    again = ok_json("push", s3["url"], "--cache-dir", str(src))
    assert again["pushed"] == [] and sorted(again["unchanged"]) == ids and again["uploaded_bytes"] == 0
    pulled = ok_json("pull", s3["url"], "--cache-dir", str(dest), "--any-env")
    assert sorted(pulled["imported"]) == ids
    for i in ids:
        rel = Path("flashinfer/autotune") / i
        for p in (src / rel).glob("rank_*.json"):
            assert (dest / rel / p.name).read_bytes() == p.read_bytes()
    one = ok_json("pull", s3["url"], ids[0], "--cache-dir", str(tmp_path / "one"), "--any-env")
    assert one["imported"] == [ids[0]]


def test_layout_in_the_bucket_is_content_addressed(s3, tmp_path):
    seeded(tmp_path / "src", 1)
    assert cli("push", s3["url"], "--cache-dir", str(tmp_path / "src")).returncode == 0
    keys = sorted(o["Key"] for o in s3["client"].list_objects_v2(Bucket=s3["bucket"])["Contents"])
    bundle = next(k for k in keys if k.startswith("caches/bundles/"))
    assert bundle.startswith(f"caches/bundles/sglang/{GLM_ID}/") and bundle.endswith(".tar.gz")
    sha = Path(bundle).name.removesuffix(".tar.gz")
    body = s3["client"].get_object(Bucket=s3["bucket"], Key=bundle)["Body"].read()
    import hashlib

    assert hashlib.sha256(body).hexdigest() == sha
    record = json.loads(s3["client"].get_object(Bucket=s3["bucket"], Key=f"caches/index/sglang/{GLM_ID}.json")["Body"].read())
    assert record["sha256"] == sha and record["metadata"]["gpu"] == "NVIDIA H200" and record["key_fields"]["tp"] == 8


def _push_proc(url: str, root: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fi_autotune_cli", "push", url, "--cache-dir", str(root), "--json"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_concurrent_pushes_of_the_same_and_of_different_entries(s3, tmp_path):
    same = tmp_path / "same"
    seeded(same, 1)
    different = []
    for i in range(3):
        root = tmp_path / f"diff{i}"
        write_fake_entry(root, fields=default_fields(f"org/c{i}", tp=2, dp=1), arch="sm90", seed=i)
        different.append(root)
    procs = [_push_proc(s3["url"], same) for _ in range(3)] + [_push_proc(s3["url"], r) for r in different]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert SECRET not in out + err
    keys = [o["Key"] for o in s3["client"].list_objects_v2(Bucket=s3["bucket"])["Contents"]]
    glm_bundles = [k for k in keys if k.startswith(f"caches/bundles/sglang/{GLM_ID}/")]
    assert len(glm_bundles) == 1  # three pushers of one entry: one bundle (same bytes, same name)
    listed = ok_json("ls", s3["url"])
    assert len(listed["entries"]) == 4
    pulled = ok_json("pull", s3["url"], "--cache-dir", str(tmp_path / "dest"), "--any-env")
    assert len(pulled["imported"]) == 4


def test_a_push_killed_mid_upload_shows_nothing_and_a_retry_completes(s3, tmp_path):
    src = tmp_path / "src"
    seeded(src, 1)
    killed = cli("push", s3["url"], "--cache-dir", str(src), launcher=crash_at("store.bundle_uploaded"))
    assert killed.returncode == -signal.SIGKILL
    listed = ok_json("ls", s3["url"])
    assert listed["entries"] == []  # the bundle is there, unreferenced: invisible
    assert listed["remains"] == {"orphan_bundles": 1, "orphan_bytes": listed["remains"]["orphan_bytes"],
                                 "sweepable": 0, "interrupted_deletes": 0}  # younger than the grace period
    assert cli("pull", s3["url"], GLM_ID, "--cache-dir", str(tmp_path / "d")).returncode == 1
    retry = ok_json("push", s3["url"], "--cache-dir", str(src))
    # uploaded again: an unreferenced bundle may be going (a sweep); a fresh upload is a new object
    assert retry["pushed"] == [GLM_ID] and retry["uploaded_bytes"] == listed["remains"]["orphan_bytes"] > 0
    assert [e["id"] for e in ok_json("ls", s3["url"])["entries"]] == [GLM_ID]


def test_a_push_interrupted_by_ctrl_c_says_what_it_pushed(s3, tmp_path):
    """After a Ctrl-C the user cannot tell whether anything reached the store: the one line says
    how many entries were pushed whole (the store lists exactly those) and that a rerun pushes the
    rest. Exit 130."""
    src = tmp_path / "src"
    seeded(src, 3)
    stopped = cli("push", s3["url"], "--cache-dir", str(src), launcher=crash_at("store.bundle_uploaded:2", signal_name="INT"))
    lines = stopped.stderr.strip().splitlines()
    assert stopped.returncode == 130 and len(lines) == 1, stopped.stderr
    assert "interrupted: 1 entry pushed to" in lines[0] and "a rerun pushes the rest" in lines[0], lines[0]
    assert len(ok_json("ls", s3["url"])["entries"]) == 1
    rerun = ok_json("push", s3["url"], "--cache-dir", str(src))
    assert len(rerun["pushed"]) == 2 and len(rerun["unchanged"]) == 1


def test_a_corrupted_bundle_is_refused(s3, tmp_path):
    seeded(tmp_path / "src", 1)
    assert cli("push", s3["url"], "--cache-dir", str(tmp_path / "src")).returncode == 0
    bundle = next(o["Key"] for o in s3["client"].list_objects_v2(Bucket=s3["bucket"])["Contents"]
                  if o["Key"].startswith("caches/bundles/"))
    body = bytearray(s3["client"].get_object(Bucket=s3["bucket"], Key=bundle)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3["client"].put_object(Bucket=s3["bucket"], Key=bundle, Body=bytes(body))
    dest = tmp_path / "dest"
    proc = cli("pull", s3["url"], GLM_ID, "--cache-dir", str(dest), "--any-env")
    assert proc.returncode == 1 and "corrupted or tampered with" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not dest.exists() or not any(dest.rglob("rank_*"))


def test_an_unreachable_endpoint_is_one_line(s3, tmp_path):
    seeded(tmp_path / "src", 1)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{_free_port()}", "AWS_MAX_ATTEMPTS": "2"}
    t0 = time.time()
    for args in (["ls", s3["url"]], ["pull", s3["url"], "--cache-dir", str(tmp_path / "d")],
                 ["push", s3["url"], "--cache-dir", str(tmp_path / "src")]):
        proc = cli(*args, env=env, timeout=180)
        assert proc.returncode == 1, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "s3://" in proc.stderr
    assert time.time() - t0 < 150


def test_a_sealed_store_refuses_pushes(s3, tmp_path):
    src = tmp_path / "src"
    seeded(src, 2)
    first = ok_json("push", s3["url"], GLM_ID, "--read-only", "--cache-dir", str(src))
    assert first["sealed"] and first["pushed"] == [GLM_ID]
    proc = cli("push", s3["url"], "--cache-dir", str(src))
    assert proc.returncode == 1 and "marked read-only" in proc.stderr
    assert [e["id"] for e in ok_json("ls", s3["url"])["entries"]] == [GLM_ID]


def marker_requests(s3, during) -> list[str]:
    """The requests for the store's marker the S3 server answered while ``during()`` ran
    (method and path of each, from the server's own log)."""
    log, path = Path(s3["log"]), f"/{s3['bucket']}/caches/fi-autotune-store.json"
    start = log.stat().st_size
    during()
    with open(log, "rb") as f:
        f.seek(start)
        lines = f.read().decode(errors="replace").splitlines()
    found = (re.search(r"(?<![A-Z])(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP", line) for line in lines)
    return [m[1] for m in found if m and m[2].split("?")[0] == path]


def test_a_push_reads_the_marker_before_each_write_not_once_per_entry(s3, tmp_path):
    """On a remote store each marker read is a request or two: a push reads it where the seal
    must be fresh (the command's check and the write's), not again per entry or per sweep. A
    push of 3 entries read it 9 times before: 6, and once more for each entry's record."""
    src = tmp_path / "src"
    seeded(src, 3)

    def push():
        assert cli("push", s3["url"], "--cache-dir", str(src)).returncode == 0

    made = marker_requests(s3, push)  # a new store: two reads find none, one PUT makes it
    assert sorted(made) == ["HEAD", "HEAD", "PUT"], made
    again = marker_requests(s3, push)  # 3 entries unchanged: two reads (HEAD for the size, then GET)
    assert sorted(again) == ["GET", "GET", "HEAD", "HEAD"], again


def test_pull_refuses_another_gpu_unless_asked_and_checks_the_store(s3, tmp_path):
    seeded(tmp_path / "src", 1)  # tuned on an H200
    assert cli("push", s3["url"], "--cache-dir", str(tmp_path / "src")).returncode == 0
    h100 = tmp_path / "h100.json"
    h100.write_text(json.dumps({"fingerprint": {**DEFAULT_METADATA, "gpu": "NVIDIA H100 80GB HBM3"}, "arch": "sm100"}))
    dest = tmp_path / "dest"
    proc = cli("pull", s3["url"], "--env-from", str(h100), "--cache-dir", str(dest))
    assert proc.returncode == 1 and "another GPU or environment" in proc.stderr and "H100" in proc.stderr
    assert not dest.exists() or not any(dest.rglob("rank_*"))
    h200 = tmp_path / "h200.json"
    h200.write_text(json.dumps({"fingerprint": DEFAULT_METADATA, "arch": "sm100"}))
    # by the serving flags: the entry they map to
    pulled = ok_json("pull", s3["url"], "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--dp", "8",
                     "--env-from", str(h200), "--cache-dir", str(dest))
    assert pulled["imported"] == [GLM_ID]
    checked = ok_json("check", "--store", s3["url"], "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--dp", "8",
                      "--env-from", str(h200))
    assert [w["found"] for w in checked["workers"]] == [True]


def test_a_file_store_and_a_read_only_http_store(tmp_path):
    src = tmp_path / "src"
    ids = seeded(src, 2)
    store = tmp_path / "store"
    assert cli("push", f"file://{store}", "--cache-dir", str(src)).returncode == 0
    assert not list(store.rglob(".tmp-*"))
    port = _free_port()
    log = tmp_path / "http.log"  # a file, not an unread pipe: the server logs every request
    with open(log, "w") as err:
        http = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                                 str(store)], stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        _wait_for(port, http, log=log)
        url = f"http://user:{SECRET}@127.0.0.1:{port}"
        listed = ok_json("ls", url)
        assert sorted(e["id"] for e in listed["entries"]) == ids
        pulled = ok_json("pull", url, ids[0], "--cache-dir", str(tmp_path / "dest"), "--any-env")
        assert pulled["imported"] == [ids[0]]
        proc = cli("push", url, "--cache-dir", str(src))
        assert proc.returncode == 2 and "read-only" in proc.stderr
    finally:
        http.terminate()
        http.wait(timeout=10)


def test_a_missing_backend_names_the_extra(tmp_path):
    code = "import sys; sys.modules['s3fs'] = None\nfrom fi_autotune_cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    proc = subprocess.run([sys.executable, "-c", code, "ls", "s3://bucket/x"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and 'pip install "fi-autotune[s3]"' in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_no_store_at_a_url_is_an_error_not_an_empty_list(tmp_path):
    for url in (f"file://{tmp_path / 'typo'}", f"http://127.0.0.1:{_free_port()}/x"):
        proc = cli("ls", url)
        assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "no fi-autotune store" in proc.stderr or "cannot reach" in proc.stderr
