"""``ls`` at scale: ``-q`` and ``--json`` written entry by entry (the same JSON ``emit`` writes),
one order for every mode, and a note shared by many entries printed once."""

from __future__ import annotations

import json

from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.tree import listing as ls_mod
from cli.output import Output
from devtools.synthetic import default_fields, write_fake_entry

from ..conftest import run_cli


def _tree(root):
    ids = [write_fake_entry(root, flashinfer_version=v, seed=i)
           for i, v in enumerate(["0.7.2.post1", "0.7.2", "0.7.1"])]
    ids += [write_fake_entry(root, fields=default_fields(f"org/engine-written-{i}", tp=2, dp=1), seed=10 + i,
                             with_manifest=False, flashinfer_version="0.7.2.post1") for i in range(5)]
    return ids


def test_streamed_json_is_the_object_emit_writes(capsys):
    items = [{"id": "a", "nested": {"x": [1, 2]}}, {"id": "b", "e": []}]
    for entries in ([], items):
        Output(as_json=True, command="ls").emit(data={"root": "/r", "entries": entries, "totals": {"n": len(entries)}})
        whole = capsys.readouterr().out
        Output(as_json=True, command="ls").emit_stream(human=lambda: None, head={"root": "/r"}, items_key="entries",
                                         items=iter(entries), tail=lambda: {"totals": {"n": len(entries)}})
        assert capsys.readouterr().out == whole


def test_quiet_json_and_table_list_the_same_entries_in_the_same_order(tmp_path):
    root = tmp_path / "cache"
    made = _tree(root)
    cd = ["--cache-dir", str(root)]
    quiet = run_cli("ls", "-q", *cd)
    assert quiet.returncode == 0, quiet.stderr
    streamed = quiet.stdout.split()
    # part by part, as the tree is walked: 0.7.2 before 0.7.2.post1 (a plain string sort says otherwise)
    assert streamed == sorted((str(i) for i in made), key=lambda s: s.split("/"))
    assert streamed.index(next(s for s in streamed if s.startswith("0.7.2/"))) < \
        streamed.index(next(s for s in streamed if s.startswith("0.7.2.post1/")))
    data = json.loads(run_cli("ls", "--json", *cd).stdout)
    assert [e["id"] for e in data["entries"]] == streamed
    assert list(data) == ["format", "root", "roots", "fingerprint", "entries", "findings", "totals", "atime"]
    assert data["totals"]["entries"] == data["totals"]["in_tree"] == 8
    assert data["totals"]["by_status"] == {"complete": 3, "unverified": 5}
    assert all("row" not in e and "notes" not in e for e in data["entries"])
    table = run_cli("ls", *cd).stdout.splitlines()[2:2 + len(streamed)]
    assert [line.split()[0] for line in table] == streamed
    # a sorted listing holds the same entries
    assert sorted(run_cli("ls", "-q", "--sort", "size", *cd).stdout.split()) == sorted(streamed)


def test_filters_count_in_the_streamed_totals(tmp_path):
    root = tmp_path / "cache"
    _tree(root)
    data = json.loads(run_cli("ls", "--json", "--status", "unverified", "--cache-dir", str(root)).stdout)
    assert len(data["entries"]) == data["totals"]["entries"] == 5
    assert data["totals"]["in_tree"] == 8


def test_a_note_many_entries_share_is_printed_once(tmp_path):
    root = tmp_path / "cache"
    _tree(root)
    proc = run_cli("ls", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "no manifest" in line]
    assert len(lines) == 1 and lines[0].startswith("5 entries ("), proc.stderr


def test_ls_dir_prints_the_root_without_reading_it(tmp_path):
    missing = tmp_path / "not-yet"
    proc = run_cli("ls", "--dir", "--cache-dir", str(missing))
    assert proc.returncode == 0 and proc.stdout == f"{missing}\n"
    doc = json.loads(run_cli("ls", "--dir", "--json", "--cache-dir", str(missing)).stdout)
    assert doc["roots"] == [{"layout": "sglang", "path": str(missing), "source": "--cache-dir", "exists": False}]
    env = run_cli("ls", "--dir", "--layout", "sglang", env={"SGLANG_CACHE_DIR": str(tmp_path / "s")})
    assert env.stdout.strip() == str(tmp_path / "s")


