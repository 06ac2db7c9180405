"""Re-record what vLLM 0.33's own code says, for the tables fi-autotune ships and the goldens CI reads.

    FI_AUTOTUNE_VLLM_PYTHON=/work/vllm-oracle/bin/python python tests/oracle/record_vllm.py flags     # ~15 min
    FI_AUTOTUNE_VLLM_PYTHON=... python tests/oracle/record_vllm.py env                                  # ~5 min
    FI_AUTOTUNE_VLLM_PYTHON=... python tests/oracle/record_vllm.py dispatch [sm90|sm100] [KIND ...]    # ~25 min
    FI_AUTOTUNE_VLLM_PYTHON=... python tests/oracle/record_vllm.py matrix [ID ...]                      # ~3 min
    python tests/oracle/record_vllm.py reclassify     # the flag table again from flag-probes.json.gz (no vLLM)

``flags``: every ``vllm serve`` flag against ``BASES`` (``vllm_flags.py``), classified against its
base on what the autotune pass reads, into ``autotune_cache/engines/vllm/data/vllm-0.33.0-flags.json``.
``env``: every variable ``vllm.envs`` reads, set against the first base, the same way, into the
same table's ``environment`` part. ``dispatch``: each kind of expert weights x ``--moe-backend``
x parallel layout, the quant method and experts kernel vLLM's own model construction gives the
MoE layers (``vllm_case.py``), into ``autotune_cache/engines/vllm/data/vllm-0.33.0-moe-dispatch.json``.
``matrix``: the serving commands of ``tests/data/vllm-0.33.0/commands.json`` resolved by vLLM
(``tests/data/vllm-0.33.0/matrix.json``), which ``tests/engines/test_vllm_servecmd.py`` holds
fi-autotune's reading of the same commands to.

Runs in any Python (it only starts the vLLM interpreter); the classification imports
``autotune_cache.engines.vllm.serving_command.MODELLED`` (this repository).
"""

from __future__ import annotations

import gzip
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

DATA = REPO / "tests" / "data" / "vllm-0.33.0"
TABLES = REPO / "autotune_cache" / "engines" / "vllm" / "data"
FLAG_TABLE = TABLES / "vllm-0.33.0-flags.json"
DISPATCH = TABLES / "vllm-0.33.0-moe-dispatch.json"
COMMANDS = DATA / "commands.json"
MATRIX = DATA / "matrix.json"

#: Base commands every flag is tried against (arch, the flags after ``vllm serve``).
BASES = {
    "qwen30-h100-tp2-cutlass": ("sm90", "Qwen/Qwen3-30B-A3B --tensor-parallel-size 2 --moe-backend flashinfer_cutlass"),
    "qwen30-h100-tp2-dp2-ep-cutlass": ("sm90", "Qwen/Qwen3-30B-A3B --tensor-parallel-size 2 --data-parallel-size 2 "
                                               "--enable-expert-parallel --moe-backend flashinfer_cutlass"),
    "qwen30-b200-tp2": ("sm100", "Qwen/Qwen3-30B-A3B --tensor-parallel-size 2"),
}
#: One checkpoint per kind of expert weights, and the MoE backends and layouts each is tried with.
DISPATCH_MODELS = {"Qwen/Qwen3-30B-A3B": "bf16", "Qwen/Qwen3-30B-A3B-FP8": "fp8_block",
                   "openai/gpt-oss-20b": "mxfp4", "nvidia/DeepSeek-R1-FP4": "modelopt_fp4",
                   # tests/data/configs (make_configs.py: a preset + the format's quantization_config)
                   "fi-autotune-derived/Qwen3-30B-A3B-FP8-tensor-static": "fp8_tensor",
                   "fi-autotune-derived/Qwen3-30B-A3B-FP8-tensor-dynamic": "fp8_tensor_dynamic",
                   "fi-autotune-derived/Qwen3-30B-A3B-ModelOpt-FP8": "modelopt_fp8",
                   "fi-autotune-derived/Qwen3-30B-A3B-CT-FP8-dynamic": "compressed_tensors_fp8",
                   "fi-autotune-derived/Qwen3-30B-A3B-CT-W4A16": "compressed_tensors_w4a16",
                   "fi-autotune-derived/Qwen3-30B-A3B-AWQ": "awq",
                   "fi-autotune-derived/Qwen3-30B-A3B-GPTQ-Int4": "gptq"}
