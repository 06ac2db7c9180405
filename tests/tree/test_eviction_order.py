"""Issue 45: one eviction order for every budget (``prune --max-size``, ``--keep-latest`` and
their mix): what no engine of this environment can read goes first (corrupt, diverged, other
FlashInfer versions, other archs, then stale), the installed version's complete entries last, by
last use within a class. Real processes, real trees of two versions."""

from __future__ import annotations

import json
import os

import jsonschema
import time
from importlib.metadata import version

from devtools.synthetic import DEFAULT_METADATA, default_fields, entry_path, write_fake_entry

from ..conftest import REPO, run_cli, run_json

INSTALLED = version("flashinfer-python")  # what the engine of this environment reads


def _use(root, eid, days_ago: float, written_days_ago: float = 30) -> None:
    now = time.time()
    for p in entry_path(root, eid).iterdir():
        os.utime(p, (now - days_ago * 86400, now - written_days_ago * 86400))


def _valid(plan: dict) -> dict:
    jsonschema.validate(plan, json.loads((REPO / "docs/schemas/prune.schema.json").read_text()))
    return plan


def _sizes(root) -> dict[str, int]:
    return {e["id"]: e["size_on_disk"] for e in run_json("ls", "--cache-dir", str(root))["entries"]}


def test_max_size_evicts_another_version_before_the_installed_one_used_earlier(root):
    """The issue's case: an installed-version entry read 5 days ago, an 0.6.9 entry imported just
    now, room for one: the 0.6.9 entry goes, the one the engine reads stays."""
    here = write_fake_entry(root, fields=default_fields("A", tp=2, dp=1), flashinfer_version=INSTALLED, seed=1)
    old = write_fake_entry(root, fields=default_fields("B", tp=2, dp=1), flashinfer_version="0.6.9", seed=2)
    _use(root, here, 5)
    _use(root, old, 0.001, written_days_ago=0.001)
    sizes = _sizes(root)
    budget = max(sizes.values())
    plan = run_json("prune", "--max-size", f"{budget}B", "--dry-run", "--cache-dir", str(root))
    assert [e["id"] for e in plan["plan"]["entries"]] == [str(old)]
    proc = run_cli("prune", "--max-size", f"{budget}B", "-y", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert run_cli("ls", "-q", "--cache-dir", str(root)).stdout.split() == [str(here)]


def _env(tmp_path, version: str = "0.7.2.post1", arch: str | None = "sm100"):
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"fingerprint": {**DEFAULT_METADATA, "flashinfer_version": version}, "arch": arch}))
    return str(env)


def _truncate(root, eid):
    p = entry_path(root, eid) / "rank_tp0_pp0_dp0.json"
    p.write_bytes(p.read_bytes()[:100])


def _diverge(root, eid):
    p = entry_path(root, eid) / "rank_tp1_pp0_dp0.json"
    obj = json.loads(p.read_text())
    k = next(k for k in obj if not k.startswith("_"))
    obj[k][1] = 999
    p.write_text(json.dumps(obj, indent=2))


def _every_class(root):
    """One entry of each class, the first to go used most recently, so that only the class can
    put it first: corrupt, diverged, another version, another arch, stale, incomplete,
    unverified, then two complete entries of the version the engine reads."""
    f = lambda m: default_fields(m, tp=2, dp=1)  # noqa: E731
    made = {
        "corrupt": write_fake_entry(root, fields=f("A"), seed=1),
        "diverged": write_fake_entry(root, fields=f("B"), seed=2),
        "other version": write_fake_entry(root, fields=f("C"), flashinfer_version="0.6.9", seed=3),
        "other arch": write_fake_entry(root, fields=f("D"), arch="sm90", seed=4),
        "stale": write_fake_entry(root, fields=f("E"), metadata={"cuda_version": "12.8"}, seed=5),
        "incomplete": write_fake_entry(root, fields=f("F"), seed=6),
        "unverified": write_fake_entry(root, fields=f("G"), with_manifest=False, seed=7),
        "complete, used 10d ago": write_fake_entry(root, fields=f("H"), seed=8),
        "complete, used 1d ago": write_fake_entry(root, fields=f("I"), seed=9),
    }
    _truncate(root, made["corrupt"])
    _diverge(root, made["diverged"])
    (entry_path(root, made["incomplete"]) / "rank_tp1_pp0_dp0.json").unlink()
    for i, eid in enumerate(list(made.values())[:-2]):
        _use(root, eid, 0.05 * (i + 1))  # an hour or more apart: access times that read like use
    _use(root, made["complete, used 10d ago"], 10)
    _use(root, made["complete, used 1d ago"], 1)
    return made


