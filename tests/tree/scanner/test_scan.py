"""Entry statuses, read from real files written through the real writer."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune_cache.tree.scanner import scan as scan_mod
from autotune_cache.tree.scanner import entry_scan as entry_scan_mod
from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.registry import default_layout
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.tree.status import EntryStatus
from devtools.synthetic import DEFAULT_METADATA, default_fields, entry_path, write_fake_entry, write_vllm_entry
from autotune_cache.registry import get_layout
from autotune_cache.tree.layouts.own_names import MANIFEST_NAME as MANIFEST
from autotune_cache.plan.topology import Topology

from tests.conftest import REPO, unprivileged

SG = default_layout()


def only(root, **kw):
    (entry,) = scan_cache(root, **kw).entries
    return entry


def test_complete_entry_with_manifest(root):
    eid = write_fake_entry(root)
    e = only(root)
    assert e.status == EntryStatus.COMPLETE
    assert e.id == eid and e.model == "zai-org/GLM-5.1-FP8" and e.gpu == "NVIDIA H200"
    assert e.ranks_str == "8/8" and e.num_configs == 63
    assert e.size_on_disk == sum(p.stat().st_size for p in entry_path(root, eid).iterdir())
    assert e.parallel_str == "tp8 dp8a ep1"


def test_missing_rank_file_is_incomplete(root):
    eid = write_fake_entry(root)
    (entry_path(root, eid) / "rank_tp5_pp0_dp5.json").unlink()
    e = only(root)
    assert e.status == EntryStatus.INCOMPLETE and e.ranks_str == "7/8"


def test_differing_file_in_tp_group_is_diverged(root):
    eid = write_fake_entry(root)
    p = entry_path(root, eid) / "rank_tp3_pp0_dp3.json"
    obj = json.loads(p.read_text())
    k = next(k for k in obj if not k.startswith("_"))
    obj[k][1] = 999
    p.write_text(json.dumps(obj, indent=2))
    e = only(root)
    assert e.status == EntryStatus.DIVERGED
    assert any("differ" in prob for prob in e.problems)


def test_replicas_may_differ_from_each_other(root):
    # Two independent replicas are separate TP groups: different content across them is fine.
    fields = default_fields("m", tp=2, dp=1)
    topo = Topology(2, 1, 2, dp_attention=False)
    eid = write_fake_entry(root, fields=fields, topology=topo)
    d = entry_path(root, eid)
    other = (d / "rank_tp0_pp0_dp0.json").read_text().replace('"MoERunner"', '"MoERunner" ', 1)
    for name in ("rank_tp0_pp0_dp1.json", "rank_tp1_pp0_dp1.json"):
        (d / name).write_text(other)
    assert only(root).status == EntryStatus.COMPLETE


def test_truncated_file_is_corrupt_even_with_manifest(root):
    eid = write_fake_entry(root)
    p = entry_path(root, eid) / "rank_tp0_pp0_dp0.json"
    p.write_bytes(p.read_bytes()[:100])  # size and mtime change: the manifest no longer vouches
    e = only(root)
    assert e.status == EntryStatus.CORRUPT
    assert any("invalid JSON" in prob for prob in e.problems)


def test_manifest_fast_path_reads_no_rank_file(root, monkeypatch):
    """While stat matches the manifest's records, no rank file is opened at all."""
    write_fake_entry(root)
    reads = []
    real = entry_scan_mod.read_regular_file
    monkeypatch.setattr(entry_scan_mod, "read_regular_file", lambda p, *a, **k: reads.append(Path(p).name) or real(p, *a, **k))
    e = only(root)
    assert e.status == EntryStatus.COMPLETE and all(rf.sha256 for rf in e.rank_files)
    assert reads == ["fi-autotune.manifest.json"]


def test_edit_with_mtime_put_back_is_still_seen(root):
    """Same size, mtime restored: the ctime the manifest recorded gives the edit away."""
    eid = write_fake_entry(root)
    p = entry_path(root, eid) / "rank_tp0_pp0_dp0.json"
    st = p.stat()
    p.write_bytes(p.read_bytes().replace(b'"cold_l2"', b'"cold_L2"', 1))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_size == st.st_size and p.stat().st_mtime_ns == st.st_mtime_ns
    assert only(root).status == EntryStatus.DIVERGED


