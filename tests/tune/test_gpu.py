"""End to end on real GPUs (sm90): warm, verify, resume, multi-GPU, LM-head memory.

Run through the device tool: ``python3 -m pytest -m gpu tests/tune/test_gpu.py``. Measured numbers are
appended as JSON lines to ``$FI_AUTOTUNE_RESULTS`` (default: none) for the notes and docs/warm.md.
CI has no GPU: these are skipped there (conftest.py), never counted as passing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune_cache.registry import default_layout
from autotune_cache.tree.layouts.own_names import MANIFEST_NAME
from autotune_cache.autotuner.rankfile import RESERVED_KEYS
from autotune_cache.autotuner.recipe import OpRecipe

from ..conftest import REPO, run_cli, run_json

pytestmark = pytest.mark.gpu

LLAMA = ["--model", "nvidia/Llama-3.1-70B-Instruct-FP8", "--tp", "4"]
QWEN = ["--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass"]


def record(name: str, **values) -> None:
    path = os.environ.get("FI_AUTOTUNE_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": name, **values}) + "\n")


def gpu_count() -> int:
    """The GPUs this process may use (CUDA_VISIBLE_DEVICES applied, as warm counts them)."""
    from autotune_cache.tune.workers.gpus import detect_gpus

    return detect_gpus().count


def warm(args, root: Path, *extra, timeout=900, env: dict | None = None) -> dict:
    proc = run_cli("warm", *args, "--cache-dir", str(root), "--json", *extra, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def assert_schema(command: str, data: dict) -> None:
    """A GPU command's --json against its schema (docs/schemas); the GPU image may lack jsonschema."""
    assert data["format"] == f"fi-autotune.{command}/1"
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(data, json.loads((REPO / "docs" / "schemas" / f"{command}.schema.json").read_text()))


def v2_replay(args, root: Path, result: dict, v2: Path) -> dict:
    """FlashInfer's own v2 store, as warm wrote it, in an engine's startup pass (tests/gpu_probes/v2_replay.py)."""
    plan = root.parent / "plan.json"
    (target,) = run_json("plan", *args, "--cache-dir", str(root))["workers"]
    plan.write_text(json.dumps(target))  # the one worker's plan, as the replay reads it
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "gpu_probes" / "v2_replay.py"), str(plan), result["rank_files"][0], str(v2)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(proc.stdout.strip().splitlines()[-1])
    record("v2_replay", args=args, **rep)
    assert rep["v1_hits"] == rep["v1_lookups"] > 0, json.dumps(rep)
    assert rep["v2_profiled"] == 0 and rep["v2_hits"] == rep["lookups"] > 0 and rep["same_tactics"], json.dumps(rep)
    return rep


def rank_entries(result: dict) -> dict[str, dict]:
    return {Path(p).name: json.loads(Path(p).read_text()) for p in result["rank_files"]}


def assert_byte_identical(result: dict) -> bytes:
    datas = {Path(p).read_bytes() for p in result["rank_files"]}
    assert len(datas) == 1, "rank files of one TP group differ"
    return datas.pop()


def assert_plan_keys_present(args, root: Path, data: bytes) -> int:
    """The plan predicts the FlashInfer keys of its verified recipes; the file must hold every one."""
    (plan,) = run_json("plan", *args, "--cache-dir", str(root))["workers"]
    keys = {k for k in json.loads(data) if k not in RESERVED_KEYS}
    expected = set()
    for w in plan["workloads"]:
        for op in w["ops"]:
            assert op["verified"], op["id"]
            recipe = OpRecipe.from_dict(op)
            for b in op["buckets"]:
                expected.update(recipe.file_keys(b))
    missing = expected - keys
    assert not missing, sorted(missing)[:3]
    return len(expected)


