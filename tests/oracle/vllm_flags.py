"""Every ``vllm serve`` flag of vLLM 0.33, tried against base serving commands: does it reach the autotune path?

    $FI_AUTOTUNE_VLLM_PYTHON tests/oracle/vllm_flags.py BASE.json > PROBES.json

BASE.json: ``{"arch", "gpus", "models", "id", "argv"}``. The parser's facts come from ``vllm
serve``'s own parser (``vllm_env.serve_parser``: option strings, value count, type, choices,
default, and the api_server launcher's parser for comparison). Then, for each flag, the base
command is resolved again with the flag added, once per probe value (a boolean flag flipped; every
other choice of a choices flag; two numbers for a numeric one; a word where one is free; a JSON
value for the JSON flags in ``SPECIAL``), each in a forked child (``vllm_case.evaluate``: vLLM's
parser, ``create_engine_config`` and the worker's model construction). ``record_vllm.py``
compares each probe with its base on what the autotune path reads.

Also printed: every environment variable vLLM 0.33 reads (``vllm.envs.environment_variables``)
with its default, for the environment table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_case  # noqa: E402
import vllm_env as E  # noqa: E402

#: Flags whose probe is meaningless in a resolution-only run: the model and the YAML config the
#: probes are built from, help, and the positional.
NOT_PROBED = {"help", "model", "model_tag", "config"}
#: JSON flags, probed with values that exercise them (a generic JSON value means nothing).
SPECIAL = {
    "hf_overrides": [["--hf-overrides", '{"num_experts_per_tok": 4}'], ["--hf-overrides", '{"max_position_embeddings": 8192}']],
    "speculative_config": [["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}']],
    "compilation_config": [["--compilation-config", '{"mode": 0}'], ["--compilation-config", '{"cudagraph_mode": "NONE"}'],
                           ["--compilation-config", '{"max_cudagraph_capture_size": 64}']],
    "kernel_config": [["--kernel-config", '{"enable_flashinfer_autotune": false}'],
                      ["--kernel-config", '{"moe_backend": "flashinfer_cutlass"}']],
    "pass_config": [["--pass-config", '{"fuse_allreduce_rms": false}']],
    "attention_config": [["--attention-config", '{"backend": "FLASHINFER"}']],
    "override_generation_config": [["--override-generation-config", '{"temperature": 0.5}']],
    "limit_mm_per_prompt": [["--limit-mm-per-prompt", '{"image": 0}']],
    "mm_processor_kwargs": [["--mm-processor-kwargs", '{"a": 1}']],
    "served_model_name": [["--served-model-name", "probe-name"]],
    "optimization_level": [["--optimization-level", "0"], ["--optimization-level", "3"]],
    "enable_flashinfer_autotune": [["--enable-flashinfer-autotune"], ["--disable-flashinfer-autotune"]],
    "kv_cache_dtype": [["--kv-cache-dtype", "fp8"], ["--kv-cache-dtype", "fp8_e4m3"]],
    "attention_backend": [["--attention-backend", "FLASHINFER"], ["--attention-backend", "FLASH_ATTN"]],
    "tokenizer": [["--tokenizer", "Qwen/Qwen3-30B-A3B"]],
    "spec_method": [["--spec-method", "ngram", "--spec-tokens", "3"]],
    "spec_tokens": [["--spec-method", "ngram", "--spec-tokens", "3"]],
    "allowed_origins": [["--allowed-origins", '["*"]']],
    "allowed_methods": [["--allowed-methods", '["GET"]']],
    "allowed_headers": [["--allowed-headers", '["*"]']],
    "default_chat_template_kwargs": [["--default-chat-template-kwargs", '{"enable_thinking": false}']],
    "reasoning_effort_map": [["--reasoning-effort-map", '{}']],
    "additional_config": [["--additional-config", '{"fi_autotune_probe": 1}']],
    "model_loader_extra_config": [["--model-loader-extra-config", '{}']],
    "structured_outputs_config": [["--structured-outputs-config", '{"backend": "xgrammar"}']],
    "eplb_config": [["--eplb-config", '{"window_size": 2000}']],
    "log_config_file": [],
    "chat_template": [],
    "lora_modules": [],
}
INT_PROBES = {None: ("64", "4096"), 0: ("1", "64"), -1: ("1", "64")}


def type_name(t) -> str | None:
    """The value type argparse converts with, seen through vLLM's ``optional_type`` wrapper."""
    if t is None:
        return None
    name = getattr(t, "__name__", type(t).__name__)
    if name == "_optional_type" and t.__closure__:
        inner = t.__closure__[0].cell_contents
        return "optional:" + getattr(inner, "__name__", str(inner))
    return name


