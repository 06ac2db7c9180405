"""A pasted vLLM serving command, read as vLLM 0.33's own parser reads it, gives the vLLM plan.

The engine comes from the program (``vllm serve``, ``python -m vllm.entrypoints.openai.api_server``),
never from what the flags look like; the flags from the table recorded from vLLM's parser
(``autotune_cache/engines/vllm/data/vllm-0.33.0-flags.json``); and every command of
``tests/data/vllm-0.33.0/matrix.json`` (resolved and built by vLLM's own code,
``tests/oracle/record_vllm.py matrix``) is read and planned as vLLM resolved it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from autotune_cache.engines.requests import read_serving_command
from autotune_cache.engines.vllm.serving_command import FLAG_TABLE, MODELLED, flag_table, human_readable_int
from autotune_cache.errors import UsageError

from ..conftest import run_cli

H = "c0ffee" * 10 + "abcd"
QWEN = "Qwen/Qwen3-30B-A3B"
MATRIX = Path(__file__).resolve().parents[1] / "data" / "vllm-0.33.0" / "matrix.json"


def reading(command: str):
    engine, r = read_serving_command(shlex.split(command))
    return engine.name, r


def opts(command: str) -> dict:
    return reading(command)[1].options


# --- which engine reads it ---------------------------------------------------------------------------

@pytest.mark.parametrize("command", [
    f"vllm serve {QWEN} -tp 2", f"vllm serve --model {QWEN} -tp 2", f"/usr/local/bin/vllm serve {QWEN} -tp 2",
    f"python -m vllm.entrypoints.openai.api_server --model {QWEN} -tp 2",
    f"python3.12 -u -m vllm.entrypoints.openai.api_server --model {QWEN} -tp 2",
    f"python -u -mvllm.entrypoints.openai.api_server --model {QWEN} -tp 2",  # -mMODULE, as Python takes it
    f"VLLM_LOGGING_LEVEL=INFO env CUDA_VISIBLE_DEVICES=0,1 vllm serve {QWEN} -tp 2",
])
def test_every_launcher_of_vllm_is_read_by_vllm(command):
    name, r = reading(command)
    assert name == "vllm" and r.layout == "vllm"
    assert r.options == {"model_path": QWEN, "tp": 2}


@pytest.mark.parametrize("command", [
    f"python -m sglang.launch_server --model-path {QWEN} --tp 2", f"sglang serve {QWEN} --tp 2",
    f"python -msglang.launch_server --model-path {QWEN} --tp 2",
    f"sglang serve --model-path {QWEN} --tp 2", f"sglang serve {QWEN} --model-type llm --tp 2",
    f"--model-path {QWEN} --tp 2",
])
def test_every_launcher_of_sglang_is_read_by_sglang(command):
    name, r = reading(command)
    assert name == "sglang" and r.options == {"model_path": QWEN, "tp": 2}


def test_any_other_program_is_refused_naming_those_read():
    with pytest.raises(UsageError, match=r"^serving command: 'torchrun' starts no server .*vllm serve \(vLLM\)"):
        read_serving_command(["torchrun", "--nproc", "2", "serve.py"])
    with pytest.raises(UsageError, match=r"'python -m trtllm.serve' starts no server"):
        read_serving_command(["python", "-m", "trtllm.serve", "--model", "x"])
    with pytest.raises(UsageError, match="--model-type diffusion: not SGLang's language-model server"):
        read_serving_command(["sglang", "serve", "m", "--model-type", "diffusion"])


# --- vLLM's spellings ----------------------------------------------------------------------------------

def test_vllms_spellings_are_its_parsers():
    base = {"model_path": QWEN, "tp": 2, "moe_runner_backend": "flashinfer_cutlass"}
    for command in (f"vllm serve {QWEN} --tensor-parallel-size 2 --moe-backend flashinfer_cutlass",
                    f"vllm serve {QWEN} --tensor_parallel_size=2 --moe_backend flashinfer_cutlass",
                    f"vllm serve {QWEN} --tensor-parallel 2 --moe-back=flashinfer_cutlass",  # argparse prefixes
                    f"vllm serve -tp 2 --moe-backend flashinfer_cutlass --model {QWEN}",
                    f"vllm serve --model={QWEN} -tp=2 --moe-backend flashinfer_cutlass -O3"):
        assert opts(command) == base, command
    assert opts(f"vllm serve {QWEN} -tp 2 -dp 2 --enable-expert-parallel")["ep"] == 4  # whole experts over tp x dp
    assert "ep" not in opts(f"vllm serve {QWEN} -tp 2 -ep --disable-expert-parallel")  # the last one wins
    assert opts(f"vllm serve {QWEN} --max-num-batched-tokens 16k")["max_num_batched_tokens"] == 16000
    assert opts(f"vllm serve {QWEN} --max-num-batched-tokens 16K")["max_num_batched_tokens"] == 16384
    assert opts(f"vllm serve {QWEN} --disable-flashinfer-autotune")["autotune_disabled_by"] == \
        "--disable-flashinfer-autotune"
    assert "-O0" in opts(f"vllm serve {QWEN} -O0")["autotune_disabled_by"]
    assert "autotune_disabled_by" not in opts(f"vllm serve {QWEN} -O0 --enable-flashinfer-autotune")
    assert "autotune_disabled_by" in opts(f"vllm serve {QWEN} --kernel-config.enable_flashinfer_autotune false")
    assert opts(f"vllm serve {QWEN} --kernel-config '{{\"moe_backend\": \"flashinfer_cutlass\"}}'")[
        "moe_runner_backend"] == "flashinfer_cutlass"


def test_human_readable_int_is_vllms():
    assert [human_readable_int(v) for v in ("8192", "8k", "8K", "2.5k", "1M", "1m")] == \
        [8192, 8000, 8192, 2500, 2**20, 10**6]
    with pytest.raises(Exception, match="Decimals are not allowed with binary suffixes"):
        human_readable_int("2.5K")


def test_vllms_refusals_in_its_own_words():
    cases = {
        f"vllm serve {QWEN} --tensor-parallel-size two": "argument --tensor-parallel-size/-tp: invalid int value: 'two'",
        f"vllm serve {QWEN} --model-path x": "unrecognized arguments: --model-path x",
        f"vllm serve {QWEN} --moe-backend flashinfer_cutlas": "argument --moe-backend: invalid choice: 'flashinfer_cutlas'",
        f"vllm serve {QWEN} --dtype bf16": "argument --dtype: invalid choice: 'bf16'",
        f"vllm serve {QWEN} other": "unrecognized arguments: other",
        "vllm serve -tp 2 --served-model-name m": "`model` should be provided as the first positional argument",
        f"vllm serve {QWEN} --config serve.yaml": "--config: vLLM reads its flags from that YAML file",
        "vllm serve -tp 2": "no model: vLLM would serve its default model",
        f"python -m vllm.entrypoints.openai.api_server {QWEN} -tp 2": "serves --model \\(default Qwen/Qwen3-0.6B\\)",
        f"vllm serve {QWEN} --help": "prints vLLM's help",
        f"vllm serve {QWEN} -O4": "optimization levels are 0, 1, 2 and 3",
        f"vllm serve {QWEN} --disable-flashinfer-autotune --kernel-config.enable_flashinfer_autotune true":
            "are mutually exclusive",
        f"vllm serve {QWEN} --kernel-config.monokernel true": "reads only enable_flashinfer_autotune and moe_backend",
    }
    for command, message in cases.items():
        with pytest.raises(UsageError, match=message):
            reading(command)


def test_dotted_json_flags_are_merged_as_vllm_merges_them():
    from autotune_cache.engines.vllm.serving_command import flexible_args

    args = flexible_args(["m", "--compilation-config.mode", "3", "--compilation_config.cudagraph_capture_sizes+", "1,2",
                      "-O=1"], "vllm serve")
    assert args[:3] == ["m", "--optimization-level", "1"] and "--compilation-config" in args
    assert json.loads(args[args.index("--compilation-config") + 1]) == {"mode": 3, "cudagraph_capture_sizes": ["1", "2"]}
    assert flexible_args(["m", "-O", "3", "-O2"], "vllm serve") == ["m", "--optimization-level", "3", "--optimization-level",
                                                               "2"]


# --- flags and variables by what vLLM's own code showed ----------------------------------------------

def test_flags_are_sorted_by_what_vllms_code_showed():
    _, r = reading(f"vllm serve {QWEN} -tp 2 --port 8001 --gpu-memory-utilization 0.85 --enforce-eager "
                   "--api-key sk-123 sk-456")  # nargs "+": both keys
    assert "--port 8001" in r.ignored and "--enforce-eager" in r.ignored
    assert "--api-key *** ***" in r.ignored and not any("sk-" in x for x in r.ignored)
    with pytest.raises(UsageError, match=r"^serving command: --enable-lora changes what vLLM 0.33 autotunes"):
        reading(f"vllm serve {QWEN} -tp 2 --enable-lora")
    # --hf-overrides changed the experts' top-k on every base: modelled, applied to the config
    _, r = reading(f"vllm serve {QWEN} -tp 2 --hf-overrides '{{\"num_experts_per_tok\": 4}}'")
    assert r.options["json_model_override_args"] == '{"num_experts_per_tok": 4}'
    with pytest.raises(UsageError, match="a function name"):
        reading(f"vllm serve {QWEN} -tp 2 --hf-overrides my_module.fn")


def test_the_environment_is_vllms():
    _, r = reading(f"VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS=a,,b VLLM_CACHE_ROOT=/c HF_TOKEN=secret vllm serve {QWEN} -tp 2")
    assert r.options["skip_ops"] == ("a", "b") and r.options["cache_dir"] == "/c" and r.layout == "vllm"
    assert any(x.startswith("HF_TOKEN=***") for x in r.ignored)
    _, r = reading(f"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR=/tune vllm serve {QWEN} -tp 2")
    assert r.layout == "vllm-dir" and r.options["cache_dir"] == "/tune"
    _, r = reading(f"VLLM_SOMETHING_NEW=1 vllm serve {QWEN}")
    assert any("VLLM_SOMETHING_NEW=1" in x and "vllm.envs" in x for x in r.not_understood)
    _, r = reading(f"VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS= vllm serve {QWEN}")  # empty: skip nothing
    assert r.options["skip_ops"] == ()
    # read where vLLM picks its INT4 MoE kernel; no probe's checkpoint took that branch: not "ignored"
    _, r = reading(f"VLLM_USE_FLASHINFER_MOE_INT4=1 vllm serve {QWEN}")
    assert any(x.startswith("VLLM_USE_FLASHINFER_MOE_INT4=1") for x in r.not_understood)
    with pytest.raises(UsageError, match="VLLM_BATCH_INVARIANT=1 changes what vLLM 0.33 autotunes"):
        reading(f"VLLM_BATCH_INVARIANT=1 vllm serve {QWEN}")
    # SGLang's variables mean nothing to vLLM, and vLLM's FlashInfer MoE switches are its own
    _, r = reading(f"SGLANG_FLASHINFER_MOE_FUSED_FINALIZE=1 vllm serve {QWEN}")
    assert any(x.startswith("SGLANG_FLASHINFER_MOE_FUSED_FINALIZE=1") for x in r.ignored)


def test_the_flag_table_is_vllms_parser_whole():
    data = json.loads(FLAG_TABLE.read_text())
    flags = flag_table()
    assert data["vllm"] == "0.33.0" and len(flags) > 300
    assert {f.effect for f in flags.values()} <= {"modelled", "none", "matters", "reaches", "unknown"}
    assert set(MODELLED) <= set(flags)
    assert "-tp" in flags["tensor_parallel_size"].options and "--no-enable-expert-parallel" in \
        flags["enable_expert_parallel"].negative
    # every flag that changed what vLLM tunes on a base, and that fi-autotune does not read, is refused
    assert {"enable_lora", "speculative_config", "all2all_backend", "enable_eplb"} <= \
        {d for d, f in flags.items() if f.effect == "matters"}
    assert data["flags"]["hf_overrides"]["effect"] == "modelled" and "differs (moe)" in \
        data["flags"]["hf_overrides"]["evidence"]


# --- the plan: the same server, however it is spelled --------------------------------------------------

def _plan(*args: str) -> dict:
    proc = run_cli("plan", "--json", "--arch", "sm90", "--flashinfer-version", "0.7.2.post1", *args)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    (w,) = d["workers"]
    return {k: w[k] for k in ("layout", "key", "key_dir", "rank_files", "workloads", "profiles", "autotunes")}


def test_the_three_launchers_plan_what_the_flags_only_vllm_plan_does(tmp_path):
    root = str(tmp_path / "vllm")
    flags_only = _plan("--cache-dir", root, "--layout", "vllm", "--vllm-config-hash", H, "--model", QWEN, "--tp", "2",
                       "--moe-runner-backend", "flashinfer_cutlass")
    assert flags_only["autotunes"] and flags_only["layout"] == "vllm"
    for launcher in (f"vllm serve {QWEN}", f"vllm serve --model {QWEN}",
                     f"python -m vllm.entrypoints.openai.api_server --model {QWEN}"):
        pasted = _plan("--cache-dir", root, "--vllm-config-hash", H, "--",
                       *shlex.split(launcher), "-tp", "2", "--moe-backend", "flashinfer_cutlass", "--port", "8001")
        assert pasted == flags_only, launcher


def test_a_vllm_command_with_sglangs_layout_is_refused():
    proc = run_cli("plan", "--arch", "sm90", "--layout", "sglang", "--", "vllm", "serve", QWEN, "-tp", "2")
    assert proc.returncode == 2
    assert "--layout sglang is SGLang's tree, but the serving command starts vLLM" in proc.stderr


def test_a_single_gpu_vllm_command_plans_the_managed_store(tmp_path):
    d = _plan("--cache-dir", str(tmp_path), "--", "vllm", "serve", QWEN, "--moe-backend", "flashinfer_cutlass")
    assert d["layout"] == "flashinfer-v2" and d["autotunes"]


def test_a_multi_rank_vllm_command_without_its_hash_says_where_to_find_it():
    proc = run_cli("plan", "--arch", "sm90", "--", "vllm", "serve", QWEN, "-tp", "2", "--moe-backend",
                   "flashinfer_cutlass")
    assert proc.returncode == 2 and "needs --vllm-config-hash" in proc.stderr


# --- vLLM's own resolution of each recorded command ----------------------------------------------------

CASES = json.loads(MATRIX.read_text())["cases"] if MATRIX.is_file() else {}


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_each_recorded_command_is_read_as_vllm_resolved_it(case_id, tmp_path):
    case = CASES[case_id]
    argv = ["plan", "--json", "--arch", case["arch"], "--flashinfer-version", "0.7.2.post1", "--cache-dir",
            str(tmp_path), "--vllm-config-hash", H, "--", *shlex.split(case["command"])]
    proc = run_cli(*argv)
    if "error" in case:  # vLLM refuses the command: so does fi-autotune, with one line
        assert proc.returncode == 2, (case["error"], proc.stdout)
        return
    if proc.returncode == 2:  # refused as not modelled (or not recorded): never where vLLM's MoE is not FlashInfer's
        assert any(w in proc.stderr for w in ("not model", "not recorded", "changes what vLLM 0.33 autotunes")), \
            proc.stderr
        assert any((k.get("experts_module") or "").rsplit(".", 1)[-1].startswith(("flashinfer_", "trtllm_"))
                   for k in case["view"]["moe"]["kinds"]), proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    (w,) = json.loads(proc.stdout)["workers"]
    view = case["view"]
    par, tokens, topo = view["parallel"], view["tokens"], w["resolution"]["topology"]
    assert (topo["tp"], topo["pp"], topo["dp"]) == (par["tp"], par["pp"], par["dp"])
    single = view["store"]["world_size"] == 1 and view["store"]["pp"] == 1
    assert (w["layout"] == "flashinfer-v2") == single
    gate = view["gate"]["enable_flashinfer_autotune"] is not False
    kinds = view["moe"]["kinds"]
    flashinfer = any((k.get("experts_module") or "").rsplit(".", 1)[-1].startswith(("flashinfer_", "trtllm_"))
                     for k in kinds)
    skipped = set(view["skip_ops"] or ()) >= {"trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2"}
    assert w["autotunes"] == (gate and flashinfer and not skipped), (w["reasons"], kinds)
    if w["autotunes"]:
        (k,) = kinds
        r = w["resolution"]
        assert (r["experts_per_rank"], r["moe_intermediate_per_partition"]) == (k["experts_local"],
                                                                              k["intermediate_per_partition"])
        assert r["chunked_prefill_size"] == tokens["max_num_batched_tokens"]


def test_every_launcher_form_of_one_sglang_server_plans_the_same(tmp_path):
    root = str(tmp_path / "sglang")
    flags = ["--tp", "2", "--moe-runner-backend", "flashinfer_cutlass"]
    plans = [_plan("--cache-dir", root, "--", *shlex.split(launcher), *flags)
             for launcher in (f"python3 -m sglang.launch_server --model-path {QWEN}", f"sglang serve {QWEN}",
                              f"sglang serve --model-path {QWEN} --model-type llm", f"--model-path {QWEN}")]
    assert plans[0]["autotunes"] and plans[0]["layout"] == "sglang"
    assert all(p == plans[0] for p in plans[1:])