def test_llama_fp8_tp4_warm_verify_noop(tmp_path):
    """modelopt FP8 dense (bmm_fp8, cuBLAS) at TP4 on one GPU: four byte-identical rank files."""
    root, v2 = tmp_path / "cache", tmp_path / "v2"
    t0 = time.perf_counter()
    r = warm(LLAMA, root, "--gpus", "1", "--layout", "sglang,flashinfer-v2", env={"FLASHINFER_AUTOTUNE_CACHE_DIR": str(v2)})
    wall = time.perf_counter() - t0
    assert r["status"] == "written" and len(r["rank_files"]) == 4 and r["layouts"]["flashinfer-v2"]["written"] > 0
    data = assert_byte_identical(r)
    n_keys = assert_plan_keys_present(LLAMA, root, data)
    kdir = Path(r["key_dir"])
    assert (kdir / MANIFEST_NAME).is_file()
    listed = run_json("ls", "--cache-dir", str(root))
    assert [e["status"] for e in listed["entries"]] == ["complete"]
    v = run_cli("verify", "/".join(kdir.parts[-3:]), "--cache-dir", str(root), "--json")
    assert v.returncode == 0, v.stdout + v.stderr[-2000:]
    rep = json.loads(v.stdout)
    assert rep["ok"] and rep["hits"] == rep["lookups"] > 0
    assert_schema("verify", rep)
    assert_schema("warm", r)
    t1 = time.perf_counter()
    again = warm(LLAMA, root, "--gpus", "1")
    assert again["status"] == "complete"
    noop = round(time.perf_counter() - t1, 2)
    replay = v2_replay(LLAMA, root, r, v2)
    record("llama_fp8_tp4_1gpu", warm_wall_s=round(wall, 2), timings=r["timings"], profiles=r["profiles_total"],
           keys=n_keys, verify=rep, noop_wall_s=noop, v2_replay=replay)


def test_qwen3_cutlass_tp2_warm_verify(tmp_path):
    """bf16 MoE through cutlass_fused_moe (prebuilt fused_moe_90) at TP2."""
    root, v2 = tmp_path / "cache", tmp_path / "v2"
    t0 = time.perf_counter()
    r = warm(QWEN, root, "--gpus", "1", "--layout", "sglang,flashinfer-v2", env={"FLASHINFER_AUTOTUNE_CACHE_DIR": str(v2)})
    wall = time.perf_counter() - t0
    data = assert_byte_identical(r)
    n_keys = assert_plan_keys_present(QWEN, root, data)
    v = run_cli("verify", "--model", "Qwen/Qwen3-30B-A3B", "--cache-dir", str(root), "--json")
    assert v.returncode == 0, v.stdout + v.stderr[-2000:]
    rep = json.loads(v.stdout)
    assert rep["ok"] and rep["hits"] == rep["lookups"] == 42
    replay = v2_replay(QWEN, root, r, v2)
    record("qwen3_cutlass_tp2_1gpu", warm_wall_s=round(wall, 2), timings=r["timings"], profiles=r["profiles_total"], keys=n_keys,
           verify=rep, v2_replay=replay)