def test_engine_written_entry_without_manifest(root):
    write_fake_entry(root, fields=default_fields("x", tp=4, dp=1), with_manifest=False)
    e = only(root)
    assert e.manifest is None and e.model is None
    # tp4 is read off the files present: a lower bound, so the entry is unverified, never complete
    assert e.status == EntryStatus.UNVERIFIED and e.topology == Topology(4, 1, 1)
    assert e.parallel_str == "tp4+ ep?" and e.ranks_str == "4/?"


def test_identical_engine_files_are_parsed_once(root, monkeypatch):
    write_fake_entry(root, with_manifest=False)
    parsed = []
    real = entry_scan_mod.RankFile.from_bytes
    monkeypatch.setattr(entry_scan_mod.RankFile, "from_bytes", classmethod(lambda cls, *a, **k: parsed.append(a[1]) or real(*a, **k)))
    e = only(root)
    assert e.status == EntryStatus.UNVERIFIED and len(e.rank_files) == 8 and len(parsed) == 1
    assert len({rf.sha256 for rf in e.rank_files}) == 1 and all(rf.num_configs == 63 for rf in e.rank_files)


# --- staleness against a fingerprint -----------------------------------------------------------

H200_IMAGE = Fingerprint(dict(DEFAULT_METADATA), "--env-from h200.json")


def test_stale_only_on_a_definite_mismatch(root):
    write_fake_entry(root)  # stamped as tuned on an H200 with CUDA 13.0
    assert only(root, fingerprint=H200_IMAGE).status == EntryStatus.COMPLETE
    h100 = Fingerprint({**DEFAULT_METADATA, "gpu": "NVIDIA H100 80GB HBM3"}, "--env-from h100.json")
    e = only(root, fingerprint=h100)
    assert e.status == EntryStatus.STALE and any("gpu" in p and "H100" in p for p in e.problems)
    # A field the fingerprint could not read is never a mismatch: it is reported as unknown.
    blind = Fingerprint({**DEFAULT_METADATA, "gpu": "unknown", "cudnn_version": "unknown"}, "this host")
    e = only(root, fingerprint=blind)
    assert e.status == EntryStatus.COMPLETE
    assert any("gpu" in n and "cannot be checked" in n for n in e.notes)


def test_unreadable_entry_dir(root):
    """Where permissions apply: an entry dir that cannot be listed is `unreadable`, not 56y old."""
    eid = write_fake_entry(root)
    entry_path(root, eid).chmod(0o000)
    code = ("import json,sys; from autotune_cache.tree.scanner.scan import scan_cache; (e,)=scan_cache(sys.argv[1]).entries;"
            "print(json.dumps([e.status.value, e.last_modified > 0, e.problems]))")
    proc = subprocess.run(unprivileged([sys.executable, "-c", code, str(root)]), capture_output=True, text=True,
                          cwd=REPO)
    entry_path(root, eid).chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    status, has_mtime, problems = json.loads(proc.stdout)
    assert status == "unreadable" and has_mtime and "Permission denied" in problems[0]


def test_unreadable_entry_dir_is_still_listed_by_ls(root):
    """An entry dir that exists but cannot be listed (EACCES) stays `unreadable` in `ls`: only a dir
    that is gone is left out (the two tests below)."""
    from tests.conftest import run_cli_unprivileged

    eid = write_fake_entry(root)
    write_fake_entry(root, fields=default_fields("other", tp=2, dp=1))
    entry_path(root, eid).chmod(0o000)
    try:
        proc = run_cli_unprivileged("ls", "--json", "--cache-dir", str(root))
    finally:
        entry_path(root, eid).chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    rows = {e["id"]: e for e in json.loads(proc.stdout)["entries"]}
    assert len(rows) == 2
    assert rows[str(eid)]["status"] == "unreadable" and "Permission denied" in rows[str(eid)]["problems"][0]


