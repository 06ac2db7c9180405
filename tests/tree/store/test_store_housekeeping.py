"""Stores that can shrink, be unsealed, and be talked to as the tree is: ``rm URL``, ``prune
URL``, ``push --unseal``, URL-first transfers, ``--dry-run``, ``--timeout`` and ``ls URL``'s
status - over a file:// store and a real S3 server on loopback (moto), with real processes."""

from __future__ import annotations

import inspect
import json
import os
import signal
import time
from pathlib import Path

import fsspec
import pytest

from autotune_cache.errors import FiAutotuneError
from autotune_cache.registry import get_layout
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.tree.store.store import Store
from autotune_cache.tree.store.storehouse import plan_store_delete, unseal
from devtools.synthetic import default_fields, write_fake_entry

from tests.standins.fault_cli import crash_at
from tests.conftest import run_cli
from tests.tree.store.test_pull_verify import StoreFiles, cli, store  # noqa: F401 - the store fixture (file:// and S3)
from tests.tree.store.test_store_limits import HangingServer


def keys(store: StoreFiles) -> list[str]:
    """Every object of the store, relative to its root (our lock files left out)."""
    if store.path is not None:
        return sorted(str(p.relative_to(store.path)) for p in store.path.rglob("*")
                      if p.is_file() and ".fi-autotune-locks" not in p.parts)
    got = store.s3["client"].list_objects_v2(Bucket=store.s3["bucket"], Prefix="caches/").get("Contents", [])
    return sorted(o["Key"].removeprefix("caches/") for o in got)


def ok(*args) -> dict:
    proc = cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def published(store: StoreFiles, root: Path) -> list[str]:
    ids = [str(write_fake_entry(root)),
           str(write_fake_entry(root, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1)),
           str(write_fake_entry(root, fields=default_fields("org/m2", tp=2, dp=1), arch="sm90", seed=2))]
    ok("push", store.url, "--cache-dir", str(root))
    return sorted(ids)


def listed(store: StoreFiles) -> list[str]:
    return sorted(e["id"] for e in ok("ls", store.url)["entries"])


def test_rm_and_prune_a_store_plan_then_delete(store, tmp_path):
    ids = published(store, tmp_path / "tree")
    sm100 = [i for i in ids if "/sm100/" in i]
    before = keys(store)
    dry = ok("rm", store.url, sm100[0], "--dry-run")
    assert [e["id"] for e in dry["plan"]["entries"]] == sm100 and dry["result"] is None
    assert keys(store) == before
    refused = cli("rm", store.url, sm100[0])  # no -y on a non-interactive input
    assert refused.returncode == 2 and keys(store) == before
    done = ok("rm", "-y", store.url, sm100[0])
    assert done["result"]["deleted"] == sm100
    assert listed(store) == [i for i in ids if i not in sm100]
    assert not any(sm100[0] in k for k in keys(store))  # record and bundle both gone

    assert cli("rm", "-y", sm100[0], store.url).returncode == 2  # the URL goes first
    unknown = cli("rm", "-y", store.url, "0.7.2.post1/sm90/ffffffffffffffff")
    assert unknown.returncode == 1 and len(unknown.stderr.strip().splitlines()) <= 2
    assert listed(store) == [i for i in ids if i not in sm100]

    nothing = cli("prune", store.url, "-y")
    assert nothing.returncode == 2 and "nothing selected" in nothing.stderr
    assert cli("prune", store.url, "--unused-for", "1d", "-y").returncode == 2  # a store keeps no access time
    plan = ok("prune", store.url, "--arch", "sm90", "--dry-run")
    assert sorted(e["id"] for e in plan["plan"]["entries"]) == [i for i in ids if "/sm90/" in i]
    young = ok("prune", store.url, "--older-than", "1h", "-y")
    assert young["plan"]["entries"] == [] and len(listed(store)) == 2
    pruned = ok("prune", store.url, "--arch", "sm90", "-y")
    assert sorted(pruned["result"]["deleted"]) == [i for i in ids if "/sm90/" in i]
    assert listed(store) == []
    assert [k for k in keys(store) if k.startswith(("index/", "bundles/"))] == []


