"""``pull`` judges what a bundle holds, not what the store's editable index record says: each
attack below edits a record (or republishes a bundle under it) in a real file:// store and on a
real S3 server on loopback (moto), and the pull must refuse with one line and install nothing."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from devtools.synthetic import DEFAULT_METADATA, default_fields, write_fake_entry

from tests.support.servers import SECRET
from tests.conftest import run_cli

H100 = "NVIDIA H100 80GB HBM3"


class StoreFiles:
    """Raw objects of a store, by key relative to its root: a directory or an S3 prefix."""

    def __init__(self, url: str, path: Path | None = None, s3: dict | None = None):
        self.url, self.path, self.s3 = url, path, s3

    def get(self, key: str) -> bytes:
        if self.path is not None:
            return (self.path / key).read_bytes()
        return self.s3["client"].get_object(Bucket=self.s3["bucket"], Key=f"caches/{key}")["Body"].read()

    def put(self, key: str, data: bytes) -> None:
        if self.path is not None:
            (self.path / key).parent.mkdir(parents=True, exist_ok=True)
            (self.path / key).write_bytes(data)
        else:
            self.s3["client"].put_object(Bucket=self.s3["bucket"], Key=f"caches/{key}", Body=data)

    def record(self, eid: str) -> dict:
        return json.loads(self.get(f"index/sglang/{eid}.json"))

    def put_record(self, eid: str, rec: dict) -> None:
        self.put(f"index/sglang/{eid}.json", json.dumps(rec).encode())

    def republish(self, eid: str, data: bytes) -> None:
        """Upload ``data`` as a bundle of ``eid`` under its sha256, and point eid's record at it
        (what an attacker with write access to the store can do; the sha check then passes)."""
        sha = hashlib.sha256(data).hexdigest()
        rel = f"bundles/sglang/{eid}/{sha}.tar.gz"
        self.put(rel, data)
        rec = self.record(eid)
        rec.update(sha256=sha, size=len(data), bundle=rel)
        self.put_record(eid, rec)


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path) -> StoreFiles:
    if request.param == "file":
        return StoreFiles(f"file://{tmp_path / 'store'}", path=tmp_path / "store")
    pytest.importorskip("s3fs")
    s3 = request.getfixturevalue("s3")
    return StoreFiles(s3["url"], s3=s3)


def cli(*args):
    proc = run_cli(*args)
    assert SECRET not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def fingerprint(tmp_path: Path, gpu: str | None = None) -> str:
    p = tmp_path / f"env-{gpu or 'h200'}.json".replace(" ", "_")
    p.write_text(json.dumps({"fingerprint": {**DEFAULT_METADATA, **({"gpu": gpu} if gpu else {})}, "arch": "sm100"}))
    return str(p)


def pushed(store: StoreFiles, root: Path, **kw) -> str:
    eid = str(write_fake_entry(root, **kw))
    proc = cli("push", store.url, "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    return eid


def refused(proc, dest: Path, *words: str) -> None:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert "pulled" not in proc.stdout
    assert not dest.exists() or not any(dest.rglob("rank_*"))


def bundle_members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}


def tgz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("edit", ["other-gpu", "empty"])
def test_a_record_edited_to_another_environment_does_not_install(store, tmp_path, edit):
    """An H100 bundle whose record says H200 (or has no metadata) is not installed under an
    H200 fingerprint, nor with --any-env: the record disagrees with the bundle it names."""
    eid = pushed(store, tmp_path / "src", metadata={"gpu": H100})
    rec = store.record(eid)
    rec["metadata"] = {**rec["metadata"], "gpu": "NVIDIA H200"} if edit == "other-gpu" else {}
    store.put_record(eid, rec)
    dest = tmp_path / "dest"
    for extra in (["--env-from", fingerprint(tmp_path)], ["--any-env"]):
        refused(cli("pull", store.url, eid, "--cache-dir", str(dest), *extra), dest, eid, "metadata disagrees")
        refused(cli("pull", store.url, "--cache-dir", str(dest), *extra), dest, eid, "metadata disagrees")
    # the same bundle with its true record: judged by its rank files (H100), and pulled on an H100
    rec["metadata"] = {**DEFAULT_METADATA, "gpu": H100}
    store.put_record(eid, rec)
    proc = cli("pull", store.url, eid, "--cache-dir", str(dest), "--env-from", fingerprint(tmp_path))
    assert proc.returncode == 1 and H100 in proc.stderr and "another GPU or environment" in proc.stderr, proc.stderr
    assert not dest.exists() or not any(dest.rglob("rank_*"))
    proc = cli("pull", store.url, eid, "--cache-dir", str(dest), "--env-from", fingerprint(tmp_path, H100))
    assert proc.returncode == 0 and f"pulled     {eid}" in proc.stdout, proc.stderr


def test_a_record_for_one_entry_naming_another_entrys_bundle_is_refused(store, tmp_path):
    src = tmp_path / "src"
    a = pushed(store, src)
    b = pushed(store, src, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1)
    rec_a, rec_b = store.record(a), store.record(b)
    rec_a.update(sha256=rec_b["sha256"], size=rec_b["size"], bundle=rec_b["bundle"])
    store.put_record(a, rec_a)
    dest = tmp_path / "dest"
    refused(cli("pull", store.url, a, "--cache-dir", str(dest), "--any-env"), dest, a, "not its own")


def test_a_record_copied_to_another_entrys_place_is_refused(store, tmp_path):
    """index/A.json holding B's record: ``pull A`` must not print (and install) B."""
    src = tmp_path / "src"
    a = pushed(store, src)
    b = pushed(store, src, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1)
    store.put_record(a, store.record(b))
    dest = tmp_path / "dest"
    refused(cli("pull", store.url, a, "--cache-dir", str(dest), "--any-env"), dest, f"names {b}, not {a}")
    listed = cli("ls", "-q", store.url)  # listed once, at its own place; the copy is named
    assert listed.returncode == 0 and listed.stdout.split() == sorted([b]) and f"{a}.json" in listed.stderr, listed.stderr


