"""benchmarks/cli_compare.py's verdicts (issue 33's old-vs-new harness): what two old runs
disagree on is ignored, and nothing else - a real change in a JSON value, a text line, a file or
an exit code is caught. The whole harness runs two checkouts (minutes): see docs/benchmarks.md."""

from __future__ import annotations

import importlib.util
import sys

from .conftest import REPO

spec = importlib.util.spec_from_file_location("cli_compare", REPO / "benchmarks" / "cli_compare.py")
cmp = importlib.util.module_from_spec(spec)
sys.modules["cli_compare"] = cmp  # dataclasses look their module up
spec.loader.exec_module(cmp)


def run(files: dict | None = None, contents: dict | None = None, rc: int = 0, out: bytes = b"x") -> dict:
    return {"rc": rc, "stdout": out, "stderr": b"", "files": files or {}, "contents": contents or {}}


def test_json_fields_the_old_runs_disagree_on_are_ignored_and_only_those():
    a, b = b'{"created": "1", "k": 1}', b'{"created": "2", "k": 1}'
    assert cmp.compare_bytes(a, b, b'{"created": "9", "k": 1}')[0] == "same"
    assert cmp.compare_bytes(a, b, b'{"created": "9", "k": 2}')[0] == "differs"
    assert cmp.compare_bytes(a, a, b'{"created": "1", "k": 1, "new": 0}')[0] == "differs"


def test_text_lines_the_old_runs_disagree_on_are_ignored_and_only_those():
    assert cmp.compare_bytes(b"a\nt=1\n", b"a\nt=2\n", b"a\nt=3\n")[0] == "same"
    assert cmp.compare_bytes(b"a\nt=1\n", b"a\nt=2\n", b"b\nt=3\n")[0] == "differs"
    assert cmp.compare_bytes(b"a\n", b"a\n", b"a \n")[0] == "differs"  # nothing else is normalised
    assert cmp.compare_bytes(b"a\n", b"a\nb\n", b"a\n")[0] == "same"
    assert cmp.compare_bytes(b"a\n", b"a\nb\n", b"c\n")[0] == "unstable"


def test_exit_codes_and_files_are_compared():
    d = {"tree": ["dir", ""]}
    assert cmp.compare_runs(run(d), run(d), run(d, rc=2))["rc"][0] == "differs"
    assert cmp.compare_runs(run(d), run(d), run({}))["tree"][0] == "differs"
    f = {**d, "tree/m.json": ["file", "1"]}
    assert cmp.compare_runs(run(f, {"tree/m.json": b'{"k": 1}'}), run(f, {"tree/m.json": b'{"k": 1}'}),
                            run(f, {"tree/m.json": b'{"k": 2}'}))["tree/m.json"][0] == "differs"


def test_paths_named_anew_each_run_are_counted_not_paired():
    t = {"tmp": ["dir", ""]}
    parts = cmp.compare_runs(run({**t, "tmp/tmpA": ["dir", ""]}), run({**t, "tmp/tmpB": ["dir", ""]}),
                             run({**t, "tmp/tmpC": ["dir", ""]}))
    assert {v[0] for v in parts.values()} == {"same"}
    two = cmp.compare_runs(run({**t, "tmp/tmpA": ["dir", ""]}), run({**t, "tmp/tmpB": ["dir", ""]}),
                           run({**t, "tmp/tmpC": ["dir", ""], "tmp/tmpD": ["dir", ""]}))
    assert "differs" in {v[0] for v in two.values()}
    extra = cmp.compare_runs(run(t), run(t), run({**t, "tmp/x.json": ["file", "0"]}, {"tmp/x.json": b"{}"}))
    assert "differs" in {v[0] for v in extra.values()}