def unique_prefix(eid: str, others: list[str]) -> str:
    """The shortest prefix (at least 4 digits) of ``eid``'s key that no other key starts with."""
    key, rest = eid.rsplit("/", 1)[1], [o.rsplit("/", 1)[1] for o in others if o != eid]
    return key[:next(n for n in range(4, len(key) + 1) if not any(o.startswith(key[:n]) for o in rest))]


def test_a_unique_key_prefix_names_one_store_entry_for_rm_and_pull(store, tmp_path):
    """``rm URL``/``pull URL`` take a key prefix, alone or at the end of an id, as the tree does."""
    ids = published(store, tmp_path / "tree")
    a = ids[1]
    short = unique_prefix(a, ids)
    in_id = f"{a.rsplit('/', 1)[0]}/{short}"
    pulled = ok("pull", store.url, short, "--cache-dir", str(tmp_path / "dest"), "--any-env")
    assert pulled["imported"] == [a]
    pulled = ok("pull", store.url, in_id, "--cache-dir", str(tmp_path / "dest2"), "--any-env")
    assert pulled["imported"] == [a]
    before = keys(store)
    dry = ok("rm", store.url, short, "--dry-run")
    assert [e["id"] for e in dry["plan"]["entries"]] == [a] and keys(store) == before
    assert ok("rm", "-y", store.url, in_id)["result"]["deleted"] == [a]
    assert listed(store) == [i for i in ids if i != a]


def test_an_ambiguous_or_short_prefix_names_no_store_entry(tmp_path):
    """A key or prefix two entries of a store share is refused naming both (exit 1, as in the
    tree), by rm before anything is deleted and by pull; under 4 digits it is no prefix."""
    root, path = tmp_path / "tree", tmp_path / "store"
    files = StoreFiles(f"file://{path}", path=path)
    a, c = str(write_fake_entry(root)), str(write_fake_entry(root, flashinfer_version="0.7.1"))  # one key, two versions
    ok("push", files.url, "--cache-dir", str(root))
    key, before = a.rsplit("/", 1)[1], keys(files)
    for ref in (key[:6], key):
        for args in (("rm", "-y", files.url, ref), ("rm", files.url, ref, "--dry-run"),
                     ("pull", files.url, ref, "--cache-dir", str(tmp_path / "dest"), "--any-env")):
            proc = cli(*args)
            assert proc.returncode == 1, (args, proc.stderr)
            assert f"{ref!r} names 2 entries in {files.url}; give one id: {c}, {a}" in proc.stderr, proc.stderr
    assert keys(files) == before and not (tmp_path / "dest").exists()  # nothing deleted, nothing pulled
    for args in (("rm", "-y", files.url, key[:3]), ("pull", files.url, key[:3], "--cache-dir", str(tmp_path / "dest"))):
        proc = cli(*args)
        assert proc.returncode == 1 and f"no entry {key[:3]!r} in {files.url}" in proc.stderr, proc.stderr
    local = cli("rm", "-y", key[:3], "--cache-dir", str(root))  # the same minimum in the tree
    assert local.returncode == 1 and "no cache entry" in local.stderr
    assert keys(files) == before
    assert ok("rm", "-y", files.url, f"{a.rsplit('/', 1)[0]}/{key[:6]}")["result"]["deleted"] == [a]


def test_a_sealed_store_refuses_rm_and_prune_until_unsealed(store, tmp_path):
    root = tmp_path / "tree"
    ids = published(store, root)
    ok("push", store.url, "--cache-dir", str(root), "--read-only")
    for args in (("rm", "-y", store.url, ids[0]), ("prune", store.url, "--arch", "sm90", "-y"),
                 ("rm", "--dry-run", store.url, ids[0]), ("prune", "--dry-run", store.url, "--arch", "sm90")):
        proc = cli(*args)  # a dry run refuses as the run does (it said "Would free" and the run refused)
        assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
        assert "read-only" in proc.stderr and "--unseal" in proc.stderr and proc.stdout == "", (args, proc.stdout)
    assert listed(store) == ids
    assert cli("push", store.url, "--unseal", ids[0]).returncode == 2  # unsealing pushes nothing
    assert ok("push", "--unseal", store.url)["unsealed"] is True
    assert ok("push", "--unseal", store.url)["unsealed"] is False
    assert ok("rm", "-y", store.url, ids[0])["result"]["deleted"] == [ids[0]]