def test_a_bundle_carrying_a_second_entry_installs_neither(store, tmp_path):
    src = tmp_path / "src"
    a = pushed(store, src)
    b = pushed(store, src, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1)
    both = {**bundle_members(store.get(store.record(a)["bundle"])), **bundle_members(store.get(store.record(b)["bundle"]))}
    store.republish(a, tgz(both))
    dest = tmp_path / "dest"
    refused(cli("pull", store.url, a, "--cache-dir", str(dest), "--any-env"), dest, "holds", a, b)


def test_a_bundle_whose_rank_files_disagree_is_refused(store, tmp_path):
    """One rank file re-tagged H100 in an H200 bundle: the entry was not tuned in one place."""
    eid = pushed(store, tmp_path / "src")
    members = bundle_members(store.get(store.record(eid)["bundle"]))
    name = sorted(n for n in members if "rank_tp1_" in n)[0]
    obj = json.loads(members[name])
    obj["_metadata"] = {**obj["_metadata"], "gpu": H100}
    members[name] = json.dumps(obj).encode()
    store.republish(eid, tgz(members))
    dest = tmp_path / "dest"
    refused(cli("pull", store.url, eid, "--cache-dir", str(dest), "--any-env"), dest, eid, "different environments")


def test_a_record_counting_other_rank_files_than_its_bundle_is_refused(store, tmp_path):
    eid = pushed(store, tmp_path / "src")
    rec = store.record(eid)
    rec["rank_files"] = rec["rank_files"] + 1
    store.put_record(eid, rec)
    dest = tmp_path / "dest"
    refused(cli("pull", store.url, eid, "--cache-dir", str(dest), "--any-env"), dest, eid, "rank files")
