"""fi-autotune's plan for a recorded serving command, compared with what SGLang's and FlashInfer's
own code did for it (tests/data/sglang-0.5.23/, recorded by tests/oracle/record.py).

One comparison, used by the matrix test and the flag-probe test: the autotune gate, key string,
key and rank files per worker; the dummy passes; every tunable FlashInfer call SGLang made,
argument by argument (our recipe materialized at SGLang's token count and bound to FlashInfer's
own signature); and FlashInfer's own keys for that call against ours.
"""

from __future__ import annotations

import enum
import functools
import importlib
import inspect
import json
import re
import shutil
from pathlib import Path

from click.testing import CliRunner

from autotune_cache.autotuner.recipe import token_dim

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "sglang-0.5.23"
MODELS = json.loads((REPO / "tests" / "oracle" / "models.json").read_text())

#: Arguments a recorded call and our recipe may differ in, and why none of them reaches a key or
#: changes what is tuned: buffers FlashInfer writes into or sizes internally, rank offsets, and
#: values only the kernels read.
IGNORED_ARGS = {
    "output": "a preallocated output buffer (the op allocates one of the same shape otherwise)",
    "out": "a preallocated output buffer",
    "local_expert_offset": "this rank's first expert: rank-dependent, not in the key",
    "tp_rank": "rank-dependent, not in the key",
    "ep_rank": "rank-dependent, not in the key",
    "multi_ctas_kv_counter_buffer": "a counter buffer the trtllm-gen MLA kernel sizes itself (not in the key)",
    "kv_cache": "its page count is the KV pool's (not in the key; dtype and page size are checked via the key)",
    "seq_lens": "values only: the profile synthesizes them",
    "routing_bias": "routing values, not in the key",
    "bmm1_scale": "a float: only float-vs-tensor reaches the key",
    "quant_scales": "scale tensors: the key profiles inputs and weights only (checked via the key)",
}


def served_config(model_path: str, workdir: Path) -> str | None:
    """The --config our plan uses for a served path that is not a preset by that name: the file
    the oracle served it from, as a model directory when a ModelOpt sidecar goes with it (the
    layout a checkpoint has: config.json beside hf_quant_config.json)."""
    entry = MODELS.get(model_path)
    if entry is not None:
        if "derived" not in entry and entry["preset"] == model_path.replace("/", "--"):
            return None  # a built-in preset by that very name
        config = REPO / "autotune_cache" / "plan" / "presets" / (entry["preset"] + ".json")
    else:
        config = REPO / "tests" / "data" / "configs" / (model_path.replace("/", "--") + ".json")
        if not config.is_file():
            return None
    sidecar = config.with_suffix(".hf_quant_config.json")
    if not sidecar.is_file():
        return str(config)
    model_dir = workdir / "served-model"
    model_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(config, model_dir / "config.json")
    shutil.copyfile(sidecar, model_dir / "hf_quant_config.json")
    return str(model_dir)


def our_plan(golden: dict, cache_dir: Path) -> tuple[int, dict | str]:
    """``fi-autotune plan --json --arch ARCH [--config C] -- <command>``: (exit code, JSON or stderr)."""
    from fi_autotune_cli.main import cli

    argv = golden["argv"]
    model_path = next((argv[i + 1] for i, a in enumerate(argv) if a in ("--model-path", "--model")),
                      next((a.split("=", 1)[1] for a in argv if a.startswith(("--model-path=", "--model="))), None))
    args = ["plan", "--json", "--arch", golden["arch"], "--flashinfer-version", "0.7.2.post1",
            "--cache-dir", str(cache_dir)]
    config = served_config(model_path, cache_dir) if model_path else None
    if config:
        args += ["--config", config]
    env = [f"{k}={v}" for k, v in (golden.get("env") or {}).items()]
    from autotune_cache.errors import FiAutotuneError

    try:
        result = CliRunner().invoke(cli, [*args, "--", *env, "python", "-m", "sglang.launch_server", *argv],
                                    catch_exceptions=False)
    except FiAutotuneError as e:  # what main() prints as one line (and its exit code)
        return int(e.exit_code), f"fi-autotune: error: {e}"
    if result.exit_code != 0:
        return result.exit_code, (result.stderr if hasattr(result, "stderr") else result.output)
    return 0, by_worker(json.loads(result.stdout))


