"""Write the serving-command matrix table into docs/plan.md (between the matrix markers).

    .venv/bin/python tests/oracle/matrix_doc.py [--check]

One row per command of tests/data/serving_matrix.json: what SGLang 0.5.23 decided (from the
goldens) and what fi-autotune's plan did with it (tests/engines/test_sglang_oracle.py's own comparison).
``--check`` exits 1 when the docs are stale instead of writing them (CI runs the same check).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "plan.md"
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"


def _flags(command: str) -> str:
    """The command from its model path on (launcher and host/port noise dropped)."""
    words = command.split()
    start = next((i for i, w in enumerate(words) if w.startswith("--model")), 0)
    env = [w for w in words[:start] if "=" in w and not w.startswith("-")]
    return " ".join(env + words[start:])


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table() -> str:
    sys.path.insert(0, str(REPO))
    from tests.engines.test_sglang_oracle import GOLDEN, MATRIX, diff_case

    rows = ["| case | GPU | serving command | SGLang 0.5.23 | fi-autotune | source |", "|---|---|---|---|---|---|"]
    tally = {"equal": 0, "refused": 0, "not recorded": 0, "other": 0}
    n_calls = n_keys = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in MATRIX:
            golden = GOLDEN.get(case["id"])
            if golden is None:
                sglang, ours = "not recorded", "-"
            elif "error" in golden:
                sglang = "refuses: " + golden["error"][:90]
                ours = diff_case(golden, Path(tmp))[0]
            elif "oracle_error" in golden:
                sglang, ours = "not recorded: " + golden["oracle_error"][:100], "-"
            else:
                t, d = golden["target"], golden.get("draft")
                sglang = f"autotunes, key `{t['key']}`" if t["should_run"] else f"no autotune (key `{t['key']}`)"
                if d is not None:
                    sglang += f"; draft {'autotunes' if d['should_run'] else 'no autotune'}, key `{d['key']}`"
                calls = len(golden.get("calls") or [])
                if calls:
                    sglang += f"; {calls} tunable calls"
                status, diffs = diff_case(golden, Path(tmp))
                ours = "equal" if status == "equal" and not diffs else status
                if status == "refused":
                    from tests.support.sglang_golden import our_plan

                    line = str(our_plan(golden, Path(tmp))[1]).strip().splitlines()[-1]
                    ours = "refused: " + line.removeprefix("fi-autotune: error: ")[:140]
                elif diffs:
                    ours = "DIFFERS: " + diffs[0][:140]
            bucket = ours.split(":")[0] if ours != "-" else "not recorded"
            tally[bucket if bucket in tally else "other"] += 1
            if golden is not None and ours == "equal":
                n_calls += len(golden.get("calls") or [])
                n_keys += sum(len(k.get("candidates") or []) for c in golden.get("flashinfer_keys") or []
                            for k in c.get("keys", []))
            source = case["source"]
            link = source.split()[0]
            source = f"[{link.split('//', 1)[-1][:48]}]({link})" if link.startswith("http") else source
            rows.append("| " + " | ".join(_cell(x) for x in (case["id"], case["gpu"], f"`{_flags(case['command'])}`",
                                                            sglang, ours, source)) + " |")
    public = sum(1 for c in MATRIX if c["source"].startswith("http"))
    summary = (f"{len(MATRIX)} commands ({public} from public sources): {tally['equal']} equal ({n_calls} tunable "
               f"FlashInfer calls compared argument by argument, {n_keys} FlashInfer keys key by key), "
               f"{tally['refused']} refused naming the flag, {tally['not recorded']} not recorded"
               + (f", {tally['other']} other" if tally["other"] else "") + ".")
    return summary + "\n\n" + "\n".join(rows)


def current() -> tuple[str, str]:
    """docs/plan.md as it is, and as it would be with the matrix table made now."""
    doc = DOC.read_text()
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return doc, f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main() -> int:
    doc, new = current()
    if "--check" in sys.argv:
        if new != doc:
            print("docs/plan.md: the matrix table is stale; run tests/oracle/matrix_doc.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