DISPATCH_BACKENDS = ("auto", "triton", "flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_cutedsl", "cutlass",
                     "deep_gemm", "marlin")
#: The parallel layouts whose dispatch can differ: vLLM's backend selection reads the MoE's dp size
#: (``moe_parallel_config.dp_size > 1``), whether experts are split whole (``use_ep``) and the
#: activation format its all2all backend implies - not the widths themselves.
DISPATCH_LAYOUTS = {"tp1": "", "tp2": "--tensor-parallel-size 2",
                    "tp2-ep": "--tensor-parallel-size 2 --enable-expert-parallel",
                    "tp2-dp2": "--tensor-parallel-size 2 --data-parallel-size 2",
                    "tp2-dp2-ep": "--tensor-parallel-size 2 --data-parallel-size 2 --enable-expert-parallel"}


#: Failures of the oracle's environment, not vLLM's answer: a compiled kernel or a process-group
#: feature the stand-ins lack (vllm_env.py), a package the CPU venv lacks, the hub (no network), an
#: attention backend whose compiled extension is stood in for (MLA models: FlashMLA, FlashInfer MLA),
#: an operator the CPU build of torch lacks for the device a layer asks for.
ENVIRONMENT_ERRORS = ("KernelCalled", "stand-in", "ModuleNotFoundError", "ImportError", "LocalEntryNotFoundError",
                      "No valid attention backend found", "NotImplementedError: Could not run 'aten::")


def environment_error(error: str) -> bool:
    return any(marker in error for marker in ENVIRONMENT_ERRORS)


def oracle_python() -> str:
    exe = os.environ.get("FI_AUTOTUNE_VLLM_PYTHON")
    if not exe:
        sys.exit("set FI_AUTOTUNE_VLLM_PYTHON to a Python with vllm==0.33.0 (tests/oracle/README.md)")
    return exe


def run_oracle(script: str, payload: dict, *args: str, timeout: int = 7200) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(payload, f)
    try:
        proc = subprocess.run([oracle_python(), str(HERE / script), f.name, *args], capture_output=True, text=True,
                              timeout=timeout)
    finally:
        os.unlink(f.name)
    if proc.returncode != 0 or not proc.stdout.strip():
        sys.exit(f"{script}: {(proc.stderr.strip().splitlines() or ['no output'])[-1][:500]}")
    return json.loads(proc.stdout)


def models_for(served: list[str]) -> dict:
    from record import model_files  # the SGLang recorder's table of configs (tests/oracle/models.json)

    return {m: model_files(m) for m in served}


def served_models(argv: list[str]) -> list[str]:
    known = set(json.loads((HERE / "models.json").read_text())) - {"_doc"}
    configs = {p.name.removesuffix(".json").replace("--", "/") for p in (REPO / "tests" / "data" / "configs").glob("*.json")}
    return [a for a in argv if a in known or a in configs]


# --- what the autotune pass reads, compared -----------------------------------------------------------

#: View parts whose change changes what vLLM tunes (or whether it does, or where it keeps it).
TUNING = ("gate", "store", "parallel", "tokens", "skip_ops", "model", "kernel_config.moe_backend", "moe", "lora")
#: Parts the autotune pass reads that fi-autotune's plan does not tune (vLLM's linear and attention
#: kernels, tuned nowhere on the paths it models): a change there is "reaches", never "none".
REACHES = ("kernels", "kernel_config.linear_backend")


def _get(view: dict, path: str):
    for part in path.split("."):
        view = view.get(part) if isinstance(view, dict) else None
    return view