def by_worker(envelope: dict) -> dict:
    """``plan --json``'s envelope as the goldens compare it: the target worker's plan, with the
    draft worker's (speculative decoding) under ``draft`` and the planner's hints beside it."""
    target, *rest = envelope["workers"]
    assert [w["worker"] for w in envelope["workers"]] == ["target", *(["draft"] if rest else [])]
    return {**target, **({"draft": rest[0]} if rest else {}), "would_autotune_with": envelope["would_autotune_with"]}


# --- calls --------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _signature(api: str) -> inspect.Signature:
    module, name = api.rsplit(".", 1)
    return inspect.signature(getattr(importlib.import_module(module), name))


def _plain(v):
    """A recorded or recipe value in one form: tensors as (shape, dtype, layout), enums as ints."""
    if isinstance(v, dict) and "tensor" in v:
        t = v["tensor"]
        return ("tensor", tuple(t["shape"]), t["dtype"], t.get("layout", "row_major"))
    if isinstance(v, dict) and "enum" in v:
        return int(v["value"])
    if isinstance(v, dict) and "dtype" in v:
        return ("dtype", v["dtype"])
    if isinstance(v, enum.Enum):
        return int(v.value)
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _ours_at(op: dict, m: int) -> dict:
    """Our recipe's kwargs with "M" = m (the shapes the worker would build), bound to FlashInfer's
    signature with its defaults."""
    def conc(v):
        if isinstance(v, dict) and "tensor" in v:
            t = dict(v["tensor"])
            t["shape"] = [token_dim(d, m) for d in t["shape"]]
            return {"tensor": t}
        if isinstance(v, list):
            return [conc(x) for x in v]
        if v == "next_power_of_2(M)":
            return 1 if m < 1 else 1 << (m - 1).bit_length()
        return v

    kwargs = {k: conc(v) for k, v in op["kwargs"].items()}
    bound = _signature(op["api"]).bind_partial(**kwargs)
    bound.apply_defaults()
    return {k: _plain(v) for k, v in bound.arguments.items()}


def dynamic_m(call: dict, op: dict) -> int:
    """The token (or batch) count of SGLang's call: the value at the first "M" of our recipe."""
    for name, v in op["kwargs"].items():
        if isinstance(v, dict) and "tensor" in v and "M" in v["tensor"]["shape"]:
            theirs = call["kwargs"].get(name)
            if isinstance(theirs, dict) and "tensor" in theirs:
                return theirs["tensor"]["shape"][v["tensor"]["shape"].index("M")]
    return call["m"]


def compare_call(call: dict, op: dict) -> list[str]:
    """Every argument of SGLang's recorded call our recipe disagrees with (IGNORED_ARGS aside)."""
    ours = _ours_at(op, dynamic_m(call, op))
    theirs = {k: _plain(v) for k, v in call["kwargs"].items()}
    diffs = []
    for name in sorted(set(ours) | set(theirs)):
        if name in IGNORED_ARGS:
            continue
        a, b = ours.get(name), theirs.get(name)
        if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] == "tensor":
            if a[1:] != b[1:]:
                diffs.append(f"{name}: ours {a[1:]} vs SGLang {b[1:]}")
        elif a != b and not (isinstance(a, float) and isinstance(b, float) and abs(a - b) < 1e-9):
            diffs.append(f"{name}: ours {a!r} vs SGLang {b!r}")
    return diffs


def ops_of(plan: dict) -> list[dict]:
    return [op for w in plan.get("workloads", []) for op in w["ops"]]