def _trash(path: Path) -> None:
    """What rm/prune does to an entry dir: one rename to a trash name beside it, then remove it."""
    import shutil

    trash = path.parent / f".fi-autotune-trash-test-{path.name}"
    os.rename(path, trash)
    shutil.rmtree(trash)


@pytest.mark.parametrize("how", ["scan_cache", "map_entries", "iter_entries"])
def test_entry_deleted_after_the_walk_listed_it_is_not_listed(root, monkeypatch, how):
    """`ls` while `rm` deletes: an entry dir gone between the walk listing its parent and the scan
    listing it (ENOENT on the dir itself) is gone, not `unreadable: cannot list`."""
    gone = write_fake_entry(root, fields=default_fields("gone", tp=2, dp=1))
    kept = write_fake_entry(root, fields=default_fields("kept", tp=2, dp=1))
    real_scandir = entry_scan_mod.os.scandir

    def scandir_after_rm(path):
        if isinstance(path, (str, os.PathLike)) and Path(path) == entry_path(root, gone):
            _trash(Path(path))
        return real_scandir(path)

    monkeypatch.setattr(entry_scan_mod.os, "scandir", scandir_after_rm)
    if how == "scan_cache":
        info = scan_cache(root)
        ids, findings = [e.id for e in info.entries], list(info.findings)
    elif how == "map_entries":
        ids, findings = scan_mod.map_entries(root, lambda e: e.id, jobs=1)
    else:
        batches, findings = scan_mod.iter_entries(root, lambda e: e.id, jobs=1, batch=1)
        ids = [i for b in batches for i in b]
    assert ids == [kept]
    assert findings == []


def test_entry_renamed_away_while_its_files_are_read_is_not_listed(root, monkeypatch):
    """The narrower window: the entry dir was listed, then renamed to trash before its files were
    stat'ed and read. Every ENOENT inside is the move; the entry is gone."""
    gone = write_fake_entry(root, fields=default_fields("gone", tp=2, dp=1), with_manifest=False)
    kept = write_fake_entry(root, fields=default_fields("kept", tp=2, dp=1))
    real = entry_scan_mod._list_entry

    def list_after_rm(layout, path, children):
        if path == entry_path(root, gone):
            _trash(path)
        return real(layout, path, children)

    monkeypatch.setattr(entry_scan_mod, "_list_entry", list_after_rm)
    info = scan_cache(root)
    assert [e.id for e in info.entries] == [kept] and info.findings == ()


def test_a_file_missing_inside_an_entry_that_is_still_there_is_reported(root, monkeypatch):
    """ENOENT on something *inside* an entry dir that still exists is not the entry being gone: a rank
    file that vanished between listing and stat stays a problem of the entry."""
    eid = write_fake_entry(root, fields=default_fields("m", tp=2, dp=1))
    real = entry_scan_mod._list_entry

    def list_then_lose_a_rank(layout, path, children):
        (path / "rank_tp1_pp0_dp0.json").unlink()
        return real(layout, path, children)

    monkeypatch.setattr(entry_scan_mod, "_list_entry", list_then_lose_a_rank)
    (e,) = scan_cache(root).entries
    assert e.id == eid and e.status is not EntryStatus.COMPLETE
    assert any("No such file" in f.message for f in e.foreign)


def test_a_named_entry_that_is_gone_is_still_unreadable(root):
    """``scan_entry`` of one named entry (check, rm's re-read, publish) keeps answering for a dir
    that is not there: only a tree scan, whose walk just listed it, leaves it out."""
    eid = write_fake_entry(root)
    path = entry_path(root, eid)
    _trash(path)
    e = scan_mod.scan_entry(SG, path, eid)
    assert e.status is EntryStatus.UNREADABLE and "No such file" in e.problems[0]
    assert scan_mod.scan_entry(SG, path, eid, skip_gone=True) is None