def test_an_unreadable_marker_is_neither_deleted_from_nor_unsealed(tmp_path):
    root, path = tmp_path / "tree", tmp_path / "store"
    files = StoreFiles(f"file://{path}", path=path)
    ids = published(files, root)
    (path / "fi-autotune-store.json").write_text('{"format": 1, "read_o')
    assert cli("rm", "-y", files.url, ids[0]).returncode == 1
    proc = cli("push", "--unseal", files.url)
    assert proc.returncode == 1 and "cannot be read" in proc.stderr
    assert (path / "fi-autotune-store.json").read_text() == '{"format": 1, "read_o'


def test_a_killed_store_rm_never_leaves_a_record_without_its_bundle(store, tmp_path):
    """Killed between its two deletes, ``rm`` has removed the record, not yet the bundle: no
    reader meets a dangling record; a pull of the rest works, the bundle is just unreferenced."""
    root = tmp_path / "tree"
    ids = published(store, root)
    killed = run_cli("rm", "-y", store.url, ids[0], launcher=crash_at("store.record_removed"))
    assert killed.returncode == -signal.SIGKILL
    assert listed(store) == ids[1:]
    assert any(k.startswith("bundles/") and ids[0] in k for k in keys(store))  # the bundle, unreferenced
    pulled = ok("pull", store.url, "--cache-dir", str(tmp_path / "dest"), "--any-env")
    assert sorted(pulled["imported"]) == ids[1:]


def test_rm_skips_an_entry_pushed_again_since_the_plan(tmp_path):
    root, path = tmp_path / "tree", tmp_path / "store"
    files = StoreFiles(f"file://{path}", path=path)
    ids = published(files, root)
    rec = files.record(ids[0])
    rec["sha256"] = "0" * 64  # as if pushed again with other bytes between plan and delete
    plan = plan_store_delete(Store(files.url), refs=(ids[0],))
    files.put_record(ids[0], {**rec, "bundle": rec["bundle"].rsplit("/", 1)[0] + "/" + "0" * 64 + ".tar.gz"})
    result = plan.execute()
    assert result.deleted == () and result.skipped == ((ids[0], "pushed again since the plan was made"),)
    assert (path / f"index/sglang/{ids[0]}.json").exists()


def test_a_store_sealed_after_a_command_looked_refuses_its_later_writes(tmp_path):
    """A command reads the marker once for what cannot change under it (a store is there, its
    format), but whether it is sealed afresh before each write: a warm --push checks the store
    at its start and pushes minutes later, and a delete is planned before it runs. A store
    another writer sealed meanwhile takes neither write."""
    root, path = tmp_path / "tree", tmp_path / "store"
    files = StoreFiles(f"file://{path}", path=path)
    ids = published(files, root)
    layout = get_layout("sglang")
    entry = next(e for e in scan_cache(root, layout).entries if str(e.id) == ids[0])
    pusher, looker = Store(files.url), Store(files.url)
    pusher.check_writable()
    looker.require()
    plan = plan_store_delete(Store(files.url), refs=(ids[0],))
    Store(files.url).put_marker(read_only=True)  # another writer seals it
    before = keys(files)
    with pytest.raises(FiAutotuneError, match="read-only"):
        pusher.push(layout, [(entry, b"other bytes: a push that would write")])
    with pytest.raises(FiAutotuneError, match="read-only"):
        plan.execute()
    assert keys(files) == before and listed(files) == ids
    assert unseal(looker) is True  # it saw the store unsealed once: whether it is sealed is asked again
    assert json.loads((path / "fi-autotune-store.json").read_bytes())["read_only"] is False