def parser_facts(parser) -> list[dict]:
    """Each action: its visible option strings, every spelling the parser accepts for it (vLLM's
    ``EnableDisableAction`` registers hidden ``--no-enable-x`` ones), the spellings that set a
    boolean False, its value count, type, choices and default."""
    spellings: dict[int, list[str]] = {}
    for option, action in parser._option_string_actions.items():
        spellings.setdefault(id(action), []).append(option)
    out = []
    for a in parser._actions:
        if a.dest in ("help", "subparser"):
            continue
        takes = {0: 0, None: 1, "?": "?", "+": "+", "*": "*"}.get(a.nargs, a.nargs)
        default = a.default if isinstance(a.default, (str, int, float, bool, type(None))) else repr(a.default)[:200]
        out.append({
            "dest": a.dest, "options": list(a.option_strings), "takes": takes, "action": type(a).__name__,
            "type": type_name(a.type), "choices": [str(c) for c in a.choices] if a.choices is not None else None,
            "default": default, "positional": not a.option_strings,
            "accepted": sorted(spellings.get(id(a), [])),
            "negative": sorted(getattr(a, "negative_option_strings", ()) or ()),
        })
    return out


def probes(fact: dict) -> list[list[str]]:
    """The argv fragments that try one flag."""
    if fact["positional"] or fact["dest"] in NOT_PROBED:
        return []
    if fact["dest"] in SPECIAL:
        return SPECIAL[fact["dest"]]
    longs = [o for o in fact["options"] if o.startswith("--")]
    opt = longs[0] if longs else fact["options"][0]
    if fact["takes"] == 0:
        off = [o for o in fact["options"] if o in fact.get("negative", ())]
        on = [o for o in fact["options"] if o not in off]
        if fact["default"] is None:  # unset: either way is a change
            return [on[:1], off[:1]] if off else [on[:1]]
        return [off[:1]] if fact["default"] and off else [on[:1]] if on else []
    default = fact["default"]
    if fact["choices"]:
        return [[opt, c] for c in fact["choices"] if str(c) != str(default)][:24]
    kind = (fact["type"] or "str").removeprefix("optional:")
    if kind in ("int", "human_readable_int", "human_readable_int_or_auto"):
        if isinstance(default, int) and not isinstance(default, bool) and default > 0:
            values = (str(default * 2), str(max(1, default // 2)))
        else:
            values = INT_PROBES.get(default, ("64", "4096"))
        # a probe at the default changes nothing and proves nothing
        return [[opt, v] for v in dict.fromkeys(values) if v != str(default)]
    if kind == "float":
        if isinstance(default, (int, float)) and not isinstance(default, bool) and default:
            return [[opt, str(default * 0.5)]]
        return [[opt, "0.5"]]
    if kind in ("str", "parse_reasoning_parser"):
        return [[opt, "fi-autotune-probe"]]
    return []  # JSON and other structured values without a SPECIAL probe: not probed


def main() -> None:
    base = json.loads(Path(sys.argv[1]).read_text())
    only = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else None
    result = E.claim_stdout()
    E.boot(base["arch"], base.get("gpus", 8))
    E.materialize_models(base.get("models", {}))
    import vllm.envs as envs

    facts = parser_facts(E.serve_parser("vllm serve")._subparsers._group_actions[0].choices["serve"])
    api_facts = {f["dest"] for f in parser_facts(E.serve_parser("python -m vllm.entrypoints.openai.api_server"))}
    for f in facts:
        f["api_server"] = f["dest"] in api_facts
    environment = {name: None for name in envs.environment_variables}
    vllm_case.evaluate(dict(base, id="warm-up"))  # import and warm vLLM once, before forking
    out = {"base": E.in_child(vllm_case.evaluate, dict(base, id="base"), failed={"id": "base"}), "facts": facts,
           "environment": sorted(environment), "probes": []}
    for fact in facts:
        if only and fact["dest"] not in only:
            continue
        for fragment in probes(fact):
            case = dict(base, id=f"{fact['dest']}={' '.join(fragment[1:])}", argv=base["argv"] + fragment)
            res = E.in_child(vllm_case.evaluate, case, failed={"id": case["id"]})
            out["probes"].append({"dest": fact["dest"], "argv": fragment, "result": res})
            print(f"{fact['dest']} {' '.join(fragment)}: {'rejected' if 'error' in res else 'ok'}", file=sys.stderr,
                  flush=True)
    print(json.dumps(out), file=result, flush=True)


if __name__ == "__main__":
    main()
