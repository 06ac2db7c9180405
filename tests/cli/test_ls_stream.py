"""``ls`` at scale: ``-q`` and ``--json`` written entry by entry (the same JSON ``emit`` writes),
one order for every mode, and a note shared by many entries printed once."""

from __future__ import annotations

import json

from cli.output import Output
from tests.synthetic import default_fields, write_fake_entry

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
        Output(as_json=True).emit(data={"root": "/r", "entries": entries, "totals": {"n": len(entries)}})
        whole = capsys.readouterr().out
        Output(as_json=True).emit_stream(human=lambda: None, head={"root": "/r"}, items_key="entries",
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
    assert list(data) == ["root", "roots", "fingerprint", "entries", "findings", "totals"]
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
