"""Every SGLang 0.5.23 server flag, tried against base serving commands: does it reach the autotune path?

    $FI_AUTOTUNE_SGLANG_PYTHON tests/oracle/sglang_flags.py BASE.json > PROBES.json

BASE.json is one case as ``sglang_case.py`` takes it. For each flag of SGLang's own argument
parser (``ServerArgs.add_cli_args``) the base command is resolved again with the flag added, once
per probe value (a store-true flag set; every other choice of a choices flag; a few numbers for a
numeric one; a string where one is free), each in a forked child of a process that imported
SGLang once (so one probe cannot leak state into the next), and ``sglang_case.evaluate`` is run
on it. The output keeps, per probe, SGLang's rejection or the whole evaluation (the full resolved
arguments and what the autotune path computed), and the parser's facts about every flag
(spellings, whether it takes a value). ``record.py`` compares each probe with its base on what
the autotune path reads and decides which flags are proven not to matter.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_case  # noqa: E402
import sglang_env as E  # noqa: E402

#: Flags whose probe is meaningless or harmful in a resolution-only run: the model and the config
#: file the probes are built from, and --help.
NOT_PROBED = {"help", "model_path", "config"}
#: Probe values for flags whose generic probe would be refused for a reason unrelated to them.
SPECIAL = {
    "log_level": [["--log-level", "warning"], ["--log-level", "debug"]],
    "speculative_algorithm": [["--speculative-algorithm", "EAGLE"], ["--speculative-algorithm", "NEXTN"],
                              ["--speculative-algorithm", "NGRAM"]],
    "json_model_override_args": [["--json-model-override-args", "{}"]],
    "chat_template": [],
}
INT_PROBES = {None: ("64", "4096"), 0: ("1", "64")}


def parser_facts(parser: argparse.ArgumentParser) -> list[dict]:
    out = []
    for a in parser._actions:
        if not a.option_strings or a.dest == "help":
            continue
        takes = {0: 0, None: 1, "?": "?", "+": "+", "*": "*"}.get(a.nargs, a.nargs)
        if type(a).__name__ in ("DeprecatedStoreConstAction",):
            takes = 0 if a.nargs == 0 else takes
        default = a.default if isinstance(a.default, (str, int, float, bool, list, type(None))) else repr(a.default)
        out.append({
            "dest": a.dest, "options": list(a.option_strings), "takes": takes,
            "action": type(a).__name__, "type": getattr(a.type, "__name__", None) if a.type else None,
            "choices": [str(c) for c in a.choices] if a.choices is not None else None, "default": default,
        })
    return out


def probes(fact: dict) -> list[list[str]]:
    """The argv fragments that try one flag."""
    opt = next((o for o in fact["options"] if o.startswith("--")), fact["options"][0])
    if fact["dest"] in NOT_PROBED:
        return []
    if fact["dest"] in SPECIAL:
        return SPECIAL[fact["dest"]]
    if fact["takes"] == 0:
        if fact["action"] == "BooleanOptionalAction":
            no = next((o for o in fact["options"] if o.startswith("--no-")), None)
            yes = next(o for o in fact["options"] if not o.startswith("--no-"))
            return [[no]] if fact["default"] and no else [[yes]]
        return [[opt]]
    default = fact["default"]
    if fact["choices"]:
        return [[opt, c] for c in fact["choices"] if str(c) != str(default)][:16]
    kind = fact["type"]
    if kind == "int" or kind == "human_readable_int":
        if isinstance(default, int) and not isinstance(default, bool) and default > 0:
            values = (str(default * 2), str(max(1, default // 2)))
        else:
            values = INT_PROBES.get(default, ("64", "4096"))
        return [[opt, v] for v in values]
    if kind == "float":
        if isinstance(default, (int, float)) and not isinstance(default, bool) and default:
            return [[opt, str(default * 0.5)]]
        return [[opt, "0.5"]]
    if kind in (None, "str", "nullable_str"):
        return [[opt, "fi-autotune-probe"]]
    return []  # JSON and other structured values: not probed (reported as not understood)


def run_child(case: dict) -> dict:
    """Evaluate in a forked child; the parent's state stays as it was."""
    return E.in_child(sglang_case.evaluate, case, failed={"id": case["id"]})


def main() -> None:
    base = json.loads(Path(sys.argv[1]).read_text())
    only = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else None
    E.boot(base["arch"], base.get("gpus", 8))
    E.materialize_models(base.get("models", {}))
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    facts = parser_facts(parser)
    # Import what evaluate() imports once, before forking.
    sglang_case.evaluate(dict(base, id="warm-up"))
    out = {"base": run_child(base), "facts": facts, "probes": []}
    for fact in facts:
        if only and fact["dest"] not in only:
            continue
        for fragment in probes(fact):
            res = run_child(dict(base, id=f"{fact['dest']}={' '.join(fragment[1:])}", argv=base["argv"] + fragment))
            res.pop("resolved_full", None)
            out["probes"].append({"dest": fact["dest"], "argv": fragment, "result": res})
            print(f"{fact['dest']} {' '.join(fragment)}: {'rejected' if 'error' in res else 'ok'}", file=sys.stderr,
                  flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
