"""Entry statuses, read from real files written through the real writer."""

import json
import os
from pathlib import Path

from autotune_cache import layout
from autotune_cache.layout import Topology
from autotune_cache.scan import EntryStatus, scan_cache
from autotune_cache.testing import DEFAULT_METADATA, default_fields, write_fake_entry


def key_dir(root: Path, eid) -> Path:
    return layout.key_dir(root, eid.flashinfer_version, eid.arch, eid.key)


def only(root, **kw):
    (entry,) = scan_cache(root, **kw).entries
    return entry


def test_complete_entry_with_manifest(root):
    eid = write_fake_entry(root)
    e = only(root)
    assert e.status == EntryStatus.COMPLETE
    assert e.id == str(eid) and e.model == "zai-org/GLM-5.1-FP8"
    assert e.ranks_str == "8/8" and e.num_configs == 63
    assert e.size_on_disk == sum(p.stat().st_size for p in key_dir(root, eid).iterdir())


def test_missing_rank_file_is_incomplete(root):
    eid = write_fake_entry(root)
    (key_dir(root, eid) / "rank_tp5_pp0_dp5.json").unlink()
    e = only(root)
    assert e.status == EntryStatus.INCOMPLETE and e.ranks_str == "7/8"


def test_differing_file_in_tp_group_is_diverged(root):
    eid = write_fake_entry(root)
    p = key_dir(root, eid) / "rank_tp3_pp0_dp3.json"
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
    d = key_dir(root, eid)
    other = (d / "rank_tp0_pp0_dp0.json").read_text().replace('"MoERunner"', '"MoERunner" ', 1)
    for name in ("rank_tp0_pp0_dp1.json", "rank_tp1_pp0_dp1.json"):
        (d / name).write_text(other)
    assert only(root).status == EntryStatus.COMPLETE


def test_truncated_file_is_corrupt_even_with_manifest(root):
    eid = write_fake_entry(root)
    p = key_dir(root, eid) / "rank_tp0_pp0_dp0.json"
    p.write_bytes(p.read_bytes()[:100])  # size and mtime change: the manifest no longer vouches
    e = only(root)
    assert e.status == EntryStatus.CORRUPT
    assert any("invalid JSON" in prob for prob in e.problems)


def test_manifest_fast_path_is_revalidated_by_stat(root):
    eid = write_fake_entry(root)
    p = key_dir(root, eid) / "rank_tp0_pp0_dp0.json"
    data = p.read_bytes()
    st = p.stat()
    # Same size, same mtime: the manifest's record is trusted (no read).
    assert only(root).rank_files[0].sha256 is not None
    # Same size but a new mtime: re-read and re-hash, so an edit cannot hide.
    p.write_bytes(data.replace(b'"cold_l2"', b'"cold_L2"', 1))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert only(root).status == EntryStatus.DIVERGED


def test_engine_written_entry_without_manifest(root):
    write_fake_entry(root, fields=default_fields("x", tp=4, dp=1), with_manifest=False)
    e = only(root)
    assert e.manifest is None and e.model is None
    assert e.status == EntryStatus.COMPLETE and e.topology == Topology(4, 1, 1)


def test_stale_against_this_machines_flashinfer(root):
    """Uses FlashInfer's own _collect_metadata/_classify_metadata_mismatches (CPU: gpu 'unknown')."""
    from autotune_cache.envcheck import metadata_checker

    write_fake_entry(root)  # stamped as tuned on an H200 with CUDA 13.0
    e = only(root, check_env=metadata_checker())
    assert e.status == EntryStatus.STALE
    assert any("gpu" in p for p in e.problems)
    # A file stamped with this machine's own metadata is not stale.
    check = metadata_checker()
    assert check(dict(check.current)) is None
    assert check({**check.current, "gpu": "*"}) is None
    assert check({**DEFAULT_METADATA}) is not None


def test_missing_tree_is_empty(tmp_path):
    info = scan_cache(tmp_path / "nope")
    assert info.entries == () and info.findings == ()


def test_forked_map_matches_serial_scan(root, monkeypatch):
    """The parallel path of map_entries (real forked children) returns what a serial scan does, in order."""
    from autotune_cache import scan as scan_mod

    for i in range(7):
        write_fake_entry(root, fields=default_fields(f"m{i}", tp=2, dp=1), arch="sm90" if i % 2 else "sm100")
    serial = [e.to_dict() for e in scan_cache(root).entries]
    monkeypatch.setattr(scan_mod, "PARALLEL_MIN_ENTRIES", 0)
    parent = os.getpid()
    results, findings = scan_mod.map_entries(root, lambda e: (os.getpid(), e.to_dict()), jobs=3)
    assert [d for _, d in results] == serial
    assert {pid for pid, _ in results} - {parent}, "no entry was scanned in a child process"
    assert findings == []