@pytest.mark.parametrize("args,name", [(QWEN, "qwen3_cutlass_tp2"), (LLAMA, "llama_fp8_tp4")])
def test_careful_cache_loads_with_zero_retuning(tmp_path, args, name):
    """Careful mode: 3 tunes, raced winners, the floor; what it writes (explicit default entries
    included) must load in the engine's pass exactly as a quick cache does: zero re-tuning, in
    SGLang's rank files and in FlashInfer's v2 store. Then diff --measure against a quick cache."""
    root, v2, quick_root = tmp_path / "cache", tmp_path / "v2", tmp_path / "quick"
    gpus = str(min(gpu_count(), 2))
    r = warm(args, root, "--gpus", gpus, "--quality", "careful", "--layout", "sglang,flashinfer-v2",
             env={"FLASHINFER_AUTOTUNE_CACHE_DIR": str(v2)})
    assert r["status"] == "written" and r["selection"]["buckets"] > 0 and r["selection"]["raced"] > 0
    data = assert_byte_identical(r)
    assert_plan_keys_present(args, root, data)
    eid = "/".join(Path(r["key_dir"]).parts[-3:])
    v = run_cli("verify", eid, "--cache-dir", str(root), "--json")
    rep = json.loads(v.stdout)
    assert v.returncode == 0 and rep["ok"] and rep["hits"] == rep["lookups"], v.stdout + v.stderr[-2000:]
    shown = run_cli("show", eid, "--cache-dir", str(root), "--buckets")
    assert shown.returncode == 0 and "Selection careful: 3 tunes" in shown.stdout
    manifest = json.loads((Path(r["key_dir"]) / MANIFEST_NAME).read_text())
    quick = warm(args, quick_root, "--gpus", "1")
    d = run_cli("diff", r["rank_files"][0], quick["rank_files"][0], "--json")
    assert d.returncode == 0, d.stderr[-2000:]
    diff = json.loads(d.stdout)
    measured = None
    if not diff["identical"]:
        m = run_cli("diff", eid, str(Path(quick["key_dir"])), "--cache-dir", str(root), "--measure", "--json", timeout=900)
        assert m.returncode == 0, m.stderr[-3000:]
        measured = json.loads(m.stdout)["measured"]
        assert measured and all(x.get("a_ms") and x.get("b_ms") for x in measured), measured[:3]
    replay = v2_replay(args, root, r, v2)
    record(f"{name}_careful", timings=r["timings"], selection=r["selection"], verify=rep, v2_replay=replay,
           quick_timings=quick["timings"], diff={k: diff[k] for k in ("same", "changed", "added", "dropped")},
           measured=measured, per_bucket=manifest["extra"]["selection"]["ops"])


@pytest.mark.skipif(gpu_count() < 2, reason="needs 2+ GPUs")
@pytest.mark.parametrize("args,name", [(LLAMA, "llama_fp8_tp4"), (QWEN, "qwen3_cutlass_tp2")])
def test_multi_gpu_matches_one_gpu(tmp_path, args, name):
    n = gpu_count()
    one = warm(args, tmp_path / "one", "--gpus", "1")
    many = warm(args, tmp_path / "many", "--gpus", str(n))
    k1 = {k for k in json.loads(assert_byte_identical(one)) if k not in RESERVED_KEYS}
    kn = {k for k in json.loads(assert_byte_identical(many)) if k not in RESERVED_KEYS}
    assert k1 == kn  # same keys, same coverage: the split changes who measures, not what
    meta1 = json.loads(Path(one["rank_files"][0]).read_text())["_metadata"]
    metan = json.loads(Path(many["rank_files"][0]).read_text())["_metadata"]
    assert meta1 == metan
    v = run_cli("verify", Path(many["key_dir"]).name, "--cache-dir", str(tmp_path / "many"), "--json")
    assert v.returncode == 0 and json.loads(v.stdout)["ok"]
    per1 = one["timings"]["tuning_s"] / one["profiles_tuned"]
    pern = many["timings"]["tuning_s"] / many["profiles_tuned"]
    record(f"{name}_scaling", gpus=n, one=one["timings"], many=many["timings"], profiles=one["profiles_total"],
           wall_per_profile_1=round(one["timings"]["workers_wall_s"] / one["profiles_total"], 4),
           wall_per_profile_n=round(many["timings"]["workers_wall_s"] / many["profiles_total"], 4),
           tuning_per_profile_1=round(per1, 4), tuning_per_profile_n=round(pern, 4))
    assert many["timings"]["tuning_s"] < one["timings"]["tuning_s"]