def outcome(probe: dict, base: dict) -> dict:
    r = probe["result"]
    out = {"dest": probe["dest"], "argv": probe["argv"]}
    if "error" in r and not environment_error(r["error"]):
        return out | {"outcome": "rejected", "error": r["error"][:200]}
    if "error" in r:
        return out | {"outcome": "oracle_error", "error": r["error"][:200]}
    if "oracle_error" in r:
        return out | {"outcome": "oracle_error", "error": str(r["oracle_error"])[:200]}
    view, bview = r["view"], base["view"]
    changed = [p for p in TUNING if _get(view, p) != _get(bview, p)]
    dir_changed = view["dir_hash"] != bview["dir_hash"]
    if changed:
        return out | {"outcome": "differs", "changed": changed, "dir": dir_changed}
    reached = [p for p in REACHES if _get(view, p) != _get(bview, p)]
    if reached:
        return out | {"outcome": "reaches", "changed": reached, "dir": dir_changed}
    return out | {"outcome": "same", "dir": dir_changed}


def classify(bases: dict, modelled: dict) -> dict:
    """{dest: {options, takes, choices, type, effect, evidence, dir, ...}} over every base."""
    facts: dict[str, dict] = {}
    outs: dict[str, list] = {}
    for name, entry in bases.items():
        raw = entry["raw"]
        for f in raw["facts"]:
            facts.setdefault(f["dest"], f)
        for p in raw["probes"]:
            outs.setdefault(p["dest"], []).append(dict(outcome(p, raw["base"]), base=name))
    table = {}
    for dest, f in sorted(facts.items()):
        os_ = outs.get(dest, [])
        kinds = {o["outcome"] for o in os_}
        effect = ("modelled" if dest in modelled else "matters" if "differs" in kinds else "reaches"
                  if "reaches" in kinds else "none" if "same" in kinds else "unknown")
        shown = [o for o in os_ if o["outcome"] in ("differs", "reaches")][:2] or \
            [o for o in os_ if o["outcome"] == "same"][:1] or os_[:1]
        evidence = "; ".join(
            f"{' '.join(o['argv'])} on {o['base']}: {o['outcome']}"
            + (f" ({', '.join(o['changed'][:3])})" if o.get("changed") else "")
            + (f" ({o['error'][:100]})" if o.get("error") else "") for o in shown)
        table[dest] = {"options": f["options"], "takes": f["takes"], "choices": f["choices"], "type": f["type"],
                       "default": f["default"], "positional": f["positional"], "api_server": f["api_server"],
                       "accepted": f["accepted"], "negative": f["negative"],
                       "effect": effect, "probes": len(os_),
                       "ran": sum(1 for o in os_ if o["outcome"] in ("same", "differs", "reaches")),
                       "dir": any(o.get("dir") for o in os_), "evidence": evidence or "not probed"}
    return table


def _base_payload(name: str) -> dict:
    return _base_payload_of(name, BASES)


def record_flags(only: list[str]) -> None:
    from autotune_cache.engines.vllm.serving_command import MODELLED

    probes_path = DATA / "flag-probes.json.gz"
    old = json.loads(gzip.decompress(probes_path.read_bytes())) if probes_path.is_file() else {"bases": {}}
    for name in BASES:
        if only and name not in only:
            continue
        raw = run_oracle("vllm_flags.py", _base_payload(name))
        old["bases"][name] = {"arch": BASES[name][0], "command": BASES[name][1], "raw": raw}
        print(f"{name}: {len(raw['probes'])} probes", file=sys.stderr)
    DATA.mkdir(parents=True, exist_ok=True)
    probes_path.write_bytes(gzip.compress((json.dumps(old, sort_keys=True) + "\n").encode(), mtime=0))
    write_flag_table(old, MODELLED)


def reclassify(_: list[str]) -> None:
    """The flag table again from the recorded probes (``flag-probes.json.gz``), no probing: after
    ``MODELLED`` or the classification changed."""
    from autotune_cache.engines.vllm.serving_command import MODELLED

    write_flag_table(json.loads(gzip.decompress((DATA / "flag-probes.json.gz").read_bytes())), MODELLED)