def test_every_class_in_the_one_eviction_order_dry_run_and_real_run(root, tmp_path):
    made = _every_class(root)
    env = _env(tmp_path)
    statuses = {e["id"]: e["status"] for e in run_json("ls", "--env-from", env, "--cache-dir", str(root))["entries"]}
    assert [statuses[str(e)] for e in made.values()] == [
        "corrupt", "diverged", "stale", "complete", "stale", "incomplete", "unverified", "complete", "complete"]
    want = [str(e) for e in made.values()]
    cd = ["--env-from", env, "--cache-dir", str(root)]
    plan = _valid(run_json("prune", "--max-size", "1B", "--dry-run", *cd))
    rows = plan["plan"]["entries"]
    assert [e["id"] for e in rows] == want
    whys = [e["reasons"][-1] for e in rows]
    assert whys[0].startswith("corrupt: no engine can load it") and whys[1].startswith("diverged")
    assert whys[2].startswith("FlashInfer 0.6.9: the engine reads only 0.7.2.post1's directory (--env-from's)")
    assert whys[3].startswith("arch sm90: the serving GPU is sm100") and whys[4].startswith("stale")
    assert whys[7].startswith("complete (FlashInfer 0.7.2.post1, --env-from's)") and "the engine reads it" in whys[7]
    budget = plan["plan"]["budget"]
    assert budget["met"] and budget["evicts_read"] == want[-2:]
    assert "cannot be met without touching complete entries the engine reads" in budget["message"]
    human = run_cli("prune", "--max-size", "1B", "--dry-run", *cd)
    assert human.returncode == 0, human.stderr
    shown = [line.split()[0] for line in human.stdout.splitlines() if line.split() and line.split()[0] in want]
    assert shown == want  # the table lists the rows in eviction order
    assert "cannot be met without touching complete entries the engine reads" in human.stdout
    real = _valid(run_json("prune", "--max-size", "1B", "-y", *cd))
    assert real["result"]["deleted"] == want


def test_a_budget_never_reaches_what_the_engine_reads_while_anything_unread_remains(root, tmp_path):
    """Room for all but the unread entries: exactly those go, whatever their last use."""
    made = _every_class(root)
    sizes = _sizes(root)
    unread = [str(made[k]) for k in ("corrupt", "diverged", "other version", "other arch", "stale")]
    budget = sum(sizes.values()) - sum(sizes[i] for i in unread)
    cd = ["--env-from", _env(tmp_path), "--cache-dir", str(root)]
    plan = run_json("prune", "--max-size", f"{budget}B", "--dry-run", *cd)
    assert [e["id"] for e in plan["plan"]["entries"]] == unread
    assert plan["plan"]["budget"] == {"max_size": budget, "tree_size": sum(sizes.values()), "size_after": budget,
                                      "met": True, "evicts_read": [], "message": None}
    # one byte less: the incomplete entry (read, but tuned again at every start) goes next, not a complete one
    plan = run_json("prune", "--max-size", f"{budget - 1}B", "--dry-run", *cd)
    assert [e["id"] for e in plan["plan"]["entries"]] == unread + [str(made["incomplete"])]