# --- the transfer surface --------------------------------------------------------------------------

def test_push_takes_the_url_first_or_last_and_suggests_file_urls(tmp_path):
    root, path = tmp_path / "tree", tmp_path / "store"
    ids = [str(write_fake_entry(root)),
           str(write_fake_entry(root, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1))]
    url = f"file://{path}"
    assert ok("push", url, ids[0], "--cache-dir", str(root))["pushed"] == [ids[0]]
    assert ok("push", ids[1], url, "--cache-dir", str(root))["pushed"] == [ids[1]]  # the old order still works
    proc = cli("push", str(tmp_path / "store2"), "--cache-dir", str(root))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert f"file://{tmp_path / 'store2'}" in proc.stderr
    assert "URL [ID]..." in cli("push", "--help").stdout


def test_dry_run_transfers_change_nothing(tmp_path):
    root, path, dest = tmp_path / "tree", tmp_path / "store", tmp_path / "dest"
    ids = sorted([str(write_fake_entry(root)),
                  str(write_fake_entry(root, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1))])
    url = f"file://{path}"
    would = ok("push", url, "--cache-dir", str(root), "--dry-run")
    assert would["dry_run"] is True and sorted(e["id"] for e in would["entries"]) == ids and not path.exists()
    said = cli("push", url, "--cache-dir", str(root), "--dry-run").stdout.splitlines()[-1]
    pushed = ok("push", url, "--cache-dir", str(root))
    # the human dry run says the bytes the push then uploads (compressed bundles), not only the size on disk
    assert pushed["uploaded_bytes"] == would["uploaded_bytes"] > 0
    assert f"{pushed['uploaded_bytes']} bytes to upload" in said, said
    would = ok("pull", url, "--cache-dir", str(dest), "--dry-run", "--any-env")
    assert would["dry_run"] and sorted(would["imported"]) == ids and not dest.exists()
    archive = tmp_path / "a.tgz"
    would = ok("export", "-o", str(archive), "--cache-dir", str(root), "--dry-run")
    assert sorted(would["entries"]) == ids and not archive.exists()
    assert cli("export", "-o", str(archive), "--cache-dir", str(root)).returncode == 0
    would = ok("import", str(archive), "--cache-dir", str(dest), "--dry-run")
    assert sorted(e["id"] for e in would["entries"]) == ids and all(e["size"] > 0 for e in would["entries"])
    assert not dest.exists()
    human = cli("pull", url, "--cache-dir", str(dest), "--dry-run", "--any-env")
    assert human.returncode == 0 and "would pull" in human.stdout and "nothing was changed" in human.stdout


def test_ls_url_shows_each_entrys_status(tmp_path):
    root, path = tmp_path / "tree", tmp_path / "store"
    done = str(write_fake_entry(root))
    bare = str(write_fake_entry(root, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1,
                                with_manifest=False))
    url = f"file://{path}"
    ok("push", url, "--cache-dir", str(root), "--include-incomplete")
    got = {e["id"]: e["status"] for e in ok("ls", url)["entries"]}
    assert got == {done: "complete", bare: "unverified"}
    assert cli("ls", "-q", url, "--status", "unverified").stdout.split() == [bare]
    table = cli("ls", url).stdout
    assert "STATUS" in table.splitlines()[0] and "1 unverified, 1 complete)" in table
    rec = json.loads((path / f"index/sglang/{done}.json").read_text())
    del rec["status"]  # a record of an older push: complete only because a manifest counted its files
    (path / f"index/sglang/{done}.json").write_text(json.dumps(rec))
    assert {e["id"]: e["status"] for e in ok("ls", url)["entries"]}[done] == "complete"


# --- timeouts ----------------------------------------------------------------------------------------