def write_flag_table(probes: dict, modelled: dict) -> None:
    table = json.loads(FLAG_TABLE.read_text()) if FLAG_TABLE.is_file() else {}
    first = next(iter(probes["bases"].values()))["raw"]
    table.update({"vllm": "0.33.0", "recorded_by": "tests/oracle/record_vllm.py flags",
                  "bases": {n: f"{b['arch']}: vllm serve {b['command']}" for n, b in probes["bases"].items()},
                  "flags": classify(probes["bases"], modelled)})
    table.setdefault("environment", {name: {"effect": "unknown", "evidence": "not probed"}
                                     for name in first["environment"]})
    TABLES.mkdir(parents=True, exist_ok=True)
    FLAG_TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


#: Probe values for the environment: most of vLLM's variables are switches (off by default) or numbers.
ENV_PROBES = ("1",)
#: The bases the environment is probed on: the flag bases, and one per kind of quantized experts
#: (a variable that picks an FP8, FP4 or INT4 kernel changes nothing on bf16 experts).
ENV_BASES = {**BASES,
             "qwen30fp8-h100-tp2": ("sm90", "Qwen/Qwen3-30B-A3B-FP8 --tensor-parallel-size 2"),
             "qwen30fp8-b200-tp2": ("sm100", "Qwen/Qwen3-30B-A3B-FP8 --tensor-parallel-size 2"),
             "gptoss20-h100-tp2": ("sm90", "openai/gpt-oss-20b --tensor-parallel-size 2"),
             "dsr1fp4-b200-tp4": ("sm100", "nvidia/DeepSeek-R1-FP4 --tensor-parallel-size 4"),
             "qwen30w4a16-h100-tp2": ("sm90", "fi-autotune-derived/Qwen3-30B-A3B-CT-W4A16 --tensor-parallel-size 2")}
#: Where vLLM's code decides what its autotune pass tunes: a variable read there (``envs.NAME``) that
#: no probe showed changing anything is at most "reaches", never "none" (another checkpoint may take
#: the branch it guards).
ENV_CALL_SITES = ("model_executor/layers/fused_moe", "model_executor/layers/quantization", "model_executor/warmup",
                  "model_executor/kernels", "utils/flashinfer.py")
