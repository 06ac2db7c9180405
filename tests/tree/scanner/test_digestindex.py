"""The digest index (``tree/scanner/digestindex.py``): what an engine-written entry's rank files hold,
remembered per entry by the stat of every file, in one compact file per tree outside it.

What must hold: a record only ever describes the bytes it was made from (an edit with the mtime
put back is read again); every entry is remembered however large the tree (no cap), so a second
``ls`` reads no rank file; a corrupt, truncated or foreign index file is ignored and rebuilt,
never trusted and never a crash; two ``ls`` saving at once leave a whole file;
``FI_AUTOTUNE_NO_INDEX=1`` turns it off."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune_cache.autotuner.rankfile import RankFile
from autotune_cache.plan.entry_key import KeyFields
from autotune_cache.plan.topology import Topology
from autotune_cache.registry import default_layout
from autotune_cache.tree.scanner import entry_scan as entry_scan_mod
from autotune_cache.tree.scanner import digestindex as di
from autotune_cache.tree.scanner.digestindex import DigestIndex
from autotune_cache.tree.records import CacheEntry
from autotune_cache.tree.scanner.scan import iter_entries, scan_cache
from autotune_cache.tree.status import EntryStatus
from devtools.synthetic import DEFAULT_METADATA, cache_file_bytes, fake_configs, make_manifest

from tests.conftest import REPO

BUCKETS = (1, 2, 4)


def engine_tree(root: Path, n: int, tp: int = 2, start: int = 0) -> list[Path]:
    """n engine-written entries (rank files only, all ranks of an entry alike), written directly."""
    layout = default_layout()
    topo = Topology(tp, 1, 1)
    dirs = []
    for i in range(start, start + n):
        fields = KeyFields(f"org/m{i}", "torch.bfloat16", "fp8", "flashinfer_trtllm", tp, 1, 1, 1, "X")
        manifest = make_manifest(fields, topo, "0.7.2.post1", "sm100")
        data = cache_file_bytes({**DEFAULT_METADATA, "flashinfer_version": "0.7.2.post1"},
                                fake_configs(buckets=BUCKETS, seed=i))
        kdir = layout.entry_dir(root, layout.make_id(("0.7.2.post1", "sm100", manifest.key)))
        kdir.mkdir(parents=True)
        for name in topo.rank_files():
            (kdir / name).write_bytes(data)
        dirs.append(kdir)
    return dirs


def count_reads(monkeypatch) -> list[str]:
    reads: list[str] = []
    real = entry_scan_mod.read_regular_file
    monkeypatch.setattr(entry_scan_mod, "read_regular_file", lambda p, *a, **k: reads.append(str(p)) or real(p, *a, **k))
    return reads


def index_file(root: Path) -> Path:
    return DigestIndex.path_for(root)[0]


def test_every_entry_is_remembered_and_a_second_scan_reads_no_rank_file(root, monkeypatch):
    engine_tree(root, 40)
    reads = count_reads(monkeypatch)
    first = scan_cache(root)
    assert len(reads) == 80 and all(e.status == EntryStatus.UNVERIFIED for e in first.entries)
    index = DigestIndex.for_root(root)
    assert len(index) == 40  # one record per entry: both ranks hold the same bytes
    index.close()
    reads.clear()
    second = scan_cache(root)
    assert reads == []
    assert [e.to_dict() for e in second.entries] == [e.to_dict() for e in first.entries]


def test_the_streamed_scan_over_forked_processes_learns_from_its_children(root, monkeypatch):
    """``ls`` scans in batches over forked children: what a child read reaches the saved index."""
    monkeypatch.setattr("autotune_cache.tree.scanner.scan.PARALLEL_MIN_ENTRIES", 4)
    engine_tree(root, 30)
    batches, _ = iter_entries(root, lambda e: e.to_dict(), jobs=3, batch=8)
    first = [d for b in batches for d in b]
    index = DigestIndex.for_root(root)
    assert len(index) == 30
    index.close()
    reads = count_reads(monkeypatch)
    batches, _ = iter_entries(root, lambda e: e.to_dict(), jobs=1, batch=8)
    assert [d for b in batches for d in b] == first and reads == []


def test_an_edit_with_its_mtime_put_back_is_read_again(root):
    """Same size, mtime restored: the ctime is in the key, so the record no longer matches."""
    kdir = engine_tree(root, 1, tp=2)[0]
    scan_cache(root)
    p = kdir / "rank_tp1_pp0_dp0.json"
    st = p.stat()
    p.write_bytes(p.read_bytes().replace(b'"cold_l2"', b'"cold_L2"', 1))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_size == st.st_size and p.stat().st_mtime_ns == st.st_mtime_ns
    (e,) = scan_cache(root).entries
    assert e.status == EntryStatus.DIVERGED
    assert e.rank_files[1].sha256 != e.rank_files[0].sha256


def test_entries_whose_files_differ_keep_a_record_per_file(root, monkeypatch):
    kdir = engine_tree(root, 1, tp=2)[0]
    p = kdir / "rank_tp1_pp0_dp0.json"
    p.write_bytes(cache_file_bytes(DEFAULT_METADATA, fake_configs(buckets=BUCKETS, seed=99)))
    (first,) = scan_cache(root).entries
    assert first.status == EntryStatus.DIVERGED
    index = DigestIndex.for_root(root)
    assert len(index) == 2
    index.close()
    reads = count_reads(monkeypatch)
    (second,) = scan_cache(root).entries
    assert reads == [] and second.to_dict() == first.to_dict()


def test_removed_entries_drop_out_of_the_index(root):
    import shutil

    dirs = engine_tree(root, 20)
    scan_cache(root)
    for d in dirs[:10]:
        shutil.rmtree(d)
    scan_cache(root)
    index = DigestIndex.for_root(root)
    assert len(index) == 10
    index.close()


def test_no_index_turns_it_off(root, monkeypatch):
    engine_tree(root, 3)
    monkeypatch.setenv("FI_AUTOTUNE_NO_INDEX", "1")
    scan_cache(root)
    assert not index_file(root).exists()
    reads = count_reads(monkeypatch)
    scan_cache(root)
    assert len(reads) == 6


def _flip(offset):
    def corrupt(data: bytes) -> bytes:
        b = bytearray(data)
        b[offset] ^= 0x55
        return bytes(b)
    return corrupt


CORRUPTIONS = {
    "empty": lambda data: b"",
    "truncated": lambda data: data[: len(data) // 2],
    "one byte short": lambda data: data[:-1],
    "garbage": lambda data: os.urandom(len(data)),
    # the sha256 of the first record: trusted, ls would print another digest than the file's
    "flipped digest": _flip(di.HEAD + 20 + 3),
    "flipped key": _flip(di.HEAD + 2),
    "flipped count": _flip(8),
    "flipped fan-out": _flip(di.HEAD + 3 * di.REC + 4000),
    "flipped metadata": lambda data: data[:-3] + bytes([data[-3] ^ 0x55]) + data[-2:],
    "old marshal format": lambda data: __import__("marshal").dumps({"format": 2, "files": {}, "metas": []}),
}


@pytest.mark.parametrize("how", list(CORRUPTIONS))
def test_a_corrupt_index_is_ignored_and_rebuilt_never_trusted(root, how):
    """A whole ``ls`` (a real process) over a damaged index file answers exactly as without one,
    and leaves a whole index behind."""
    from tests.conftest import run_cli

    engine_tree(root, 3)
    env = {"XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]}
    proc = run_cli("ls", "--json", "--cache-dir", str(root), env=env)
    assert proc.returncode == 0, proc.stderr
    truth = run_cli("ls", "--json", "--cache-dir", str(root), env={**env, "FI_AUTOTUNE_NO_INDEX": "1"}).stdout
    path = index_file(root)
    path.write_bytes(CORRUPTIONS[how](path.read_bytes()))
    # a damaged file must not even look valid to the opener
    index = DigestIndex.for_root(root)
    assert len(index) == 0 and index.fd is None
    proc = run_cli("ls", "--json", "--cache-dir", str(root), env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == truth
    rebuilt = DigestIndex.for_root(root)
    assert len(rebuilt) == 3
    rebuilt.close()


def test_an_index_of_another_root_is_not_used(root, tmp_path, monkeypatch):
    engine_tree(root, 2)
    scan_cache(root)
    other = tmp_path / "other"
    engine_tree(other, 2)
    index_file(other).parent.mkdir(parents=True, exist_ok=True)
    index_file(other).write_bytes(index_file(root).read_bytes())
    index = DigestIndex.for_root(other)
    assert len(index) == 0
    reads = count_reads(monkeypatch)
    scan_cache(other)
    assert len(reads) == 4


def test_two_ls_saving_at_once_leave_a_whole_index(root):
    """Real processes: several ``ls`` of a tree whose index is cold (each one reads everything and
    saves) and then of a grown tree; the index after is whole, complete and says the truth."""
    engine_tree(root, 300)
    env = {**os.environ, "XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]}
    argv = [sys.executable, "-m", "fi_autotune_cli", "ls", "--json", "--cache-dir", str(root)]
    for rnd in range(3):
        if rnd:
            engine_tree(root, 40, start=1000 * rnd)
        procs = [subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(4)]
        outs = [p.communicate(timeout=300) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
        index = DigestIndex.for_root(root)
        assert len(index) == 300 + 40 * rnd and index.fd is not None
        index.close()
        leftovers = [p for p in index_file(root).parent.iterdir() if p.suffix == ".tmp"]
        assert leftovers == []
    truth = subprocess.run(argv, cwd=REPO, env={**env, "FI_AUTOTUNE_NO_INDEX": "1"}, capture_output=True)
    assert json.loads(outs[0][0]) == json.loads(truth.stdout)


def test_rank_files_from_the_index_are_the_ones_read_from_disk(root, monkeypatch):
    """An indexed entry's ``RankFile``s are built field by field (``tuple.__new__``, no
    ``__new__`` frame per file): each must equal, field for field, the one read from the bytes."""
    engine_tree(root, 3)
    monkeypatch.setenv("FI_AUTOTUNE_NO_INDEX", "1")
    read = scan_cache(root)
    monkeypatch.delenv("FI_AUTOTUNE_NO_INDEX")
    scan_cache(root)  # fills the index
    reads = count_reads(monkeypatch)
    indexed = scan_cache(root)
    assert reads == []
    assert [e.rank_files for e in indexed.entries] == [e.rank_files for e in read.entries]
    assert all(type(rf) is RankFile and len(rf) == len(RankFile._fields) for e in indexed.entries for rf in e.rank_files)


def test_entry_key_is_count_names_and_each_stat_key(root):
    """``stats_digest`` packs every file's stat at once; the bytes hashed must stay what the index
    on disk was written with: the count, the names, and each file's ``stat_key`` in order."""
    kdir = engine_tree(root, 1, tp=4)[0]
    files = sorted((f.name, f.stat(follow_symlinks=False)) for f in os.scandir(kdir))
    spelled = hashlib.blake2b(len(files).to_bytes(4, "little") + "\0".join(n for n, _ in files).encode() + b"\0"
                              + b"".join(di.stat_key(st) for _, st in files), digest_size=di.KEY_BYTES).digest()
    assert len(files) == 4 and di.stats_digest(files) == spelled
    assert di.stats_digest(files[:3]) != spelled


