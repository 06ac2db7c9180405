"""From the flag probes to the flag table fi-autotune ships (autotune_cache/engines/sglang/data/sglang-0.5.23-flags.json).

Each probe (a base command with one flag added, resolved and evaluated by SGLang's own code) is
compared with its base:

- ``differs``: what the autotune path decides changed (the gate, key string, rank files, dummy
  passes, extend tokens, a recorded FlashInfer call);
- ``reaches``: none of that changed, but a resolved argument the autotune path reads did
  (``reads``: every config leaf read while the path ran, over all probes) - it may matter for
  another model;
- ``same``: neither;
- ``rejected``: SGLang refused the combination (no evidence either way).

A flag's effect is ``matters`` if any probe differs, else ``reaches`` if any probe reaches, else
``none`` if at least one probe ran and every probe that ran was the same, else ``unknown``.
fi-autotune reads ``modelled`` flags itself (``MODELLED`` in autotune_cache/engines/sglang/serving_command.py), whatever the probes say.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from reduce import autotune_view  # noqa: E402


def leaves(raw_base: dict) -> set[str]:
    reads = set(raw_base["base"].get("reads", []))
    for p in raw_base["probes"]:
        reads |= set(p["result"].get("reads", []))
    return {r.rsplit(".", 1)[1] for r in reads}


def diff(a, b, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += diff(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        return out
    return [] if a == b else [path]


def outcome(probe: dict, base_view: dict, base_resolved: dict, read: set[str]) -> dict:
    from autotune_cache.engines.sglang.serving_command import MODELLED

    r = probe["result"]
    out = {"dest": probe["dest"], "argv": probe["argv"]}
    if probe["dest"] in MODELLED and "error" not in r and "oracle_error" not in r:
        # A modelled flag's probe is one more command fi-autotune's plan must get right.
        out["view"] = autotune_view(r)
    if "error" in r:
        return out | {"outcome": "rejected", "error": r["error"][:200]}
    if "oracle_error" in r:
        return out | {"outcome": "oracle_error", "error": str(r["oracle_error"])[:200]}
    view = autotune_view(r)
    changed = diff(view, base_view)
    if changed:
        return out | {"outcome": "differs", "changed": changed[:12]}
    resolved = r.get("resolved", {})
    reached = [k for k in sorted(read) if k in resolved and resolved.get(k) != base_resolved.get(k)]
    if reached:
        return out | {"outcome": "reaches", "changed": reached[:12]}
    return out | {"outcome": "same"}


def classify(probes: dict) -> dict:
    """{dest: {"effect", "evidence"}} over every base."""
    from autotune_cache.engines.sglang.serving_command import MODELLED

    verdicts: dict[str, dict] = {}
    facts: dict[str, dict] = {}
    for name, entry in probes["bases"].items():
        raw = entry["raw"]
        read = leaves(raw)
        base_view = autotune_view(raw["base"])
        base_resolved = raw["base"].get("resolved", {})
        for f in raw["facts"]:
            facts.setdefault(f["dest"], f)
        entry["outcomes"] = [outcome(p, base_view, base_resolved, read) for p in raw["probes"]]
        for o in entry["outcomes"]:
            verdicts.setdefault(o["dest"], {"outcomes": []})["outcomes"].append(dict(o, base=name))
    table = {}
    for dest, f in sorted(facts.items()):
        outs = verdicts.get(dest, {"outcomes": []})["outcomes"]
        kinds = {o["outcome"] for o in outs}
        if dest in MODELLED:
            effect = "modelled"
        elif "differs" in kinds:
            effect = "matters"
        elif "reaches" in kinds:
            effect = "reaches"
        elif "same" in kinds:
            effect = "none"
        else:
            effect = "unknown"
        shown = [o for o in outs if o["outcome"] in ("differs", "reaches")][:2] or \
            [o for o in outs if o["outcome"] == "same"][:1] or outs[:1]
        evidence = "; ".join(
            f"{' '.join(o['argv'])} on {o['base']}: {o['outcome']}"
            + (f" ({', '.join(o['changed'][:3])})" if o.get("changed") else "")
            + (f" ({o['error'][:80]})" if o.get("error") else "") for o in shown)
        ran = sum(1 for o in outs if o["outcome"] in ("same", "differs", "reaches"))
        table[dest] = {"options": f["options"], "takes": f["takes"], "choices": f["choices"], "effect": effect,
                       "probes": len(outs), "ran": ran, "evidence": evidence or "not probed"}
    return table


#: SGLang's FlashInfer call sites and the code that sizes their passes (relative to sglang/srt):
#: a flag read here can change a call's arguments, which the probes (resolution only) do not see.
CALL_SITES = ("layers/moe/moe_runner/**/*.py", "layers/moe/fused_moe_triton/layer.py", "layers/moe/topk.py",
              "layers/moe/utils.py", "layers/quantization/*fp8*.py", "layers/quantization/*fp4*.py",
              "layers/quantization/*mxfp*.py", "layers/quantization/modelopt*.py", "layers/quantization/unquant.py",
              "layers/attention/trtllm_mla_backend.py", "layers/attention/dsa_backend.py",
              "layers/attention/cutedsl_mla_backend.py", "model_executor/runner/flashinfer_autotune.py",
              "model_executor/runner/base_runner.py", "model_executor/runner/eager_runner.py")


def call_site_reads(srt: Path) -> dict[str, str]:
    """{argument name: the first call-site file that reads it as ``.name``}."""
    import re

    texts = {}
    for pattern in CALL_SITES:
        for f in sorted(srt.glob(pattern)):
            texts[str(f.relative_to(srt))] = f.read_text(errors="ignore")
    found: dict[str, str] = {}
    for name in sorted({m for t in texts.values() for m in re.findall(r"\.([a-z][a-z0-9_]+)\b", t)}):
        found[name] = next(f for f, t in texts.items() if re.search(r"\." + name + r"\b", t))
    return found


def at_call_sites(table: dict, reads: dict[str, str]) -> dict:
    """A flag the probes found inert ("none") but that a FlashInfer call site reads is "reaches":
    never "ignored" on evidence that did not look at the calls."""
    for dest, entry in table.items():
        if entry["effect"] == "none" and dest in reads:
            entry["effect"] = "reaches"
            entry["evidence"] = f"read at SGLang's FlashInfer call site {reads[dest]}; " + entry["evidence"]
    return table


#: Where SGLang builds a model's experts: a flag added into an expert count there changes the experts
#: per rank (``num_experts=config.n_routed_experts + ep_num_redundant_experts``), which no base
#: command's probe shows (none of them builds such a layer under expert parallelism).
SHAPE_SITES = ("models/*.py", "model_executor/model_runner_components/*.py", "eplb/expert_location.py")


def shape_site_reads(srt: Path) -> dict[str, str]:
    """{argument name: the first file that adds it into an expert count}."""
    import re

    found: dict[str, str] = {}
    pattern = re.compile(r"(?:num_experts|n_routed_experts|num_local_experts|moe_num_experts)[^\n]*\+[^\n]*?\.([a-z][a-z0-9_]+)\b"
                         r"|\+\s*get_exec\(\)\.moe\.([a-z][a-z0-9_]+)")
    for site in SHAPE_SITES:
        for f in sorted(srt.glob(site)):
            for m in pattern.finditer(f.read_text(errors="ignore")):
                found.setdefault(m[1] or m[2], str(f.relative_to(srt)))
    return found


def at_shape_sites(table: dict, reads: dict[str, str]) -> dict:
    """A flag SGLang adds into an expert count where it builds a model is "matters" (refused), never
    "ignored" or merely "not understood": it changes the experts per rank of the MoE call."""
    for dest, entry in table.items():
        if entry["effect"] in ("none", "reaches") and dest in reads:
            entry["effect"] = "matters"
            entry["evidence"] = (f"SGLang adds it into the expert count where it builds the model ({reads[dest]}): the "
                                 "experts per rank change; " + entry["evidence"])
    return table


def write_flag_table(probes: dict, probes_path: Path, table_path: Path, srt: Path | None = None) -> None:
    table = classify(probes)
    if srt is not None:
        table = at_call_sites(table, call_site_reads(srt))
        table = at_shape_sites(table, shape_site_reads(srt))
    compact = {"bases": {name: {"arch": e["arch"], "command": e["command"], "outcomes": e["outcomes"],
                                "view": autotune_view(e["raw"]["base"])}
                         for name, e in probes["bases"].items()}}
    probes_path.parent.mkdir(parents=True, exist_ok=True)
    probes_path.write_text(json.dumps(compact, indent=1, sort_keys=True) + "\n")
    table_path.parent.mkdir(parents=True, exist_ok=True)
    table_path.write_text(json.dumps({"sglang": "0.5.23", "flags": table}, indent=1, sort_keys=True) + "\n")