def test_the_timeout_option_bounds_every_store_command(tmp_path):
    server = HangingServer()
    url = f"http://127.0.0.1:{server.port}/caches"
    try:
        for args in (["ls", url], ["pull", url, "--cache-dir", str(tmp_path / "d"), "--any-env"],
                     ["check", "--store", url, "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--arch", "sm90",
                      "--moe-runner-backend", "flashinfer_cutlass"]):
            t0 = time.monotonic()
            proc = run_cli(*args, "--timeout", "1", env={"FI_AUTOTUNE_STORE_TIMEOUT": "600"}, timeout=90)
            assert proc.returncode == 1 and "no answer within 1 s" in proc.stderr, (args, proc.stderr)
            assert "Traceback" not in proc.stderr and time.monotonic() - t0 < 30
    finally:
        server.close()
    for bad in ("0", "-1", "soon", "inf"):
        proc = run_cli("ls", f"file://{tmp_path}", "--timeout", bad)
        assert proc.returncode == 2 and "--timeout" in proc.stderr, (bad, proc.stderr)
    for cmd in (["push"], ["pull"], ["ls"], ["rm"], ["prune"], ["check"], ["warm"], ["diff"]):
        assert "--timeout" in run_cli(*cmd, "--help").stdout, cmd


def test_gcs_gets_its_timeouts_through_the_keyword_gcsfs_takes(monkeypatch):
    """No GCS server can run here: a recorder stands in for gcsfs's filesystem class and keeps the
    keyword arguments our store passes; the real class is checked to take that keyword."""
    gcsfs = pytest.importorskip("gcsfs")
    # gcsfs.GCSFileSystem (fsspec's gs://) hands its keywords on to gcsfs.core's, which names it
    assert "requests_timeout" in inspect.signature(gcsfs.core.GCSFileSystem.__init__).parameters
    seen = {}

    class Recorder(gcsfs.GCSFileSystem):
        cachable = False

        def __init__(self, *args, **kwargs):  # records, connects nowhere
            seen.update(kwargs)

    real = fsspec.get_filesystem_class("gs")
    fsspec.register_implementation("gs", Recorder, clobber=True)
    try:
        monkeypatch.setenv("FI_AUTOTUNE_STORE_TIMEOUT", "600")
        Store("gs://bucket/caches", timeout=7)
        limits = seen["requests_timeout"]
        assert (limits.sock_read, limits.sock_connect, limits.total) == (7, 7, None)
        Store("gs://bucket/caches")
        assert seen["requests_timeout"].sock_read == 600 and seen["requests_timeout"].sock_connect == 10
    finally:
        fsspec.register_implementation("gs", real, clobber=True)


# --- issue 32: a killed delete finishes, and what it left is swept ----------------------------------

def remains(store: StoreFiles) -> dict:
    return ok("ls", store.url)["remains"]


def test_a_rerun_of_a_store_rm_killed_after_a_record_went_finishes_it(store, tmp_path):
    """``rm URL A B C`` killed after A's record is gone, its bundle still there: the re-run
    reports A already deleted, deletes B and C, exit 0, and leaves no bundle and no tombstone
    (file://: no writer alive; S3: the grace period set to 0, as a maintenance window would)."""
    root = tmp_path / "tree"
    ids = published(store, root)
    killed = run_cli("rm", "-y", store.url, *ids, launcher=crash_at("store.record_removed"))
    assert killed.returncode == -signal.SIGKILL
    assert listed(store) == ids[1:]
    assert any(k.startswith(f"deleting/sglang/{ids[0]}") for k in keys(store))  # the proof of the delete
    assert remains(store)["interrupted_deletes"] == 1 and remains(store)["orphan_bundles"] == 1
    typo = cli("rm", "-y", store.url, *ids, "0.7.2.post1/sm90/ffffffffffffffff")
    assert typo.returncode == 1 and "no entry" in typo.stderr and listed(store) == ids[1:]  # nothing deleted
    again = run_cli("rm", "-y", store.url, *ids, "--json", env={"FI_AUTOTUNE_STORE_GRACE": "0"})
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert out["plan"]["already_deleted"] == [ids[0]] and sorted(out["result"]["deleted"]) == ids[1:]
    assert listed(store) == []
    assert [k for k in keys(store) if k.startswith(("bundles/", "deleting/", "index/"))] == []
    gone = cli("rm", "-y", store.url, ids[0])  # the job is done: an unknown id again
    assert gone.returncode == 1 and "no entry" in gone.stderr