def test_a_trash_dir_removed_after_its_parent_was_listed_is_no_finding(root, monkeypatch):
    """rm finishing its trash dir between the walk listing the arch dir and stat'ing the name: no
    `unreadable: cannot stat` finding for what is gone."""
    from autotune_cache.tree.scanner import walk as walk_mod

    eid = write_fake_entry(root)
    trash = entry_path(root, eid).parent / ".fi-autotune-trash-0123456789ab-0123456789abcdef"
    trash.mkdir()
    real = walk_mod.list_dir

    def list_then_rm(path, sort=True):
        children, err = real(path, sort)
        if Path(path) == trash.parent and trash.exists():
            trash.rmdir()
        return children, err

    monkeypatch.setattr(walk_mod, "list_dir", list_then_rm)
    info = scan_cache(root)
    assert [e.id for e in info.entries] == [eid] and info.findings == ()


# --- bounded work on hostile data ------------------------------------------------------------

def _manifest_path(root, eid):
    return entry_path(root, eid) / "fi-autotune.manifest.json"


@pytest.mark.parametrize("mutate,needle", [
    (lambda m: m.__setitem__("rank_files", ["rank_tp0_pp0_dp0.json"]), "rank_files is not an object"),
    (lambda m: m.__setitem__("rank_files", "rank_tp0_pp0_dp0.json"), "rank_files is not an object"),
    (lambda m: m["topology"].__setitem__("tp", 10**9), "beyond"),
    (lambda m: m.__setitem__("key_fields", "x"), "key_fields"),
    (lambda m: m.__setitem__("flashinfer_metadata", [1]), "flashinfer_metadata"),
    (lambda m: m["rank_files"]["rank_tp0_pp0_dp0.json"].__setitem__("size", "big"), "wrong type"),
])
def test_malformed_manifest_makes_the_entry_corrupt(root, mutate, needle):
    eid = write_fake_entry(root)
    p = _manifest_path(root, eid)
    m = json.loads(p.read_text())
    mutate(m)
    p.write_text(json.dumps(m))
    e = only(root)
    assert e.status == EntryStatus.CORRUPT and any(needle in prob for prob in e.problems), e.problems


def test_deeply_nested_json_is_corrupt_not_a_crash(root):
    eid = write_fake_entry(root)
    deep = b"[" * 100_000 + b"]" * 100_000
    _manifest_path(root, eid).write_bytes(deep)
    (entry_path(root, eid) / "rank_tp1_pp0_dp1.json").write_bytes(deep)
    e = only(root)
    assert e.status == EntryStatus.CORRUPT
    assert any("nested too deeply" in p for p in e.problems) and any("rank_tp1" in p for p in e.problems)


def test_stray_huge_rank_index_is_corrupt_and_quick(root):
    eid = write_fake_entry(root, with_manifest=False)
    (entry_path(root, eid) / "rank_tp99999999_pp0_dp0.json").write_bytes(
        (entry_path(root, eid) / "rank_tp0_pp0_dp0.json").read_bytes())
    t0 = time.perf_counter()
    e = only(root)
    assert time.perf_counter() - t0 < 5
    assert e.status == EntryStatus.CORRUPT and any("beyond" in p for p in e.problems)


def test_newer_manifest_format_is_noted_not_corrupt(root):
    eid = write_fake_entry(root)
    p = _manifest_path(root, eid)
    m = json.loads(p.read_text())
    m["format"] = 99
    p.write_text(json.dumps(m))
    e = only(root)
    assert e.status == EntryStatus.UNVERIFIED and e.manifest is None
    assert any("newer" in n for n in e.notes)


# --- the tree ---------------------------------------------------------------------------------

def test_missing_tree_is_empty(tmp_path):
    info = scan_cache(tmp_path / "nope")
    assert info.entries == () and info.findings == ()


def test_autotune_dir_that_is_a_file_is_an_error(tmp_path):
    from autotune_cache.errors import FiAutotuneError

    (tmp_path / "flashinfer").mkdir()
    (tmp_path / "flashinfer" / "autotune").write_text("oops")
    with pytest.raises(FiAutotuneError, match="not a directory"):
        scan_cache(tmp_path)


