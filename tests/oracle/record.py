"""Re-record the SGLang 0.5.23 / FlashInfer 0.7.2.post1 goldens under tests/data/sglang-0.5.23/.

    FI_AUTOTUNE_SGLANG_PYTHON=/path/to/oracle/bin/python python tests/oracle/record.py matrix [ID ...]
    FI_AUTOTUNE_SGLANG_PYTHON=... python tests/oracle/record.py flags [BASE ...]
    FI_AUTOTUNE_SGLANG_PYTHON=... python tests/oracle/record.py reclassify
    FI_AUTOTUNE_SGLANG_PYTHON=... python tests/oracle/record.py dispatch

``matrix``: every serving command of tests/data/serving_matrix.json through SGLang's own code
(``sglang_case.py``, with the MoE, linear and attention calls recorded) and FlashInfer's own key
construction (``flashinfer_keys.py``), reduced to what fi-autotune's plan must equal, into
``matrix.json``. ``flags``: every SGLang flag tried against each base command of ``BASES``
(``sglang_flags.py``) into ``probes.json`` (the per-probe outcomes) and the flag table
``autotune_cache/engines/sglang/data/sglang-0.5.23-flags.json`` (``classify``). Runs with any Python 3.10+;
``dispatch``: each MoE runner backend against each kind of expert weights of ``DISPATCH_MODELS``,
on sm90 and sm100 (``sglang_moe_dispatch.py``): the quant method and runner SGLang's own model
construction gives the experts, into ``autotune_cache/engines/sglang/data/sglang-0.5.23-moe-dispatch.json``.
only the oracle interpreter needs SGLang (README.md here says how to make one).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DATA = REPO / "tests" / "data" / "sglang-0.5.23"
MATRIX = REPO / "tests" / "data" / "serving_matrix.json"
FLAG_TABLE = REPO / "autotune_cache" / "engines" / "sglang" / "data" / "sglang-0.5.23-flags.json"
PRESETS = REPO / "autotune_cache" / "plan" / "presets"
CONFIGS = REPO / "tests" / "data" / "configs"
DISPATCH = REPO / "autotune_cache" / "engines" / "sglang" / "data" / "sglang-0.5.23-moe-dispatch.json"
#: One checkpoint per kind of expert weights (engines/sglang/dispatch.py checkpoint_kind names them),
#: and the MoE runner backends each is tried with.
DISPATCH_MODELS = {"Qwen/Qwen3-30B-A3B": "bf16", "Qwen/Qwen3-30B-A3B-FP8": "fp8_block",
                   "openai/gpt-oss-20b": "mxfp4", "nvidia/DeepSeek-R1-FP4": "modelopt_fp4",
                   # tests/data/configs (make_configs.py DISPATCH_CONFIGS: a preset + the format's quantization_config)
                   "fi-autotune-derived/Qwen3-30B-A3B-FP8-tensor-static": "fp8_tensor",
                   "fi-autotune-derived/Qwen3-30B-A3B-FP8-tensor-dynamic": "fp8_tensor_dynamic",
                   "fi-autotune-derived/Qwen3-30B-A3B-ModelOpt-FP8": "modelopt_fp8",
                   "fi-autotune-derived/DeepSeek-R1-W4AFP8": "w4afp8",
                   "fi-autotune-derived/Qwen3-30B-A3B-CT-FP8-dynamic": "compressed_tensors_fp8",
                   "fi-autotune-derived/Qwen3-30B-A3B-CT-W4A16": "compressed_tensors_w4a16",
                   "fi-autotune-derived/Qwen3-30B-A3B-AWQ": "awq",
                   "fi-autotune-derived/Qwen3-30B-A3B-GPTQ-Int4": "gptq"}
DISPATCH_BACKENDS = ("auto", "triton", "triton_kernel", "flashinfer_cutlass", "flashinfer_trtllm",
                     "flashinfer_trtllm_routed", "flashinfer_mxfp4", "flashinfer_cutedsl")
#: --moe-a2a-backend choices of SGLang 0.5.23 (arg_groups/fields/exec_.py) other than "none". Each is
#: probed with attention DP over the TP group (``DISPATCH_A2A_BASE``); ``flashinfer`` against every
#: runner backend (its dispatcher feeds FlashInfer's MoE calls), the others with the runner left at auto.
DISPATCH_A2A = ("flashinfer", "deepep", "deepep_v2", "mooncake", "nixl", "mori", "megamoe", "pplx",
                "flashinfer_megamoe", "ascend_fuseep", "ascend_tp")
DISPATCH_A2A_BASE = ("--tp", "2", "--dp", "2", "--enable-dp-attention")
#: Further commands probed per kind: (label, flags after --model-path). ``ep`` rows keep the EP width.
DISPATCH_EXTRA = (("ep4", ("--tp", "8", "--ep", "4", "--moe-runner-backend", "flashinfer_cutlass")),)

#: Base commands every flag is tried against: one per kind of tuning fi-autotune models.
BASES = {
    "dsv3-b200-tp8": ("sm100", "--model-path deepseek-ai/DeepSeek-V3 --tp 8"),
    "glm51-b200-tp8-dp8": ("sm100", "--model-path zai-org/GLM-5.1-FP8 --tp 8 --dp 8 --enable-dp-attention"),
    "dsv3-b200-tp8-eagle": ("sm100", "--model-path deepseek-ai/DeepSeek-V3 --tp 8 --speculative-algorithm EAGLE "
                                     "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"),
    "qwen30-h100-tp2-cutlass": ("sm90", "--model-path Qwen/Qwen3-30B-A3B --tp 2 --moe-runner-backend flashinfer_cutlass"),
    "llama70-fp8-h100-tp4": ("sm90", "--model-path nvidia/Llama-3.1-70B-Instruct-FP8 --tp 4"),
    "gptoss120-b200-tp4": ("sm100", "--model-path openai/gpt-oss-120b --tp 4"),
}


def oracle_python() -> str:
    exe = os.environ.get("FI_AUTOTUNE_SGLANG_PYTHON")
    if not exe:
        sys.exit("set FI_AUTOTUNE_SGLANG_PYTHON to an interpreter with sglang==0.5.23 (tests/oracle/README.md)")
    return exe


def model_files(served: str) -> dict:
    """The config (and ModelOpt sidecar) a served path stands for (tests/oracle/models.json)."""
    table = json.loads((HERE / "models.json").read_text())
    entry = table.get(served)
    if entry is None:
        derived = CONFIGS / (served.replace("/", "--") + ".json")
        if not derived.is_file():
            raise SystemExit(f"no config for {served}: add it to tests/oracle/models.json or tests/data/configs/")
        sidecar = derived.with_suffix(".hf_quant_config.json")
        return {"config": str(derived), "sidecar": str(sidecar) if sidecar.is_file() else None}
    preset = PRESETS / (entry["preset"] + ".json")
    sidecar = PRESETS / (entry["preset"] + ".hf_quant_config.json")
    return {"config": str(preset), "sidecar": str(sidecar) if sidecar.is_file() else None}


def split_command(command: str) -> tuple[dict, list[str]]:
    """(environment assignments, the flags after the launcher) of a pasted serving command."""
    tokens = shlex.split(command)
    env = {}
    while tokens and "=" in tokens[0] and not tokens[0].startswith("-"):
        k, _, v = tokens.pop(0).partition("=")
        env[k] = v
    first = next((i for i, t in enumerate(tokens) if t.startswith("--")), len(tokens))
    return env, tokens[first:]


def served_paths(argv: list[str]) -> list[str]:
    out = []
    for i, t in enumerate(argv):
        for flag in ("--model-path", "--model", "--speculative-draft-model-path"):
            if t == flag and i + 1 < len(argv):
                out.append(argv[i + 1])
            elif t.startswith(flag + "="):
                out.append(t.split("=", 1)[1])
    return out


def make_case(case_id: str, arch: str, command: str) -> dict:
    env, argv = split_command(command)
    models = {}
    for path in served_paths(argv):
        try:
            models[path] = model_files(path)
        except SystemExit as e:
            return {"id": case_id, "arch": arch, "argv": argv, "env": env, "missing": str(e)}
    return {"id": case_id, "arch": arch, "gpus": 8, "argv": argv, "env": env, "models": models}


def run_oracle(script: str, payload, timeout: int = 1800, args: tuple[str, ...] = ()) -> dict | list:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(payload, f)
    try:
        proc = subprocess.run([oracle_python(), str(HERE / script), *args, f.name], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"oracle_error": f"{script} timed out after {timeout} s"}
    finally:
        os.unlink(f.name)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"oracle_error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:500]}
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return json.loads(lines[-1])


def record_case(p: dict) -> dict:
    """One matrix case: SGLang's resolution and passes, then its calls (three recorders, one
    process each), then FlashInfer's keys for every tunable call."""
    from reduce import reduce_case

    if "missing" in p:
        return {"id": p["id"], "arch": p["arch"], "argv": p["argv"], "oracle_error": p["missing"]}
    raw = run_oracle("sglang_case.py", p)
    if "error" in raw or "oracle_error" in raw:
        return reduce_case(p, raw, None)
    passes, gather = {}, {}
    for worker in ("target", "draft"):
        w = raw.get(worker)
        if w and w["should_run"]:
            passes[worker] = w["passes"]
            gather[worker] = raw["resolved"]["attn_dp_size"] if w["require_mlp_tp_gather"] else 1
    calls, errors, reads = [], [], set()
    if passes:
        job = dict(p, passes=passes, gather=gather)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            for res in pool.map(lambda k: run_oracle("sglang_calls.py", job, args=(k,)), ("moe", "linear", "attention")):
                calls += res.get("calls", [])
                reads |= set(res.get("reads", []))
                errors += res.get("errors", []) + ([{"error": res["oracle_error"]}] if "oracle_error" in res else [])
    raw["calls"] = calls
    raw["call_errors"] = errors
    raw["call_reads"] = sorted(reads)
    keys = None
    requests = [{"id": str(i), "arch": p["arch"], "api": c["api"], "kwargs": c["kwargs"]}
                for i, c in enumerate(calls)]
    if requests:
        keys = run_oracle("flashinfer_keys.py", _dedupe(requests), timeout=7200)
    return reduce_case(p, raw, keys)


