"""Every SGLang 0.5.23 flag, classified from SGLang's own code (tests/data/sglang-0.5.23/probes.json,
recorded by tests/oracle/record.py flags): what the parser does with each class, and fi-autotune's
plan against SGLang's resolution for every probe of a flag it models."""

from __future__ import annotations

import json
import re

import pytest

from autotune_cache.errors import UsageError
from autotune_cache.engines.sglang.dispatch import TABLE as DISPATCH
from autotune_cache.engines.sglang.serving_command import FLAG_TABLE, MODELLED, flag_table, parse_serving_command

from ..conftest import run_cli
from ..support.sglang_golden import DATA, our_plan, worker_diffs

TABLE = json.loads(FLAG_TABLE.read_text())["flags"]
PROBES = json.loads((DATA / "probes.json").read_text())["bases"] if (DATA / "probes.json").is_file() else {}


def test_the_table_is_sglangs_whole_parser_and_every_flag_has_a_class():
    assert len(TABLE) > 500  # SGLang 0.5.23's parser: 531 flags
    assert {f["effect"] for f in TABLE.values()} <= {"modelled", "none", "matters", "reaches", "unknown"}
    assert set(MODELLED) <= set(TABLE), sorted(set(MODELLED) - set(TABLE))
    for dest, f in TABLE.items():
        assert f["options"] and f["evidence"], dest
        if f["effect"] == "none":  # never "ignored" without a probe that ran and changed nothing
            assert f["ran"] >= 1 and ": same" in f["evidence"], dest


def _example(effect: str) -> tuple[str, list[str]]:
    """A flag of ``effect`` (not modelled) and an argv fragment that sets it."""
    for dest, f in sorted(TABLE.items()):
        if f["effect"] != effect or dest in MODELLED:
            continue
        opt = max(f["options"], key=len)
        if f["takes"] == 0:
            return dest, [opt]
        if f["choices"]:
            return dest, [opt, f["choices"][-1]]
        return dest, [opt, "1"]
    pytest.skip(f"no flag classified {effect}")


def test_a_flag_that_changes_the_tuning_is_refused_naming_it():
    dest, frag = _example("matters")
    cmd = parse_serving_command(["--model-path", "m", *frag])
    with pytest.raises(UsageError, match=frag[0]):
        cmd.check_refused()


@pytest.mark.parametrize("effect", ["reaches", "unknown"])
def test_a_flag_without_evidence_is_not_understood_never_ignored(effect):
    dest, frag = _example(effect)
    cmd = parse_serving_command(["--model-path", "m", *frag])
    assert not cmd.ignored and any(s.startswith(frag[0]) for s in cmd.not_understood)


def test_ignored_flags_are_the_ones_proven_not_to_matter():
    dest, frag = _example("none")
    cmd = parse_serving_command(["--model-path", "m", *frag])
    assert cmd.ignored == [" ".join(frag)] and not cmd.not_understood


def test_plan_warns_and_check_strict_misses_on_a_flag_not_understood(tmp_path):
    dest, frag = _example("reaches")
    serve = ["--", "python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "2",
             "--moe-runner-backend", "flashinfer_cutlass", *frag]
    proc = run_cli("plan", "--arch", "sm90", "--cache-dir", str(tmp_path), *serve)
    assert proc.returncode == 0 and f"not understood: {' '.join(frag)}" in proc.stderr
    strict = run_cli("check", "--strict", "--arch", "sm90", "--cache-dir", str(tmp_path), *serve)
    assert strict.returncode == 1 and "is not understood" in strict.stdout
    relaxed = run_cli("check", "--arch", "sm90", "--cache-dir", str(tmp_path), *serve)
    assert relaxed.stderr.count(f"not understood: {' '.join(frag)}") == 1  # a warning, once
    assert "is not understood" in json.loads(run_cli("check", "--json", "--arch", "sm90", "--cache-dir", str(tmp_path),
                                                    *serve).stdout)["workers"][0]["warnings"][-1]