def test_sigint_mid_tuning_then_resume(tmp_path):
    root = tmp_path / "cache"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "fi_autotune_cli", "warm", *LLAMA, "--gpus", "1", "--cache-dir", str(root)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 600
    seen = ""
    while time.time() < deadline:
        line = proc.stderr.readline()
        seen += line
        m = re.match(r"fi-autotune: tuning (\d+)/\d+ profiles \(", line)
        if m and int(m.group(1)) > 0:  # at least one profile finished (not during the JIT build)
            break
        if not line and proc.poll() is not None:
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, seen + err[-2000:])
    assert "nothing was written" in err
    # no partial rank set: the key dir does not exist at all
    assert not list(default_layout().base(root).glob("*/*/*/rank_*.json"))
    r = warm(LLAMA, root, "--gpus", "1")
    assert r["status"] == "written" and 0 < r["profiles_tuned"] < r["profiles_total"]
    assert_byte_identical(r)
    record("sigint_resume", resumed_profiles=r["profiles_total"] - r["profiles_tuned"], total=r["profiles_total"])


def test_lm_head_stub_peak_memory_glm51_dims():
    """GLM-5.1 TP8 DP8: hidden 6144, vocab 154880, 512 decode tokens per rank gathered x8."""
    import torch

    from autotune_cache import lm_head_stub
    from autotune_cache.tune.workers.skeleton import SkeletonModel

    dev = torch.device("cuda", 0)
    model = SkeletonModel([], hidden=6144, vocab=154880, tp=8, dp=8, dtype="bfloat16", device=dev)
    peaks = {}
    for stub in (True, False):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        if stub:
            with lm_head_stub():
                out = model(lambda op: None, lm_tokens=512)
        else:
            out = model(lambda op: None, lm_tokens=512)
        torch.cuda.synchronize()
        peaks[stub] = torch.cuda.max_memory_allocated(dev) - base
        del out
    logits = 512 * 8 * 154880 * 4
    record("lm_head_peak_memory", with_stub_bytes=peaks[True], without_stub_bytes=peaks[False], fp32_logits_bytes=logits)
    assert peaks[False] >= logits and peaks[True] < peaks[False] / 50


def test_verify_reports_missing_keys(tmp_path):
    """Drop one bucket from every rank file (byte-identical still): verify must see the engine re-tune it."""
    from autotune_cache.autotuner.rankfile import cache_file_bytes

    root = tmp_path / "cache"
    r = warm(QWEN, root, "--gpus", "1")
    obj = json.loads(assert_byte_identical(r))
    kept = {k: v for k, v in obj.items() if k not in RESERVED_KEYS and not k.startswith("('trtllm::fused_moe::gemm1', 'MoERunner', ((256,")}
    assert len(kept) == len(obj) - len(set(RESERVED_KEYS) & set(obj)) - 1
    data = cache_file_bytes(obj["_metadata"], kept)
    for p in r["rank_files"]:
        Path(p).write_bytes(data)
    v = run_cli("verify", Path(r["key_dir"]).name, "--cache-dir", str(root), "--json")
    rep = json.loads(v.stdout)
    assert v.returncode == 1 and not rep["ok"] and rep["workloads"][0]["retuned"] == 1
    assert "((256, 2048)" in rep["workloads"][0]["retuned_keys"][0]
    record("verify_detects_missing", lookups=rep["lookups"], hits=rep["hits"], retuned=rep["workloads"][0]["retuned"])