def test_limit_reverse_and_size_filters(tmp_path):
    root = tmp_path / "cache"
    _tree(root)
    cd = ["--cache-dir", str(root)]
    everything = run_cli("ls", "-q", *cd).stdout.split()
    assert run_cli("ls", "-q", "--limit", "2", *cd).stdout.split() == everything[:2]
    assert run_cli("ls", "-q", "--reverse", *cd).stdout.split() == everything[::-1]
    data = json.loads(run_cli("ls", "--json", "--limit", "3", *cd).stdout)
    assert len(data["entries"]) == 3 and data["totals"]["entries"] == 8  # the footer counts the whole tree
    table = run_cli("ls", "--limit", "3", *cd).stdout
    assert "(the first 3 shown: --limit)" in table and "\n8 entries" in table
    sizes = {e["id"]: e["size_on_disk"] for e in json.loads(run_cli("ls", "--json", *cd).stdout)["entries"]}
    cut = sorted(sizes.values())[len(sizes) // 2]
    big = run_cli("ls", "-q", "--larger-than", f"{cut}B", *cd).stdout.split()
    small = run_cli("ls", "-q", "--smaller-than", f"{cut}B", *cd).stdout.split()
    assert sorted(big) == sorted(i for i, s in sizes.items() if s > cut)
    assert sorted(small) == sorted(i for i, s in sizes.items() if s < cut)
    plan = json.loads(run_cli("prune", "--larger-than", f"{cut}B", "--dry-run", "--json", *cd).stdout)
    assert sorted(e["id"] for e in plan["plan"]["entries"]) == sorted(big)
    bad = run_cli("ls", "--larger-than", "ten", *cd)
    assert bad.returncode == 2 and "invalid size 'ten'" in bad.stderr


def test_the_table_drops_columns_to_fit_the_terminal_never_the_id_or_status(tmp_path):
    root = tmp_path / "cache"
    made = _tree(root)
    wide = run_cli("ls", "--cache-dir", str(root)).stdout.splitlines()  # piped: every column
    assert wide[0].split() == ["ID", "LAYOUT", "MODEL", "GPU", "PARALLEL", "RANKS", "CONFIGS", "SIZE", "MODIFIED",
                               "USED", "STATUS"]
    narrow = run_cli("ls", "--cache-dir", str(root), env={"COLUMNS": "60"}).stdout.splitlines()
    assert narrow[0].split()[0] == "ID" and narrow[0].split()[-1] == "STATUS"
    assert max(len(line) for line in narrow[2:2 + len(made)]) <= 60
    tiny = run_cli("ls", "--cache-dir", str(root), env={"COLUMNS": "10"}).stdout.splitlines()
    assert tiny[0].split() == ["ID", "STATUS"]  # ids are never cut, whatever the width
    assert {line.split()[0] for line in tiny[2:2 + len(made)]} == {str(i) for i in made}


def test_row_cells_are_shared_up_to_a_bound_and_read_the_same_past_it(tmp_path, monkeypatch):
    """``ls`` keeps one string per distinct table cell so 100,000 rows stay small; a tree of
    ever-new cells (sizes, ages) must not grow that store without bound, and a row past the
    bound must read exactly as one under it."""
    root = tmp_path / "tree"
    for i in range(4):
        write_fake_entry(root, fields=default_fields(model=f"org/m{i}"))
    entries = scan_cache(root).entries
    monkeypatch.setattr(ls_mod, "_CELLS", {})
    free = [ls_mod.summary(e, False)["row"] for e in entries]
    assert free[0][1] is free[1][1]  # "sglang": one object
    monkeypatch.setattr(ls_mod, "_CELLS", {})
    first = [ls_mod.summary(e, False)["row"] for e in entries[:2]]
    monkeypatch.setattr(ls_mod, "MAX_CELLS", len(ls_mod._CELLS))
    grown = len(ls_mod._CELLS)
    past = [ls_mod.summary(e, False)["row"] for e in entries[2:]]  # new MODEL cells: org/m2, org/m3
    assert first + past == free and len(ls_mod._CELLS) == grown