def test_parsing_follows_sglangs_argparse():
    table = flag_table()
    assert table["--tp-size"].dest == "tp_size"
    cmd = parse_serving_command(["--model-path", "m", "--tp", "8", "--speculative-algo", "EAGLE"])
    assert cmd.values["tp_size"] == 8 and cmd.values["speculative_algorithm"] == "EAGLE"  # unique prefixes
    with pytest.raises(UsageError, match="has no flag --no-such-flag"):
        parse_serving_command(["--model-path", "m", "--no-such-flag"])
    with pytest.raises(UsageError, match="not one of SGLang's choices"):
        parse_serving_command(["--model-path", "m", "--kv-cache-dtype", "fp9"])
    assert parse_serving_command(["--model-path", "m", "--context-length", "32Ki"]).values["context_length"] == 32768


# --- fi-autotune's plan against SGLang's resolution, probe by probe ---------------------------

def _probe_cases():
    for base, entry in sorted(PROBES.items()):
        yield pytest.param(base, None, id=f"{base}:base")
        for o in entry["outcomes"]:
            if "view" in o or (o["dest"] in MODELLED and o["outcome"] == "rejected"):
                yield pytest.param(base, o, id=f"{base}:{' '.join(o['argv'])}")


#: SGLang startup refusals fi-autotune knowingly does not reproduce (it plans the command; SGLang
#: would stop before serving it), each with why. Any other refusal must be reproduced.
NOT_REPRODUCED = {
    # The probe's made-up path: SGLang reads the draft's config.json even without an algorithm;
    # fi-autotune reads a draft only for a speculative command.
    r"Unrecognized model in fi-autotune-probe": "a draft path that does not exist",
    # gpt-oss with one side of a split prefill/decode attention backend: SGLang's fill of the
    # other side lands outside gpt-oss's list; no attention op of gpt-oss is tunable either way.
    r"GptOssForCausalLM requires one of": "gpt-oss split attention backends",
}


def _failed_in_sglangs_own_dispatch(line: str) -> bool:
    """A refusal backed by SGLang's own MoE dispatch (engines/sglang/dispatch.py): the flag probes
    only resolve the arguments; the dispatch probe built the layer and ran it, and SGLang failed."""
    m = re.search(r"--(?:speculative-)?moe-runner-backend (\S+) with (\S+) experts on (sm\d+): "
                  r"SGLang 0.5.23 fails at startup", line)
    if not m:
        return False
    backend, kind, arch = m.groups()
    family = "sm100" if arch.startswith("sm10") else "sm90"
    return any((p["arch"], p["kind"], p["backend"]) == (family, kind, backend) and "error" in p
               for p in json.loads(DISPATCH.read_text())["probes"])


@pytest.mark.skipif(not PROBES, reason="no flag probes recorded")
@pytest.mark.parametrize("base,probe", list(_probe_cases()) if PROBES else [])
def test_probe_of_a_modelled_flag_matches_sglang(base, probe, tmp_path):
    entry = PROBES[base]
    argv = entry["command"].split() + (probe["argv"] if probe else [])
    golden = {"arch": entry["arch"], "argv": argv}
    code, plan = our_plan(golden, tmp_path)
    if probe is not None and probe["outcome"] == "rejected":
        if code == 0 and any(re.search(pattern, probe["error"]) for pattern in NOT_REPRODUCED):
            return
        assert code != 0, f"SGLang rejects it ({probe['error'][:150]}) but fi-autotune plans it"
        return
    if code != 0:
        # SGLang ran it: refusing is right only as "not modelled", naming the flag - never a
        # claim that SGLang refuses it.
        line = str(plan).strip().splitlines()[-1]
        assert "--" in line, f"refused without naming a flag: {line}"
        if _failed_in_sglangs_own_dispatch(line):  # its resolution ran; building the MoE layer fails
            return
        assert re.search(r"not model|does not model", line), f"SGLang runs it, but fi-autotune refuses it: {line}"
        return
    view = probe["view"] if probe else entry["view"]
    diffs = worker_diffs(view, plan, gate="resolution")
    assert not diffs, "\n".join(diffs)