#: Variables whose probe is meaningless or harmful here (paths of this run, logging, the oracle's own).
ENV_NOT_PROBED = {"VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "VLLM_LOGGING_LEVEL", "VLLM_NO_USAGE_STATS",
                  "VLLM_LOGGING_CONFIG_PATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "VLLM_TARGET_DEVICE",
                  "VLLM_PLUGINS", "VLLM_RPC_BASE_PATH", "VLLM_CONFIGURE_LOGGING", "VLLM_HOST_IP",
                  "VLLM_XLA_CACHE_PATH", "VLLM_ASSETS_CACHE", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"}
#: Variables probed with a value of their own.
ENV_SPECIAL = {"VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS": ("trtllm::fused_moe::gemm1", ""),
               "VLLM_ATTENTION_BACKEND": ("FLASHINFER",)}


def _base_payload_of(name: str, bases: dict) -> dict:
    arch, command = bases[name]
    argv = shlex.split(command)
    return {"arch": arch, "gpus": 8, "models": models_for(served_models(argv)), "id": name, "argv": argv}


def vllm_package() -> Path:
    """vllm/ of the oracle interpreter (found, not imported)."""
    out = subprocess.run([oracle_python(), "-c", "import importlib.util as u; "
                          "print(u.find_spec('vllm').submodule_search_locations[0])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def call_site_reads(names: list[str]) -> dict[str, str]:
    """Variable -> the first file under ``ENV_CALL_SITES`` that reads it as ``envs.NAME``."""
    import re

    root, found = vllm_package(), {}
    files = [f for site in ENV_CALL_SITES for f in sorted((root / site).rglob("*.py") if (root / site).is_dir()
                                                          else [root / site])]
    pattern = re.compile(r"envs\.(VLLM_[A-Z0-9_]+)|[\"'](VLLM_[A-Z0-9_]+)[\"']")
    wanted = set(names)
    for f in files:
        for m in pattern.finditer(f.read_text(errors="replace")):
            var = m[1] or m[2]
            if var in wanted and var not in found:
                found[var] = str(f.relative_to(root.parent))
    return found


def record_env(only: list[str]) -> None:
    from autotune_cache.engines.vllm.serving_command import ENV_MODELLED

    table = json.loads(FLAG_TABLE.read_text())
    names = sorted(table["environment"])
    outs: dict[str, list] = {}
    for base_name in ENV_BASES:
        if only and base_name not in only:
            continue
        base = _base_payload_of(base_name, ENV_BASES)
        cases = [dict(base, id="base", env={})]
        for var in names:
            if var in ENV_NOT_PROBED:
                continue
            for value in ENV_SPECIAL.get(var, ENV_PROBES):
                cases.append(dict(base, id=f"{var}={value}", env={var: value}))
        raw = run_oracle("vllm_case.py", {"arch": base["arch"], "gpus": 8, "models": base["models"], "cases": cases})
        results = {r["id"]: r for r in raw["results"]}
        for var in names:
            for v in ENV_SPECIAL.get(var, ENV_PROBES):
                if f"{var}={v}" in results:
                    o = outcome({"dest": var, "argv": [f"{var}={v}"], "result": results[f"{var}={v}"]}, results["base"])
                    outs.setdefault(var, []).append(dict(o, base=base_name))
        print(f"{base_name}: {len(cases)} cases", file=sys.stderr)
    reads = call_site_reads(names)
    env_table = {}
    for var in names:
        os_ = outs.get(var, [])
        kinds = {o["outcome"] for o in os_}
        effect = ("modelled" if var in ENV_MODELLED else "not probed" if var in ENV_NOT_PROBED else "matters"
                  if "differs" in kinds else "reaches" if "reaches" in kinds or (var in reads and "same" in kinds)
                  else "none" if "same" in kinds else "unknown")
        shown = [o for o in os_ if o["outcome"] in ("differs", "reaches")][:2] or os_[:1]
        evidence = "; ".join(f"{o['argv'][0]} on {o['base']}: {o['outcome']}"
                             + (f" ({', '.join(o['changed'][:3])})" if o.get("changed") else "")
                             + (f" ({o['error'][:100]})" if o.get("error") else "") for o in shown)
        if effect == "reaches" and var in reads and "reaches" not in kinds:
            evidence += f"; no probe changed anything, but {reads[var]} reads it"
        env_table[var] = {"effect": effect, "dir": any(o.get("dir") for o in os_),
                          "evidence": evidence or ("vLLM's path setting, read by fi-autotune itself"
                                                   if var in ENV_MODELLED else "not probed")}
    table["environment"] = env_table
    table["environment_bases"] = {n: f"{a}: vllm serve {c}" for n, (a, c) in ENV_BASES.items()}
    FLAG_TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


#: What a dispatch row keeps of each MoE layer kind (vllm_case.py records more).
DISPATCH_FIELDS = ("quant_method", "backend", "experts", "experts_module", "experts_local", "intermediate_per_partition",
                   "top_k", "tp", "ep", "dp", "use_ep", "moe_backend", "all2all")


def record_dispatch(only: list[str]) -> None:
    """vLLM's quant method, backend and experts kernel for each (arch, kind, --moe-backend, layout)."""
    archs = [a for a in ("sm90", "sm100") if not [o for o in only if o.startswith("sm")] or a in only]
    kinds = [k for k in DISPATCH_MODELS.values() if not [o for o in only if not o.startswith("sm")] or k in only]
    old = json.loads(DISPATCH.read_text())["probes"] if DISPATCH.is_file() else []
    probes = [p for p in old if p["arch"] not in archs or p["kind"] not in kinds]
    chosen = [m for m, k in DISPATCH_MODELS.items() if k in kinds]
    models = models_for(chosen)
    for arch in archs:
        cases = [{"id": f"{m}|{b}|{lay}", "argv": [m, *shlex.split(flags), "--moe-backend", b]}
                 for m in chosen for b in DISPATCH_BACKENDS for lay, flags in DISPATCH_LAYOUTS.items()]
        raw = run_oracle("vllm_case.py", {"arch": arch, "gpus": 8, "models": models, "cases": cases})
        for case, res in zip(cases, raw["results"]):
            model, backend, layout = case["id"].split("|")
            row = {"arch": arch, "model": model, "kind": DISPATCH_MODELS[model], "backend": backend, "layout": layout,
                   "command": shlex.join(case["argv"])}
            if "error" in res or "oracle_error" in res:
                error = res.get("error") or res["oracle_error"]
                row["oracle_error" if "oracle_error" in res or environment_error(error) else "error"] = error
            else:
                v = res["view"]
                row |= {"autotune": v["gate"]["enable_flashinfer_autotune"],
                        "moe": [{k: m[k] for k in DISPATCH_FIELDS if k in m} for m in v["moe"]["kinds"]],
                        "max_num_batched_tokens": v["tokens"]["max_num_batched_tokens"]}
            probes.append(row)
    probes.sort(key=lambda p: (p["arch"], p["kind"], p["backend"], p["layout"]))
    TABLES.mkdir(parents=True, exist_ok=True)
    DISPATCH.write_text(json.dumps({"vllm": "0.33.0", "recorded_by": "tests/oracle/record_vllm.py dispatch",
                                    "models": DISPATCH_MODELS, "layouts": DISPATCH_LAYOUTS, "probes": probes},
                                   indent=1, sort_keys=True) + "\n")


def record_matrix(only: list[str]) -> None:
    """Each command of commands.json ({id, arch, command, launcher?}) as vLLM resolves it."""
    commands = json.loads(COMMANDS.read_text())["commands"]
    chosen = [c for c in commands if not only or c["id"] in only]
    out = json.loads(MATRIX.read_text())["cases"] if MATRIX.is_file() else {}
    for arch in sorted({c["arch"] for c in chosen}):
        group = [c for c in chosen if c["arch"] == arch]
        cases, served = [], set()
        for c in group:
            env, launcher, argv = split_command(c["command"])
            served |= set(served_models(argv))
            cases.append({"id": c["id"], "argv": argv, "env": env, "launcher": launcher})
        raw = run_oracle("vllm_case.py", {"arch": arch, "gpus": 8, "models": models_for(sorted(served)),
                                          "cases": cases})
        for c, res in zip(group, raw["results"]):
            out[c["id"]] = {"arch": arch, "command": c["command"], **{k: v for k, v in res.items() if k != "id"}}
            print(f"{c['id']}: {'error ' + res['error'][:80] if 'error' in res else 'ok'}", file=sys.stderr)
    MATRIX.write_text(json.dumps({"vllm": "0.33.0", "recorded_by": "tests/oracle/record_vllm.py matrix",
                                  "cases": dict(sorted(out.items()))}, indent=1, sort_keys=True) + "\n")


def split_command(command: str) -> tuple[dict, str, list[str]]:
    """(environment, launcher, flags) of a pasted vLLM command: ``vllm serve ...`` or
    ``python -m vllm.entrypoints.openai.api_server ...``."""
    tokens = shlex.split(command)
    env = {}
    while tokens and "=" in tokens[0] and not tokens[0].startswith("-"):
        k, _, v = tokens.pop(0).partition("=")
        env[k] = v
    if tokens[:2] == ["vllm", "serve"]:
        return env, "vllm serve", tokens[2:]
    if len(tokens) >= 3 and tokens[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
        return env, "python -m vllm.entrypoints.openai.api_server", tokens[3:]
    raise SystemExit(f"not a vLLM launcher: {command}")


if __name__ == "__main__":
    what, rest = sys.argv[1], sys.argv[2:]
    {"flags": record_flags, "env": record_env, "dispatch": record_dispatch, "matrix": record_matrix,
     "reclassify": reclassify}[what](rest)