def test_a_bundle_nobody_was_deleting_is_no_already_deleted_entry(store, tmp_path):
    """A push killed between its bundle and its record leaves an orphan without a tombstone:
    ``rm`` of that id is still an unknown id (exit 1)."""
    root = tmp_path / "tree"
    entry = str(write_fake_entry(root))
    killed = run_cli("push", store.url, "--cache-dir", str(root), launcher=crash_at("store.bundle_uploaded"))
    assert killed.returncode == -signal.SIGKILL
    assert remains(store)["orphan_bundles"] == 1 and remains(store)["interrupted_deletes"] == 0
    proc = cli("rm", "-y", store.url, entry)
    assert proc.returncode == 1 and "no entry" in proc.stderr


def test_orphans_go_with_the_next_writer_once_no_push_can_be_publishing_them(tmp_path):
    """file://: while another writer holds its owner lock, a young orphan stays (it may be that
    push's bundle, its record seconds away) and ``ls`` says so; once no writer is alive, the next
    push sweeps it at once. An orphan older than the grace period goes even beside a live writer."""
    import filelock
    import os

    root, path = tmp_path / "tree", tmp_path / "store"
    files = StoreFiles(f"file://{path}", path=path)
    entry = str(write_fake_entry(root))
    killed = run_cli("push", files.url, "--cache-dir", str(root), launcher=crash_at("store.bundle_uploaded"))
    assert killed.returncode == -signal.SIGKILL
    (orphan,) = [p for p in (path / "bundles").rglob("*.tar.gz")]
    other = str(write_fake_entry(root, fields=default_fields("org/m1", tp=2, dp=1), arch="sm90", seed=1))
    token = "9a" * 6
    lock = filelock.FileLock(str(path / ".fi-autotune-locks" / "owners" / f"{token}.lock"), timeout=0)
    lock.acquire()
    try:
        assert remains(files)["sweepable"] == 0
        pushed = cli("push", files.url, other, "--cache-dir", str(root))
        assert pushed.returncode == 0 and "a push may still be publishing" in pushed.stderr
        assert orphan.exists()
        os.utime(orphan, (time.time() - 7200, time.time() - 7200))
        assert remains(files)["sweepable"] == 1
        assert cli("push", files.url, other, "--cache-dir", str(root)).returncode == 0
        assert not orphan.exists()
    finally:
        lock.release()
    killed = run_cli("push", files.url, entry, "--cache-dir", str(root), launcher=crash_at("store.bundle_uploaded"))
    assert killed.returncode == -signal.SIGKILL and orphan.exists()
    assert cli("rm", "-y", files.url, other).returncode == 0  # a writer, nobody else alive: swept at once
    assert not orphan.exists() and listed(files) == []


def test_a_sweep_never_takes_a_bundle_an_unreadable_record_or_an_edited_tombstone_may_name(tmp_path):
    """An index record that cannot be read as its entry's keeps that entry's bundles (it may name them); a
    tombstone edited to name another entry's bundle removes nothing of that entry."""
    root, path = tmp_path / "tree", tmp_path / "store"
    files = StoreFiles(f"file://{path}", path=path)
    ids = published(files, root)
    rec0, rec1 = files.record(ids[0]), files.record(ids[1])
    # a record in another entry's place: unreadable as ids[0]'s, and it names another bundle
    (path / f"index/sglang/{ids[0]}.json").write_text(json.dumps(rec1))
    stone = path / f"deleting/sglang/{ids[2]}.json"
    stone.parent.mkdir(parents=True, exist_ok=True)
    stone.write_text(json.dumps({"format": 1, "bundle": rec1["bundle"], "sha256": rec1["sha256"]}))
    (path / f"index/sglang/{ids[2]}.json").unlink()  # as if its delete was killed: no record, a tombstone
    proc = run_cli("push", files.url, ids[1], "--cache-dir", str(root), env={"FI_AUTOTUNE_STORE_GRACE": "0"})
    assert proc.returncode == 0, proc.stderr
    assert (path / rec0["bundle"]).exists() and (path / rec1["bundle"]).exists()
    assert listed(files) == [ids[1]]