def test_a_scanned_entry_is_the_dataclass_built_the_usual_way(root):
    """``CacheEntry.scanned`` skips the frozen ``__init__``: the entry must equal and read as the
    one ``CacheEntry(...)`` builds, and a field left out must fail, not read as absent."""
    engine_tree(root, 2)
    for e in scan_cache(root).entries:
        values = {f: getattr(e, f) for f in e.__dataclass_fields__}
        usual = CacheEntry(**values)
        assert e == usual and repr(e) == repr(usual) and e.to_dict() == usual.to_dict() and e.state == usual.state
        assert CacheEntry.scanned(**values) == usual
        del values["state"]
        with pytest.raises(TypeError, match="state"):
            CacheEntry.scanned(**values)


def test_no_collection_runs_while_a_stream_is_scanned_and_the_collector_comes_back(root):
    """``ls`` keeps every row of a 100,000-entry table until it is printed: a cyclic collection
    during the stream (the walk between batches once set off 600 of them) goes over all of it.
    The collector is off from the first batch to the last, and on again after, also when the
    caller stops early."""
    engine_tree(root, 24)
    phases: list[str] = []
    threshold = gc.get_threshold()
    gc.callbacks.append(record := lambda phase, info: phases.append(phase))
    gc.set_threshold(1)  # on, the collector would run at the walk's first allocation
    try:
        assert gc.isenabled()
        batches, _ = iter_entries(root, lambda e: e.to_dict(), jobs=1, batch=4)
        kept = next(batches)
        phases.clear()  # from here each next() walks a batch: no collection may run
        for b in batches:
            assert phases == [] and not gc.isenabled()
            kept += b
        assert len(kept) == 24 and gc.isenabled()
        batches, _ = iter_entries(root, lambda e: e.to_dict(), jobs=1, batch=4)
        next(batches)
        assert not gc.isenabled()
        batches.close()
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(record)
        gc.set_threshold(*threshold)


@pytest.mark.parametrize("what", ["fifo", "dev-zero", "directory"])
def test_an_index_path_that_is_no_regular_file_is_ignored_without_blocking(root, what):
    """A FIFO in the index's place (a plain ``open`` waits for a writer for ever), a link to
    ``/dev/zero``, a directory: ``ls`` (a real process, under a deadline) lists as without an index."""
    from tests.conftest import run_cli

    engine_tree(root, 2)
    env = {"XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]}
    truth = run_cli("ls", "--json", "--cache-dir", str(root), env={**env, "FI_AUTOTUNE_NO_INDEX": "1"}).stdout
    path = index_file(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    {"fifo": os.mkfifo, "dev-zero": lambda p: os.symlink("/dev/zero", p), "directory": os.mkdir}[what](path)
    index = DigestIndex.for_root(root) if what != "fifo" else None  # in this process only where it cannot hang
    assert index is None or (len(index) == 0 and index.fd is None)
    proc = run_cli("ls", "--json", "--cache-dir", str(root), env=env, timeout=60)
    assert proc.returncode == 0 and proc.stdout == truth, proc.stderr