def test_vllm_layout_serves_vllms_own_call(tmp_path):
    """warm --layout sglang,vllm: one run, both engines' calls. vLLM's rank files pass vLLM's hit
    test and serve the call vLLM 0.33's FlashInferExperts makes (tests/data, recorded from vLLM on
    CPU) with no profiling in vLLM's startup pass and a hit at every served token count; the
    SGLang file of the same run, given to vLLM's pass, is re-tuned (its keys are not vLLM's)."""
    h = "5eed" * 16
    out = warm(QWEN, tmp_path / "sg", "--layout", "sglang,vllm", "--vllm-config-hash", h,
               env={"VLLM_CACHE_ROOT": str(tmp_path / "vllm")})
    by_name = {t["name"]: t for t in out["workers"]}
    assert by_name["sglang"]["status"] == by_name["vllm"]["status"] == "written"
    vdir = Path(by_name["vllm"]["key_dir"])
    sg_file = sorted(Path(by_name["sglang"]["key_dir"]).glob("rank_*.json"))[0]
    golden = json.loads((REPO / "tests" / "data" / "vllm-0.33.0-cutlass_fused_moe-calls.json").read_text())
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "gpu_probes" / "vllm_replay.py"), json.dumps(golden["cases"]["tp2"]),
                           str(vdir), "8192", str(sg_file)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    record("vllm_layout_replay", profiles=out["profiles_distinct"], wall_s=out["timings"]["command_wall_s"], **r)
    assert r["rank_files"] == 2 and r["vllm_hit_test"]
    s = r["startup_pass"]
    assert s["metadata_accepted"] and s["profiled"] == 0 and s["lookups"] > 0 and s["hits"] == s["lookups"]
    assert r["serving"]["lookups"] > 0 and r["serving"]["hits"] == r["serving"]["lookups"], r["serving"]["misses"]
    assert r["control_other_file"]["profiled"] > 0


def vllm_v2_pass(case: dict, root: Path) -> dict:
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "gpu_probes" / "vllm_replay.py"), "--v2", json.dumps(case), str(root),
                           "8192"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_single_gpu_vllm_store_serves_vllms_startup_pass(tmp_path):
    """warm --layout vllm --tp 1 (no config hash): vLLM's own call tuned and published into
    FlashInfer's managed store at vLLM's root ($VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR). vLLM's
    startup pass as it enters it (autotune_v2(mode="tune") around autotune(hybrid buckets,
    round_up=True)), over that store, profiles nothing and publishes nothing; serving hits at every
    token count. The control, the same pass over an empty root, profiles. A second warm finds the
    store complete."""
    root = tmp_path / "vllm-store"
    args = ["--model", "Qwen/Qwen3-30B-A3B", "--tp", "1", "--moe-runner-backend", "flashinfer_cutlass",
            "--layout", "vllm", "--gpus", "1", "--json"]
    env = {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(root)}
    t0 = time.perf_counter()
    proc = run_cli("warm", *args, timeout=900, env=env)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "written" and Path(out["key_dir"]).parent == root / "v2", out
    entries = len(list(Path(out["key_dir"]).glob("entries/*.json")))
    golden = json.loads((REPO / "tests" / "data" / "vllm-0.33.0-cutlass_fused_moe-calls.json").read_text())
    case = golden["cases"]["tp1"]
    r = vllm_v2_pass(case, root)
    control = vllm_v2_pass(case, tmp_path / "empty")
    # the store travels: exported on the tuning box, imported into an empty root elsewhere
    bundle = tmp_path / "store.tgz"
    assert run_cli("export", "--layout", "flashinfer-v2", "--cache-dir", str(root), "-o", str(bundle)).returncode == 0
    assert run_cli("import", "--layout", "flashinfer-v2", "--cache-dir", str(tmp_path / "pod"), str(bundle)).returncode == 0
    moved = vllm_v2_pass(case, tmp_path / "pod")
    flags = args[:args.index("--gpus")]
    verified = run_cli("verify", *flags, "--json", timeout=600, env=env)
    ver = json.loads(verified.stdout)
    # one entry gone: verify says so (exit 1), and a second warm tunes again (and replaces what differs)
    victim = sorted(Path(out["key_dir"]).glob("entries/*.json"))[0]
    victim.unlink()
    partial = run_cli("verify", *flags, "--json", timeout=600, env=env)
    again = json.loads(run_cli("warm", *args, timeout=900, env=env).stdout)
    third = json.loads(run_cli("warm", *args, timeout=900, env=env).stdout)
    record("vllm_single_gpu_v2", warm_wall_s=round(wall, 1), profiles=out["profiles_total"], entries=entries,
           replay=r, control=control, moved=moved, verify=ver, partial_verify=json.loads(partial.stdout),
           second_warm={k: again[k] for k in ("status", "profiles_tuned", "message")}, third_warm=third["status"])
    s = r["startup_pass"]
    assert s["profiled"] == 0 and s["lookups"] > 0 and s["hits"] == s["lookups"], s
    assert s["entries_after"] == s["entries_before"] == entries > 0
    assert r["serving"]["lookups"] > 0 and r["serving"]["hits"] == r["serving"]["lookups"], r["serving"]["misses"]
    assert control["startup_pass"]["profiled"] > 0 and control["startup_pass"]["entries_after"] > 0
    assert moved["startup_pass"]["profiled"] == 0 and moved["startup_pass"]["hits"] == s["lookups"], moved
    assert verified.returncode == 0 and ver["ok"] and ver["hits"] == ver["lookups"] == entries, ver
    assert partial.returncode == 1 and json.loads(partial.stdout)["workloads"][0]["retuned"] == 1, partial.stdout
    assert again["status"] == "written" and again["profiles_tuned"] == 42 and " already there" in again["message"]
    assert third["status"] == "complete"