def test_an_orphan_published_or_uploaded_again_since_the_survey_stays(tmp_path):
    """The check just before a sweep removes an orphan: a record naming it since the listing,
    or a fresh upload of the same name (a push of that entry), keeps it."""
    from autotune_cache.tree.store.storesweep import _still_orphan, survey

    root, path = tmp_path / "tree", tmp_path / "store"
    files = StoreFiles(f"file://{path}", path=path)
    entry = str(write_fake_entry(root))
    killed = run_cli("push", files.url, "--cache-dir", str(root), launcher=crash_at("store.bundle_uploaded"))
    assert killed.returncode == -signal.SIGKILL
    (orphan,) = survey(Store(files.url)).orphans
    assert _still_orphan(Store(files.url), orphan)
    assert cli("push", files.url, entry, "--cache-dir", str(root)).returncode == 0  # published since
    os.utime(path / orphan.rel, (orphan.mtime, orphan.mtime))  # same name, size and time: only the record tells
    assert not _still_orphan(Store(files.url), orphan)
    (path / f"index/sglang/{entry}.json").unlink()
    (again,) = survey(Store(files.url)).orphans
    bundle = path / again.rel
    os.utime(bundle, (time.time() + 5, time.time() + 5))  # written again after the listing
    assert not _still_orphan(Store(files.url), again)


@pytest.mark.parametrize("step", ["store.summary_written", "store.swept"])
def test_a_store_rm_killed_while_its_tombstones_go_is_still_finished(tmp_path, step):
    """Killed once its plan has run - with every tombstone there and the summary written, or
    with the tombstones swept and only the summary left - the re-run reports every id already
    deleted, exit 0, and leaves nothing under deleting/."""
    root, path = tmp_path / "tree", tmp_path / "store"
    files = StoreFiles(f"file://{path}", path=path)
    ids = published(files, root)
    killed = run_cli("rm", "-y", files.url, *ids, launcher=crash_at(step))
    assert killed.returncode == -signal.SIGKILL
    left = sorted(str(p.relative_to(path)) for p in (path / "deleting").rglob("*.json"))
    assert len(left) == (4 if step == "store.summary_written" else 1), left
    again = run_cli("rm", "-y", files.url, *ids, "--json")
    assert again.returncode == 0, again.stderr
    assert sorted(json.loads(again.stdout)["plan"]["already_deleted"]) == ids
    assert not list((path / "deleting").rglob("*.json")) and listed(files) == []


# --- a dry run is a reader: it leaves a store exactly as it found it -------------------------------

def store_state(store: StoreFiles) -> dict:
    """Every file of the store with its size and mtime, our lock files included (file://), or
    every object with its size, ETag and time (S3): what a reader must leave as it found it."""
    if store.path is not None:
        return {str(p.relative_to(store.path)): (p.lstat().st_size, p.lstat().st_mtime_ns)
                for p in sorted(store.path.rglob("*"))}
    got = store.s3["client"].list_objects_v2(Bucket=store.s3["bucket"], Prefix="caches/").get("Contents", [])
    return {o["Key"].removeprefix("caches/"): (o["Size"], o["ETag"], o["LastModified"]) for o in got}