def _dedupe(requests: list[dict]) -> list[dict]:
    """One FlashInfer run per distinct call (the keys do not depend on anything else)."""
    seen, out = {}, []
    for r in requests:
        sig = json.dumps([r["api"], r["kwargs"]], sort_keys=True)
        if sig not in seen:
            seen[sig] = r["id"]
            out.append(r)
    return out


def record_matrix(only: list[str]) -> None:
    cases = json.loads(MATRIX.read_text())
    chosen = [c for c in cases if not only or c["id"] in only]
    out_path = DATA / "matrix.json"
    results = json.loads(out_path.read_text())["cases"] if out_path.is_file() else {}
    workers = int(os.environ.get("FI_AUTOTUNE_ORACLE_JOBS", "1"))
    payloads = [make_case(c["id"], c["arch"], c["command"]) for c in chosen]
    DATA.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for p, r in zip(payloads, pool.map(record_case, payloads)):
            results[p["id"]] = r
            print(f"{p['id']}: {_summary(r)}", file=sys.stderr, flush=True)
            out_path.write_text(json.dumps({"sglang": "0.5.23", "flashinfer": "0.7.2.post1",
                                            "cases": dict(sorted(results.items()))}, indent=1, sort_keys=True) + "\n")


def _summary(r: dict) -> str:
    if "error" in r:
        return "rejected by SGLang: " + r["error"][:100]
    if "oracle_error" in r:
        return f"ORACLE ERROR {r['oracle_error']}"
    t = r["target"]
    return (f"should_run={t['should_run']} key={t['key']} calls={len(r.get('calls') or [])} "
            f"call_errors={len(r.get('call_errors') or [])}")