def test_vllm_targets_in_a_targets_file(tmp_path):
    """One targets file, one pool: a single-rank vLLM target (its managed store), a TP2 vLLM target
    (its rank files, by config hash) and an SGLang TP2 target, each written where its engine reads
    (no --cache-dir: with one, every target goes under it, issue 45) and verified by its engine's pass."""
    h = "7a11" * 16
    targets = tmp_path / "targets.yaml"
    targets.write_text("defaults:\n  model: Qwen/Qwen3-30B-A3B\n  moe_runner_backend: flashinfer_cutlass\ntargets:\n"
                       "  - {name: vllm-1gpu, tp: 1, layouts: [vllm]}\n"
                       f"  - {{name: vllm-tp2, tp: 2, layouts: [vllm], vllm_config_hash: '{h}'}}\n"
                       "  - {name: sglang-tp2, tp: 2}\n")
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm"), "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": "",
           "FLASHINFER_AUTOTUNE_CACHE_DIR": str(tmp_path / "fi"), "SGLANG_CACHE_DIR": str(tmp_path / "sg")}
    proc = run_cli("warm", "--targets", str(targets), "--json", timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    by_name = {t["name"]: t for t in out["workers"]}
    assert all(t["status"] == "written" for t in by_name.values()), out
    assert Path(by_name["vllm-1gpu"]["key_dir"]).parent == tmp_path / "fi" / "v2"
    assert Path(by_name["vllm-tp2"]["key_dir"]).is_relative_to(tmp_path / "vllm" / "flashinfer_autotune_cache")
    assert Path(by_name["sglang-tp2"]["key_dir"]).is_relative_to(tmp_path / "sg" / "flashinfer" / "autotune")
    base = ["--model", "Qwen/Qwen3-30B-A3B", "--moe-runner-backend", "flashinfer_cutlass", "--json"]
    runs = {"vllm-1gpu": ["--tp", "1", "--layout", "vllm"], "vllm-tp2": ["--tp", "2", "--layout", "vllm", "--vllm-config-hash", h],
            "sglang-tp2": ["--tp", "2"]}
    results = {}
    for name, extra in runs.items():
        v = run_cli("verify", *base, *extra, timeout=600, env=env)
        results[name] = json.loads(v.stdout) if v.stdout.strip() else v.stderr[-500:]
        assert v.returncode == 0, (name, v.stdout[-2000:], v.stderr[-2000:])
    record("vllm_targets", profiles=out.get("profiles_merged"), wall_s=out["timings"].get("command_wall_s"),
           verify={k: (r["hits"], r["lookups"]) for k, r in results.items()})


GLM_EAGLE = ["--model", "zai-org/GLM-5.1", "--tp", "8", "--moe-runner-backend", "flashinfer_cutlass",
             "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4"]


def test_speculative_target_and_draft_entries(tmp_path):
    """EAGLE (the checkpoint's MTP layer) on GLM-5.1 bf16: one warm writes the target's entry (tuned
    in TARGET_VERIFY shapes) and the draft worker's (key string + ``|draft_quant=None``), both
    verified by replaying the engine's passes, and ``check --strict`` passes on the serving command."""
    root = tmp_path / "cache"
    t0 = time.perf_counter()
    r = warm(GLM_EAGLE, root, "--gpus", "1")
    wall = time.perf_counter() - t0
    by_name = {t["name"]: t for t in r["workers"]}
    assert set(by_name) == {"target", "draft"} and all(t["status"] == "written" for t in by_name.values())
    assert by_name["target"]["key_dir"] != by_name["draft"]["key_dir"]
    verified = {}
    for name, t in by_name.items():
        files = sorted(Path(t["key_dir"]).glob("rank_*.json"))
        assert len(files) == 8 and len({f.read_bytes() for f in files}) == 1
        v = run_cli("verify", t["id"], "--cache-dir", str(root), "--json")
        assert v.returncode == 0, v.stdout + v.stderr[-2000:]
        rep = json.loads(v.stdout)
        assert rep["ok"] and rep["hits"] == rep["lookups"] > 0
        verified[name] = {"lookups": rep["lookups"], "hits": rep["hits"]}
    serve = ["python", "-m", "sglang.launch_server", "--model-path", *GLM_EAGLE[1:]]
    c = run_cli("check", "--strict", "--arch", "sm90", "--cache-dir", str(root), "--", *serve)
    assert c.returncode == 0, c.stdout + c.stderr[-2000:]
    record("speculative_glm51_eagle_1gpu", wall_s=round(wall, 2), profiles_total=r["profiles_total"],
           profiles_tuned=r["profiles_tuned"], timings=r["timings"], verify=verified)


def test_served_workers_tune_warm_after_warm_without_the_start(tmp_path):
    """``fi-autotune workers start`` on the real worker: two warms in a row on the same process (no
    restart), each from a clean session - the engine's startup pass finds every lookup (verify);
    their fixed start (launch to the first profile) is recorded."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    up = run_cli("workers", "start", "--gpus", "1", "--idle-timeout", "300", "--json", env=env, timeout=600)
    assert up.returncode == 0, up.stderr[-3000:]
    pids = [w["pid"] for w in json.loads(up.stdout)["workers"]]
    try:
        starts = []
        for i in range(2):
            root = tmp_path / f"cache{i}"
            launch = time.time()
            r = warm(QWEN, root, "--gpus", "1", "--force", env=env)
            assert r["timings"]["pool"] == {"source": "served"}
            (w,) = r["timings"]["gpu_workers"]
            starts.append(round(r["timings"]["timeline"]["started"] - launch + w["first_profile"], 3))
            v = run_cli("verify", "--model", "Qwen/Qwen3-30B-A3B", "--cache-dir", str(root), "--json", env=env)
            assert v.returncode == 0, v.stdout + v.stderr[-2000:]
            rep = json.loads(v.stdout)
            assert rep["ok"] and rep["hits"] == rep["lookups"] == 42
        status = json.loads(run_cli("workers", "status", "--json", env=env).stdout)
        assert [w["pid"] for w in status["workers"]] == pids and status["workers"][0]["alive"]
        # The fixed start is measured, not asserted: benchmarks/fleet.py (fleet-served) holds the target.
        record("served_workers_qwen3_tp2", fixed_start_s=starts, start_s=json.loads(up.stdout)["seconds"])
    finally:
        run_cli("workers", "stop", env=env)


def test_a_mask_narrows_the_gpus_warm_counts(tmp_path):
    """On the real driver: NVML lists every GPU, CUDA_VISIBLE_DEVICES=<last one> leaves one; --gpus 2 under
    it is a usage error (it died with an IndexError on 4 x H100), --gpus 1 tunes on the GPU it names."""
    from autotune_cache.tune.workers.gpus import visible_gpus

    every = visible_gpus() if "CUDA_VISIBLE_DEVICES" not in os.environ else None
    if not every:
        pytest.skip("run without CUDA_VISIBLE_DEVICES: this test sets its own")
    last = str(len(every) - 1)
    p = run_cli("warm", *QWEN, "--cache-dir", str(tmp_path / "c"), "--gpus", "2", env={"CUDA_VISIBLE_DEVICES": last})
    assert p.returncode == 2 and p.stderr.strip() == (
        f"fi-autotune: error: --gpus 2: CUDA_VISIBLE_DEVICES={last} shows this command 1 GPU(s)"), p.stderr
    r = warm(QWEN, tmp_path / "one", "--gpus", "1", env={"CUDA_VISIBLE_DEVICES": last})
    assert r["status"] == "written"


def test_flashinfer_a2a_warm_tunes_the_alltoall_call_and_verify_finds_it(tmp_path):
    """--moe-a2a-backend flashinfer with DP attention (pasted as SGLang's command): the plan's
    cutlass_fused_moe is the call SGLang's dispatch probe recorded (enable_alltoall, ep = tp, tp 1
    per expert); warm runs it on one GPU, every rank file holds it, and verify's replay of SGLang's
    pass finds every key."""
    root = tmp_path / "cache"
    cmd = ["--", "python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--dp", "2",
           "--enable-dp-attention", "--moe-a2a-backend", "flashinfer", "--moe-runner-backend", "flashinfer_cutlass"]
    plan = json.loads(run_cli("plan", "--arch", "sm90", "--json", "--cache-dir", str(root), *cmd).stdout)["workers"][0]
    (op,) = [o for w in plan["workloads"] for o in w["ops"]]
    assert (op["kwargs"]["enable_alltoall"], op["kwargs"]["ep_size"], op["kwargs"]["tp_size"]) == (True, 2, 1)
    t0 = time.perf_counter()
    proc = run_cli("warm", "--gpus", "1", "--cache-dir", str(root), "--json", *cmd, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    wall = time.perf_counter() - t0
    files = sorted(Path(r["key_dir"]).glob("rank_*.json"))
    assert len(files) == 2
    assert files[0].read_bytes() == files[1].read_bytes()
    v = run_cli("verify", "--cache-dir", str(root), "--json", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--dp", "2",
                "--moe-a2a-backend", "flashinfer", "--moe-runner-backend", "flashinfer_cutlass")
    assert v.returncode == 0, v.stdout + v.stderr[-2000:]
    rep = json.loads(v.stdout)
    assert rep["ok"] and rep["hits"] == rep["lookups"] > 0
    record("qwen3_cutlass_a2a_flashinfer_1gpu", warm_wall_s=round(wall, 2), profiles=r["profiles_total"], verify=rep)


def test_a_pasted_vllm_command_warms_vllms_files(tmp_path):
    """warm -- vllm serve ...: the pasted vLLM command writes vLLM's rank files (the same plan as
    --layout vllm), and they serve vLLM's own recorded call with no profiling in its startup pass."""
    h = "5eed" * 16
    out = warm(["--vllm-config-hash", h, "--gpus", "1"], tmp_path / "vllm", "--", "vllm", "serve", "Qwen/Qwen3-30B-A3B",
               "-tp", "2", "--moe-backend", "flashinfer_cutlass", "--port", "8001")
    vdir = Path(out["key_dir"])
    assert vdir.parts[-4:-1] == ("flashinfer_autotune_cache", "0.7.2.post1", "90a") and vdir.name == h
    golden = json.loads((REPO / "tests" / "data" / "vllm-0.33.0-cutlass_fused_moe-calls.json").read_text())
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "gpu_probes" / "vllm_replay.py"), json.dumps(golden["cases"]["tp2"]),
                           str(vdir), "8192"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    record("pasted_vllm_command", **r)
    assert r["vllm_hit_test"] and r["startup_pass"]["profiled"] == 0 and r["startup_pass"]["hits"] == r["startup_pass"]["lookups"]