def test_keep_latest_and_max_size_together_say_when_the_budget_cannot_be_met(root, tmp_path):
    """The issue's mix: --keep-latest keeps one entry per deployment, --max-size evicts only what
    it leaves; once that is gone, the plan says the budget cannot be met - never just
    "Nothing to delete." - and --json says it."""
    x_here = write_fake_entry(root, fields=default_fields("X", tp=2, dp=1), seed=1)
    x_old = write_fake_entry(root, fields=default_fields("X", tp=2, dp=1), flashinfer_version="0.6.9", seed=2)
    y_here = write_fake_entry(root, fields=default_fields("Y", tp=2, dp=1), seed=3)
    _use(root, x_here, 5)
    _use(root, x_old, 0.01)
    _use(root, y_here, 1)
    cd = ["--env-from", _env(tmp_path), "--cache-dir", str(root)]
    plan = run_json("prune", "--keep-latest", "1", "--max-size", "1B", "--dry-run", *cd)
    (row,) = plan["plan"]["entries"]
    assert row["id"] == str(x_old) and f"kept: {x_here}" in " ".join(row["reasons"])
    assert row["reasons"][-1].startswith("FlashInfer 0.6.9: the engine reads only 0.7.2.post1's directory")
    assert plan["plan"]["budget"]["met"] is False and "kept by --keep-latest" in plan["plan"]["budget"]["message"]
    proc = run_cli("prune", "--keep-latest", "1", "--max-size", "1B", "-y", *cd)
    assert proc.returncode == 0, proc.stderr
    assert "--max-size 1B cannot be met: the tree stays" in proc.stdout, proc.stdout
    # Nothing left beyond the latest: the budget still cannot be met, and the plan says so.
    human = run_cli("prune", "--keep-latest", "1", "--max-size", "1B", "--dry-run", *cd)
    assert human.returncode == 0, human.stderr
    assert "Nothing to delete." not in human.stdout and "cannot be met" in human.stdout, human.stdout
    assert "complete entries the engine reads" in human.stdout
    plan = _valid(run_json("prune", "--keep-latest", "1", "--max-size", "1B", "--dry-run", *cd))
    assert plan["plan"]["entries"] == [] and plan["plan"]["budget"]["met"] is False
    assert sorted(run_cli("ls", "-q", "--cache-dir", str(root)).stdout.split()) == sorted([str(x_here), str(y_here)])


def test_keep_latest_lists_its_rows_in_eviction_order_with_each_class(root, tmp_path):
    """--keep-latest alone: the same order and the same reasons. A corrupt entry under the
    version the engine reads is no "latest": a complete one of another version is kept over it."""
    f = default_fields("P", tp=2, dp=1)
    p_here = write_fake_entry(root, fields=f, seed=1)
    p_old = write_fake_entry(root, fields=f, flashinfer_version="0.6.9", seed=2)
    p_bad = write_fake_entry(root, fields=f, flashinfer_version="0.7.1", seed=3)
    _truncate(root, p_bad)
    g = default_fields("Q", tp=2, dp=1)
    q_bad_here = write_fake_entry(root, fields=g, seed=4)
    q_other = write_fake_entry(root, fields=g, flashinfer_version="0.7.1", seed=5)
    _truncate(root, q_bad_here)
    for i, eid in enumerate((p_here, p_old, p_bad, q_bad_here, q_other)):
        _use(root, eid, 1 + i)
    plan = run_json("prune", "--keep-latest", "1", "--dry-run", "--env-from", _env(tmp_path), "--cache-dir", str(root))
    rows = plan["plan"]["entries"]
    # both corrupt entries first (the least recently used of them first), then the other version
    assert [e["id"] for e in rows] == [str(q_bad_here), str(p_bad), str(p_old)]
    assert rows[0]["reasons"][0].startswith("corrupt") and f"kept: {q_other}" in rows[0]["reasons"][-1]
    assert rows[2]["reasons"][0].startswith("FlashInfer 0.6.9") and f"kept: {p_here}" in rows[2]["reasons"][-1]


def test_a_version_in_use_that_cannot_be_known_is_said_and_never_guessed(root, tmp_path):
    """--env-from a capture whose FlashInfer version is unknown: no entry is called another
    version's; the budget goes by last use across versions, and a note says why."""
    here = write_fake_entry(root, fields=default_fields("A", tp=2, dp=1), seed=1)
    old = write_fake_entry(root, fields=default_fields("B", tp=2, dp=1), flashinfer_version="0.6.9", seed=2)
    _use(root, here, 5)
    _use(root, old, 0.01)
    budget = max(_sizes(root).values())
    env = _env(tmp_path, version="unknown", arch=None)
    proc = run_cli("prune", "--max-size", f"{budget}B", "--dry-run", "--json", "--env-from", env, "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)["plan"]
    assert [e["id"] for e in plan["entries"]] == [str(here)]
    assert plan["entries"][0]["reasons"][-1].startswith(
        "complete (the FlashInfer version in use unknown): the engine may read it; in its class, least recently used")
    assert any("FlashInfer version the engine runs is unknown" in n for n in plan["notes"])
    assert "FlashInfer version the engine runs is unknown" in proc.stderr