def test_ids_resolve_and_ambiguous_keys_list_the_ids(root):
    from autotune_cache.errors import AmbiguousEntry, FiAutotuneError

    a = write_fake_entry(root)
    b = write_fake_entry(root, flashinfer_version="0.7.1")
    info = scan_cache(root)
    assert [e.id for e in info.resolve([str(a)])] == [a]
    assert [e.id for e in info.resolve([str(entry_path(root, b))])] == [b]
    with pytest.raises(AmbiguousEntry, match=f"names 2 entries.*{a.parts[0]}/sm100/{a.name}"):
        info.resolve([a.name])
    with pytest.raises(FiAutotuneError, match="no cache entry"):
        info.resolve(["0000000000000000"])
    c = write_fake_entry(root, fields=default_fields("other"))
    assert [e.id for e in scan_cache(root).resolve([c.name])] == [c]  # unique: a bare key is enough


def test_forked_map_matches_serial_scan(root, monkeypatch):
    """The parallel path of map_entries (real forked children) returns what a serial scan does, in order."""
    for i in range(7):
        write_fake_entry(root, fields=default_fields(f"m{i}", tp=2, dp=1), arch="sm90" if i % 2 else "sm100")
    serial = [e.to_dict() for e in scan_cache(root).entries]
    monkeypatch.setattr(scan_mod, "PARALLEL_MIN_ENTRIES", 0)
    parent = os.getpid()
    results, findings = scan_mod.map_entries(root, lambda e: (os.getpid(), e.to_dict()), jobs=3)
    assert [d for _, d in results] == serial
    assert {pid for pid, _ in results} - {parent}, "no entry was scanned in a child process"
    assert findings == []


def test_last_used_comes_from_access_times(root):
    eid = write_fake_entry(root)
    old = time.time() - 40 * 86400
    for p in entry_path(root, eid).iterdir():
        os.utime(p, (old, old))
    assert abs(only(root).last_used - old) < 2
    p = entry_path(root, eid) / "rank_tp2_pp0_dp2.json"
    os.utime(p, (time.time(), old))  # an engine read it (atime now), nobody wrote it
    e = only(root)
    assert time.time() - e.last_used < 60 and abs(e.last_modified - old) < 2


def test_listing_does_not_count_as_use(root):
    """ls reads engine-written files (no manifest) with O_NOATIME: it must not bump last use."""
    eid = write_fake_entry(root, with_manifest=False)
    old = time.time() - 40 * 86400
    for p in entry_path(root, eid).iterdir():
        os.utime(p, (old, old))
    only(root)
    e = only(root)
    assert abs(e.last_used - old) < 2


def test_noatime_mount_makes_last_use_unknown(tmpfs):
    mnt = tmpfs("8m", "noatime")
    write_fake_entry(mnt)
    e = only(mnt)
    assert e.last_used is None and e.last_used_str == "unknown"


def test_ls_listing_cells_are_the_properties(root, tmp_path):
    """``ls`` takes GPU, PARALLEL, RANKS and CONFIGS from ``listing_cells`` (one layout lookup);
    for every status and layout they must read as the properties ``show`` and ``--json`` use."""
    ids = [write_fake_entry(root, fields=default_fields(model=f"org/m{i}")) for i in range(5)]
    paths = [entry_path(root, e) for e in ids]
    (paths[1] / "rank_tp5_pp0_dp5.json").unlink()
    (paths[2] / "rank_tp3_pp0_dp3.json").write_text("{not json")
    (paths[3] / MANIFEST).unlink()
    (paths[3] / "rank_tp7_pp0_dp7.json").unlink()
    (paths[4] / MANIFEST).write_text("[]")
    write_fake_entry(root, topology=Topology(4, 2, 2, dp_attention=False), fields=default_fields(model="org/pp", tp=4, dp=2))
    vroot = tmp_path / "vllm"
    write_vllm_entry(vroot, "ab" * 32, world=2, dp=2)
    entries = list(scan_cache(root).entries) + list(scan_cache(vroot, layout=get_layout("vllm")).entries)
    statuses = {e.status for e in entries}
    assert {EntryStatus.COMPLETE, EntryStatus.INCOMPLETE, EntryStatus.CORRUPT, EntryStatus.UNVERIFIED} <= statuses
    for e in entries:
        assert e.listing_cells() == (e.gpu_short, e.parallel_str, e.ranks_str, str(e.num_configs)), e.id