def record_flags(only: list[str]) -> None:
    from classify import write_flag_table

    chosen = {k: v for k, v in BASES.items() if not only or k in only}
    probes_path = DATA / "probes.json"
    old = json.loads(probes_path.read_text()) if probes_path.is_file() else {"bases": {}}
    for name, (arch, command) in chosen.items():
        case = make_case(name, arch, command)
        raw = run_oracle("sglang_flags.py", case, timeout=6 * 3600)
        old["bases"][name] = {"arch": arch, "command": command, "raw": raw}
        print(f"{name}: {len(raw.get('probes', []))} probes", file=sys.stderr)
    write_flag_table(old, probes_path, FLAG_TABLE, sglang_srt())


def sglang_srt() -> Path:
    """sglang/srt of the oracle interpreter (found, not imported)."""
    out = subprocess.run([oracle_python(), "-c", "import importlib.util as u; "
                          "print(u.find_spec('sglang').submodule_search_locations[0])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()) / "srt"


def reclassify(_: list[str]) -> None:
    """Apply the call-site and shape-site rules (classify.at_call_sites, at_shape_sites) to the
    shipped flag table, no probing."""
    from classify import at_call_sites, at_shape_sites, call_site_reads, shape_site_reads

    data = json.loads(FLAG_TABLE.read_text())
    data["flags"] = at_call_sites(data["flags"], call_site_reads(sglang_srt()))
    data["flags"] = at_shape_sites(data["flags"], shape_site_reads(sglang_srt()))
    FLAG_TABLE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


#: Failures of the oracle's environment, not SGLang's answer: a package it lacks (``triton_kernels``:
#: SGLang imports it under try/except, so its absence surfaces later as a NameError) or a kernel
#: SGLang JIT-compiles or a compiled ``sgl_kernel`` op (``cudastubs.py`` stands in for CUDA), or a FlashInfer function the MoE
#: recorder has no CPU stand-in for. Such a probe is kept as not recorded.
ENVIRONMENT_ERRORS = ("ModuleNotFoundError", "ImportError", "NameError", "RuntimeError: Failed to build JIT module",
                      "cudastubs.KernelCalled")  # cudastubs.py: a compiled sgl_kernel op was called
#: ... and anywhere in the message: Triton asking for the CUDA driver (triton_kernels' launch-time
#: target query; there is no libcuda on the recording machine); a tensor allocated on CUDA; a
#: process group's ``device_group`` (the recorder's FakeGroup has none, except for the FlashInfer
#: A2A stand-in); a check on weight *values*, which the recorder never loads (``torch.empty``: a
#: checkpoint's equal gate/up scales differ here).
ENVIRONMENT_MESSAGES = ("with no CPU stand-in", "libcuda.so cannot found", "from the 'CUDA' backend",
                        "'NoneType' object has no attribute 'size'",
                        "requires matching gate/up FC1 alpha values")


def _environment_error(probe: dict) -> dict:
    error = probe.get("error") or ""
    if not (error.startswith(ENVIRONMENT_ERRORS) or any(m in error for m in ENVIRONMENT_MESSAGES)):
        return probe
    out = {k: v for k, v in probe.items() if k not in ("error", "apis")}
    return out | {"oracle_error": "the oracle's environment, not SGLang: " + error}


def dispatch_cases() -> list[dict]:
    """Every dispatch probe: (model, kind, backend[, a2a | ep]) and its command."""
    def case(model: str, flags: tuple[str, ...], backend: str, **extra) -> dict:
        argv = ["--model-path", model, *flags]
        return {"model": model, "kind": DISPATCH_MODELS[model], "backend": backend, "argv": argv,
                "command": " ".join(argv), **extra}

    out = []
    for m in DISPATCH_MODELS:
        out += [case(m, ("--tp", "2", "--moe-runner-backend", b), b) for b in DISPATCH_BACKENDS]
        for a2a in DISPATCH_A2A:
            for b in DISPATCH_BACKENDS if a2a == "flashinfer" else ("auto",):
                out.append(case(m, (*DISPATCH_A2A_BASE, "--moe-a2a-backend", a2a, "--moe-runner-backend", b), b,
                                a2a=a2a))
        for label, flags in DISPATCH_EXTRA:
            backend = flags[flags.index("--moe-runner-backend") + 1]
            out.append(case(m, flags, backend, ep_size=int(flags[flags.index("--ep") + 1]), variant=label))
    return out


def _dispatch_order(p: dict) -> tuple:
    # Within one (arch, kind, backend) the plain --tp 2 probe comes last, so a reader keyed by that
    # triple alone (engines/sglang/dispatch.py _table) still finds the plain command's answer.
    plain = "a2a" not in p and "variant" not in p
    return p["arch"], p["kind"], p["backend"], plain, p.get("a2a", ""), p["command"]


def record_dispatch(only: list[str]) -> None:
    """SGLang's quant method and MoE runner for each (arch, checkpoint kind, --moe-runner-backend),
    also under each --moe-a2a-backend, and for the DISPATCH_EXTRA commands."""
    archs = [a for a in ("sm90", "sm100") if not only or a in only]
    models = {m: model_files(m) for m in DISPATCH_MODELS}
    old = json.loads(DISPATCH.read_text())["probes"] if DISPATCH.is_file() else []
    probes = [p for p in old if p["arch"] not in archs]
    cases = dispatch_cases()
    for arch in archs:
        payload = [{"id": str(i), "argv": c["argv"]} for i, c in enumerate(cases)]
        raw = run_oracle("sglang_moe_dispatch.py", {"arch": arch, "gpus": 8, "models": models, "probes": payload},
                         timeout=6 * 3600)
        if "oracle_error" in raw:
            sys.exit(f"{arch}: {raw['oracle_error']}")
        for case_id, result in raw["probes"].items():
            c = cases[int(case_id)]
            probes.append({"arch": arch, **{k: v for k, v in c.items() if k != "argv"}, **result})
    probes = [_environment_error(p) for p in probes]
    probes.sort(key=_dispatch_order)
    DISPATCH.write_text(json.dumps({"sglang": "0.5.23", "recorded_by": "tests/oracle/record.py dispatch",
                                    "models": DISPATCH_MODELS, "a2a_backends": list(DISPATCH_A2A),
                                    "probes": probes}, indent=1, sort_keys=True) + "\n")

if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    what, rest = sys.argv[1], sys.argv[2:]
    {"matrix": record_matrix, "flags": record_flags, "reclassify": reclassify, "dispatch": record_dispatch}[what](rest)
