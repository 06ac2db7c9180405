"""The serving-command matrix: fi-autotune's plan against SGLang 0.5.23's and FlashInfer 0.7.2.post1's
own code (goldens in tests/data/sglang-0.5.23/matrix.json, recorded on CPU by tests/oracle/record.py;
commands and their public sources in tests/data/serving_matrix.json).

Per command: equal, or refused with one line naming the flag. Equal means, for the target worker
and (with speculative decoding) the draft worker: the autotune gate, the key string and key, the
rank files, every dummy pass (phase, batch, tokens per request), every tunable FlashInfer call
SGLang made (argument by argument) and FlashInfer's own keys for it (key by key). Re-record live
with ``FI_AUTOTUNE_SGLANG_PYTHON=... python tests/oracle/record.py matrix`` (tests/oracle/README.md).
"""

from __future__ import annotations

import json

import pytest

from ..support.sglang_golden import DATA, REPO, compare_call, compare_keys, matching_op, ops_of, our_plan, worker_diffs

MATRIX = json.loads((REPO / "tests" / "data" / "serving_matrix.json").read_text())
GOLDEN = json.loads((DATA / "matrix.json").read_text())["cases"] if (DATA / "matrix.json").is_file() else {}


def _worker_plans(plan: dict) -> dict:
    return {"target": plan, "draft": plan.get("draft")}


def diff_case(golden: dict, tmp_path) -> tuple[str, list[str]]:
    """("equal" | "refused" | "rejected-both", differences)."""
    code, plan = our_plan(golden, tmp_path)
    if "error" in golden:
        # SGLang refuses the command; so must we (with one line), not plan something.
        return ("rejected-both", []) if code != 0 else ("equal", [f"SGLang rejects it ({golden['error'][:120]}) "
                                                                 "but fi-autotune plans it"])
    if code != 0:
        line = str(plan).strip().splitlines()[-1] if str(plan).strip() else ""
        return "refused", ([] if "--" in line else [f"refused without naming a flag: {line}"])
    ours = _worker_plans(plan)
    diffs = worker_diffs(golden, plan, gate="resolution")
    calls = golden.get("calls") or []
    if golden.get("call_errors"):
        diffs.append("the oracle could not record every call (re-record): "
                     + "; ".join(str(e.get("error"))[:120] for e in golden["call_errors"][:2]))
    # Every op fi-autotune tunes for a dummy pass is one SGLang calls (the draft's attention and
    # linear layers aside: the recorders build target models only).
    for worker, p in ours.items():
        if not p or golden.get(worker) is None:
            continue
        for op in ops_of(p):
            phases = op.get("phases") or [x["phase"] for x in p["resolution"]["passes"]]
            if "serving" in phases or (worker == "draft" and not op["id"].startswith("moe.")):
                continue
            if not any(c["worker"] == worker and matching_op(p, c) is op for c in calls):
                diffs.append(f"{worker}: fi-autotune tunes {op['id']} ({op['api'].rsplit('.', 1)[-1]}), "
                             "which SGLang's passes never call")
    keys = {k["call"]: k for k in golden.get("flashinfer_keys") or [] if "call" in k}
    for i, call in enumerate(calls):
        plan_w = ours.get(call["worker"])
        op = matching_op(plan_w, call) if plan_w else None
        where = f"{call['worker']} {call['phase']} {call['api'].rsplit('.', 1)[-1]}"
        if op is None:
            diffs.append(f"{where}: SGLang makes this tunable call; fi-autotune plans none")
            continue
        diffs += [f"{where}: {d}" for d in compare_call(call, op)]
        if i in keys and not keys[i].get("error"):
            diffs += [f"{where}: key {d}" for d in compare_keys(op, keys[i])]
    return "equal", diffs


CASES = [c["id"] for c in MATRIX if c["id"] in GOLDEN and "oracle_error" not in GOLDEN[c["id"]]]


@pytest.mark.skipif(not GOLDEN, reason="no goldens recorded")
@pytest.mark.parametrize("case_id", CASES)
def test_matrix_case_matches_sglang(case_id, tmp_path):
    outcome, diffs = diff_case(GOLDEN[case_id], tmp_path)
    assert not diffs, f"{case_id} ({outcome}):\n  " + "\n  ".join(diffs)


def test_the_matrix_is_big_enough_and_sourced():
    """At least 30 real commands with public sources, and a golden for every one."""
    public = [c for c in MATRIX if c["source"].startswith("http")]
    assert len(public) >= 30
    assert all(c["id"] in GOLDEN for c in MATRIX), sorted(c["id"] for c in MATRIX if c["id"] not in GOLDEN)


def test_docs_show_the_current_matrix():
    """docs/plan.md's matrix table is what tests/oracle/matrix_doc.py makes of the goldens now (in
    this process: the comparison is this module's own, and its imports are paid already)."""
    from tests.oracle import matrix_doc

    doc, new = matrix_doc.current()
    assert new == doc, "docs/plan.md: the matrix table is stale; run tests/oracle/matrix_doc.py"