def matching_op(plan: dict, call: dict) -> dict | None:
    """The recipe of ``plan`` that stands for SGLang's ``call`` (same API, same dummy pass)."""
    candidates = [op for op in ops_of(plan) if op["api"] == call["api"]
                  and (not op.get("phases") or call["phase"] in op["phases"])]
    if len(candidates) > 1 and call.get("layer"):
        by_layer = [op for op in candidates if op["id"].endswith(call["layer"].rsplit(".", 1)[-1])]
        candidates = by_layer or candidates
    if len(candidates) > 1:
        # Several dense GEMMs share an API: the one whose weight shape matches.
        def weight(kw):
            for name in ("B", "b"):
                if name in kw and isinstance(kw[name], dict) and "tensor" in kw[name]:
                    return [d for d in kw[name]["tensor"]["shape"] if d != "M"]
            return None
        w = weight(call["kwargs"])
        candidates = [op for op in candidates if weight(op["kwargs"]) == w] or candidates
    return candidates[0] if candidates else None


def compare_keys(op: dict, flashinfer: dict) -> list[str]:
    """FlashInfer's own keys for SGLang's call against our recipe's, bucket by bucket."""
    from autotune_cache.autotuner.recipe import OpRecipe

    recipe = OpRecipe.from_dict(op)
    diffs = []
    custom_ops = list(recipe.custom_ops)
    for k in flashinfer["keys"]:
        theirs = sorted(c[1] for c in k["candidates"])
        if not theirs:
            continue
        groups = recipe.candidate_keys(k["bucket"])
        ours = sorted(groups[custom_ops.index(k["custom_op"])]) if k["custom_op"] in custom_ops else []
        if not set(theirs) <= set(ours):
            diffs.append(f"{k['custom_op']} bucket {k['bucket']}: FlashInfer {theirs[0][:300]} vs ours "
                         f"{(ours or ['<none>'])[0][:300]}")
    return diffs


# --- workers ------------------------------------------------------------------------------------

def _no_gpu(name: str) -> str:
    """flashinfer_megamoe names rank files after the GPU's UUID (the oracle's GPUs are made up)."""
    return re.sub(r"_gpu[^.]*", "", name)


def worker_diffs(golden: dict, plan: dict, *, gate: str = "plan") -> list[str]:
    """SGLang's target and draft workers (``golden["target"]``, ``golden["draft"]``) against our
    plan's: the gate, key string and key, rank files and dummy passes. ``gate="resolution"``
    compares SGLang's gate with our resolution's (whether or not a modelled op is tuned)."""
    diffs = []
    for worker in ("target", "draft"):
        g = golden.get(worker)
        p = plan if worker == "target" else plan.get("draft")
        if g is None or p is None:
            if (g is None) != (p is None):
                diffs.append(f"{worker}: SGLang {'has' if g else 'has no'} such worker, fi-autotune "
                             f"{'plans one' if p else 'plans none'}")
            continue
        ours = p["resolution"]["autotunes"] if gate == "resolution" else p["autotunes"]
        if g["should_run"] != ours:
            diffs.append(f"{worker}: should_run SGLang {g['should_run']} vs ours {ours}")
        for name in ("key_string", "key"):
            if g[name] != p[name]:
                diffs.append(f"{worker}: {name} SGLang {g[name]} vs ours {p[name]}")
        if sorted(map(_no_gpu, g["rank_files"])) != sorted(map(_no_gpu, p["rank_files"])):
            diffs.append(f"{worker}: rank files SGLang {g['rank_files'][:3]}... vs ours {p['rank_files'][:3]}...")
        if g["should_run"]:
            theirs = [(x["phase"], x["batch"], x["tokens_per_req"]) for x in g["passes"]]
            mine = [(x["phase"], x["batch"][1], x["tokens_per_req"]) for x in p["resolution"]["passes"]]
            if theirs != mine:
                diffs.append(f"{worker}: dummy passes SGLang {theirs} vs ours {mine}")
    return diffs