@pytest.mark.parametrize("writer", ["prune", "rm"])
def test_a_dry_run_leaves_what_killed_store_writers_left_as_it_is(store, tmp_path, writer):
    """A push killed with its temp file written (file://), one killed between its bundle and its
    record, and an ``rm`` killed after its record went leave temp files, an orphan, a tombstone
    and - in a file:// store - the dead writers' owner-lock files. ``ls URL``, ``prune URL
    --dry-run`` and ``rm URL --dry-run`` change nothing of it, lock files included (a reader's
    liveness check never creates or removes one); the real run then sweeps what is dead."""
    root = tmp_path / "tree"
    ids = published(store, root)
    extra = str(write_fake_entry(root, fields=default_fields("org/m3", tp=2, dp=1), arch="sm90", seed=3))
    killed = run_cli("rm", "-y", store.url, ids[0], launcher=crash_at("store.record_removed"))
    assert killed.returncode == -signal.SIGKILL
    # file://: killed with the record's temp file written (the 2nd temp: its bundle's went first)
    step = "store.temp_written:2" if store.path is not None else "store.bundle_uploaded"
    killed = run_cli("push", store.url, extra, "--cache-dir", str(root), launcher=crash_at(step))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = store_state(store)
    assert any(k.startswith("deleting/") for k in before) and any(extra in k for k in before), before
    if store.path is not None:
        dead_locks = [k for k in before if k.startswith(".fi-autotune-locks/owners/") and k.endswith(".lock")]
        assert dead_locks and any("/.tmp-" in k for k in before), before
    args = ["prune", store.url, "--arch", "sm90"] if writer == "prune" else ["rm", store.url, ids[1]]
    for reader in (["ls", store.url], [*args, "--dry-run"], [*args, "--dry-run", "--json"]):
        proc = cli(*reader)
        assert proc.returncode == 0, (reader, proc.stderr)
        assert store_state(store) == before, reader
    done = run_cli(*args, "-y", env={"FI_AUTOTUNE_STORE_GRACE": "0"})
    assert done.returncode == 0, done.stderr
    after = store_state(store)
    assert [k for k in after if k.startswith("deleting/") and k.endswith(".json") or ".tmp-" in k] == []
    if store.path is not None:
        assert not any(k in after for k in dead_locks), "the real run tidies dead owners' lock files"


def test_a_store_plans_leftovers_are_found_once_when_it_is_made(tmp_path):
    """``StoreDeletePlan.leftovers`` is a field found when the plan is made, as every other: read
    for ``empty`` and again for printing, it walks the store once and says the same both times,
    whatever changed in the store since (here: the orphan a killed push left is taken away)."""
    import dataclasses

    root, path = tmp_path / "tree", tmp_path / "store"
    files = StoreFiles(f"file://{path}", path=path)
    ids = published(files, root)
    extra = str(write_fake_entry(root, fields=default_fields("org/m3", tp=2, dp=1), arch="sm90", seed=3))
    killed = run_cli("push", files.url, extra, "--cache-dir", str(root), launcher=crash_at("store.bundle_uploaded"))
    assert killed.returncode == -signal.SIGKILL
    plan = plan_store_delete(Store(files.url), refs=(ids[0],))
    assert "leftovers" in {f.name for f in dataclasses.fields(plan)}
    (orphan,) = plan.leftovers
    (path / orphan.rel).unlink()
    assert plan.leftovers == (orphan,) and not plan.empty
    assert plan_store_delete(Store(files.url), refs=(ids[0],)).leftovers == ()


@pytest.mark.parametrize("step", ["store.summary_written", "store.swept"])
def test_ls_counts_each_entry_a_killed_store_delete_took_once(store, tmp_path, step):
    """``ls URL``'s ``interrupted_deletes``: killed with its tombstones and summary written,
    each entry is counted once (not once per proof); killed at its very end, with the
    tombstones gone and only the summary left, each is still counted. An entry pushed again
    since is not."""
    root = tmp_path / "tree"
    ids = published(store, root)
    record = store.record(ids[0])
    killed = run_cli("rm", "-y", store.url, *ids, launcher=crash_at(step))
    assert killed.returncode == -signal.SIGKILL
    left = [k for k in keys(store) if k.startswith("deleting/") and k.endswith(".json")]
    assert len(left) == (4 if step == "store.summary_written" else 1), left
    assert remains(store)["interrupted_deletes"] == 3
    store.put_record(ids[0], record)  # published again (by hand: a push would sweep what the delete left)
    assert remains(store)["interrupted_deletes"] == 2
