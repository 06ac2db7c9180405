"""Golden plans: what SGLang 0.5.23 would run, derived by hand from its source (see each docstring)."""

from __future__ import annotations

import json

import pytest

from autotune_cache.errors import UsageError
from autotune_cache.plan.tuning import pp_layer_ranges
from autotune_cache.engines.sglang.planner import make_plan
from autotune_cache.autotuner.recipe import T
from autotune_cache.plan.flags import ServerFlags

from ..conftest import run_cli

from autotune_cache.plan.config_source import PRESETS_DIR as REF  # copies of shared/reference/model_configs


def plan(model, arch, tmp_path, **flags):
    return make_plan(model, ServerFlags(**flags), arch, cache_root=tmp_path, flashinfer_version="0.7.2.post1")


def only_op(p, api_suffix):
    ops = [o for w in p.workloads for o in w.ops if o.recipe.api.endswith(api_suffix)]
    assert len(ops) == 1, [o.recipe.api for w in p.workloads for o in w.ops]
    return ops[0]


def tensors(op):
    return {k: (v.shape, v.dtype) for k, v in op.recipe.kwargs.items() if isinstance(v, T)}


def test_glm51_fp8_tp8_dp8_sm100(tmp_path):
    """GLM-5.1-FP8 (GlmMoeDsaForCausalLM, block FP8 128x128) on sm100, TP8 + DP8 attention.

    overrides.py _deepseek_moe_quant_resolution: sm100 + DeepSeek family -> quantization = the
    checkpoint's quant_method "fp8", moe_runner_backend auto -> flashinfer_trtllm. MoE TP = tp/ep = 8,
    so intermediate_size per partition = 2048 / 8 = 256; all 256 experts local; top-8; DeepSeekV3
    routing with n_group 1 / topk_group 1 and routed_scaling_factor 2.5 from config.json.
    flashinfer_trtllm.py _run_fp8_block_scale_moe: hidden_states fp8 [M, 6144], its scale a_sf.t()
    [6144/128, M] fp32, w13 [256, 2*256, 6144] with [256, 512/128, 6144/128] scales, w2 [256, 6144, 256]
    with [256, 48, 2] scales, use_shuffled_weight False (not MXFP8), tune_max = next_power_of_2(M).
    Dummy pass: the EagerRunner's, at the request pool (2048-4096 per DP rank, sized from KV memory),
    gathered x8 at the MoE -> up to 32768 tokens (tests/data/sglang-0.5.23: SGLang's own code).
    """
    p = plan("zai-org/GLM-5.1-FP8", "sm100", tmp_path, tp=8, dp=8)
    assert p.key == "d99390dfa961185d"
    r = p.resolution
    assert (r.quantization, r.moe_runner_backend, r.attn_dp_size) == ("fp8", "flashinfer_trtllm", 8)
    assert (r.experts_per_rank, r.moe_intermediate_per_partition, r.moe_tokens) == (256, 256, 32768)
    assert len(p.workloads) == 1 and len(p.workloads[0].ranks) == 8
    op = only_op(p, "trtllm_fp8_block_scale_moe")
    kw = op.recipe.kwargs
    assert op.recipe.custom_ops == ("flashinfer::trtllm_fp8_block_scale_moe",)
    assert {k: kw[k] for k in ("num_experts", "top_k", "n_group", "topk_group", "intermediate_size",
                                "local_expert_offset", "local_num_experts", "routed_scaling_factor",
                                "use_shuffled_weight")} == {
        "num_experts": 256, "top_k": 8, "n_group": 1, "topk_group": 1, "intermediate_size": 256,
        "local_expert_offset": 0, "local_num_experts": 256, "routed_scaling_factor": 2.5, "use_shuffled_weight": False}
    assert kw["routing_method_type"] == 2 and kw["fp8_quantization_type"].value == 1
    assert tensors(op) == {
        "routing_logits": (("M", 256), "float32"),
        "routing_bias": ((256,), "float32"),  # the e_score_correction_bias SGLang passes (fp32)
        "hidden_states": (("M", 6144), "float8_e4m3fn"),
        "hidden_states_scale": ((48, "M"), "float32"),
        "gemm1_weights": ((256, 512, 6144), "float8_e4m3fn"),
        "gemm1_weights_scale": ((256, 4, 48), "float32"),
        "gemm2_weights": ((256, 6144, 256), "float8_e4m3fn"),
        "gemm2_weights_scale": ((256, 48, 2), "float32"),
        "output": (("M", 6144), "bfloat16"),
    }
    assert op.recipe.layers == 78 - 3  # first_k_dense_replace = 3
    # every key the engine's dummy pass (up to 4096 x 8 tokens) looks up is tuned; serving reaches
    # 2048 tokens per DP rank (16384 / 8, parallel_hook.py) x 8 = 16384: nothing above 32768
    assert set(op.engine_keys) <= set(op.buckets) and op.added == ()
    assert max(op.engine_keys) == 32768 == op.buckets[-1]


def test_glm51_fp8_on_sm90_says_sglang_would_not_autotune(tmp_path):
    p = plan("zai-org/GLM-5.1-FP8", "sm90", tmp_path, tp=8, dp=8)
    assert not p.autotunes and p.profiles == 0
    assert p.resolution.key_fields.quantization is None and p.resolution.moe_runner_backend == "auto"
    (reason,) = p.resolution.reasons
    assert "should_run_flashinfer_autotune() is False" in reason and "block-FP8" in reason
    proc = run_cli("plan", "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--dp", "8", "--arch", "sm90", "--cache-dir", str(tmp_path))
    assert proc.returncode == 0 and "Autotune    NO" in proc.stdout and "warm writes nothing" in proc.stdout


def test_deepseek_v3_tp8_sm100(tmp_path):
    """DeepSeek-V3, TP8 on sm100 without dp-attention: MoE TP 8 -> intermediate 2048/8 = 256, 256 local
    experts; config n_group 8 / topk_group 4. The dummy pass runs at the request pool (up to 4096
    per rank, no gather) -> the MoE's keys run up to 4096; serving chunks (16k) up to 16384.
    MLA decode (trtllm_mla_backend.py, default attention on sm100 for DeepseekV3ForCausalLM):
    query [M, 1, 128/8 = 16 heads, 512 + 64], sparse_mla_top_k 0 (not DSA); FlashInfer tunes it on
    the fixed grid up to 8192 whatever the batch."""
    p = plan("deepseek-ai/DeepSeek-V3", "sm100", tmp_path, tp=8)
    assert p.key_string == (
        "deepseek-ai/DeepSeek-V3|torch.bfloat16|fp8|flashinfer_trtllm|8|1|1|1|DeepseekV3Config|"
        "candidate_selection=v2_default|skip_ops=")
    moe = only_op(p, "trtllm_fp8_block_scale_moe")
    kw = moe.recipe.kwargs
    assert (kw["n_group"], kw["topk_group"], kw["intermediate_size"], kw["local_num_experts"]) == (8, 4, 256, 256)
    assert tensors(moe)["gemm1_weights"] == ((256, 512, 7168), "float8_e4m3fn")
    assert max(moe.engine_keys) == 4096 and moe.buckets[-1] == 16384
    (mla,) = [o for w in p.workloads for o in w.ops if o.recipe.id == "attn.mla_decode.decode"]
    assert tensors(mla)["query"] == (("M", 1, 16, 576), "bfloat16")
    assert mla.recipe.kwargs["sparse_mla_top_k"] == 0 and mla.recipe.kwargs["max_seq_len"] == 1
    assert mla.buckets[-1] == 8192 == max(mla.engine_keys)


def test_qwen3_235b_fp8_ep8_sm100(tmp_path):
    """Qwen3-235B-A22B-FP8, TP8 EP8 on sm100. qwen3_moe.py overrides: quantization = quant_method
    "fp8" (block 128x128), backend flashinfer_trtllm. EP 8 -> 128/8 = 16 local experts; MoE TP =
    tp/ep = 1 -> intermediate 1536. Routing Renormalize (models/qwen3_moe.py), no group routing."""
    p = plan("Qwen/Qwen3-235B-A22B-FP8", "sm100", tmp_path, tp=8, ep=8)
    assert p.resolution.key_fields.config_class == "Qwen3MoeConfig" and p.resolution.key_fields.ep == 8
    op = only_op(p, "trtllm_fp8_block_scale_moe")
    kw = op.recipe.kwargs
    assert (kw["local_num_experts"], kw["num_experts"], kw["intermediate_size"], kw["top_k"]) == (16, 128, 1536, 8)
    assert kw["routing_method_type"] == 1 and kw["n_group"] is None and kw["routing_bias"] is None
    assert tensors(op)["gemm1_weights"] == ((16, 3072, 4096), "float8_e4m3fn")
    assert tensors(op)["routing_logits"] == (("M", 128), "bfloat16")
    # EP ranks differ only in local_expert_offset, which never reaches a key: one workload
    assert len(p.workloads) == 1 and len(p.workloads[0].ranks) == 8


def test_gpt_oss_120b_tp4(tmp_path):
    """gpt-oss-120b (MXFP4 experts, 128 experts top-4, expert width 2880, biases, swiglu_limit 7).
    sm100: gpt_oss.py overrides -> flashinfer_mxfp4, dtype forced bfloat16, server quantization unset;
    trtllm_fp4_block_scale_moe with MXFP8 activations and packed e2m1 weights; hidden padded 2880 ->
    3072 (FusedMoE, to 256) and the expert width sharded in whole 32-blocks (ceil(90/4) x 32 = 736)
    then padded to 768 (mxfp4.py): w13 [128, 2*768, 3072/2] (SGLang's own call, tests/data).
    sm90 defaults to triton_kernel (no autotune); with --moe-runner-backend flashinfer_mxfp4 SGLang
    runs cutlass_fused_moe W4A16 (use_w4_group_scaling)."""
    p100 = plan("openai/gpt-oss-120b", "sm100", tmp_path, tp=4)
    f = p100.resolution.key_fields
    assert (f.dtype, f.quantization, f.moe_runner_backend, f.config_class) == ("torch.bfloat16", None, "flashinfer_mxfp4", "GptOssConfig")
    op = only_op(p100, "trtllm_fp4_block_scale_moe")
    t = tensors(op)
    assert t["gemm1_weights"] == ((128, 1536, 1536), "uint8")
    assert t["gemm1_weights_scale"] == ((128, 1536, 96), "float8_e4m3fn")
    assert t["gemm2_weights"] == ((128, 3072, 384), "uint8")
    assert t["hidden_states"] == (("M", 3072), "float8_e4m3fn") and t["gemm1_bias"] == ((128, 1536), "float32")
    assert t["output"] == (("M", 2880), "bfloat16")

    p90 = plan("openai/gpt-oss-120b", "sm90", tmp_path, tp=4)
    assert not p90.autotunes and p90.resolution.moe_runner_backend == "triton_kernel"
    p90mx = plan("openai/gpt-oss-120b", "sm90", tmp_path, tp=4, moe_runner_backend="flashinfer_mxfp4")
    op = only_op(p90mx, "cutlass_fused_moe")
    assert op.recipe.kwargs["use_w4_group_scaling"] is True
    assert tensors(op)["fc1_expert_weights"] == ((128, 1536, 1536), "uint8")
    assert tensors(op)["input"] == (("M", 3072), "bfloat16")
    assert p90mx.key != p90.key  # the backend is part of the key


def test_llama31_70b_instruct_fp8_tp4_sm90(tmp_path):
    """nvidia/Llama-3.1-70B-Instruct-FP8: ModelOpt FP8 in hf_quant_config.json (preset sidecar).
    ModelConfig.quantization = modelopt_fp8 but the server's --quantization stays unset: the key has
    "None" and "auto". should_run_flashinfer_autotune: modelopt_fp8 -> flashinfer_per_tensor_fp8_supported.
    ModelOptFp8LinearMethod.apply -> apply_fp8_linear_bmm_flashinfer -> bmm_fp8(q[1,M,K], w[1,K,N]
    col-major, backend="cublas"). TP4 shapes: qkv K 8192 N (64/4)*128 + 2*(8/4)*128 = 2560;
    o_proj K 2048 N 8192; gate_up K 8192 N 2*28672/4 = 14336; down K 7168 N 8192.
    The dummy pass runs at the request pool (up to 4096 per rank); chunked prefill 8192."""
    p = plan("nvidia/Llama-3.1-70B-Instruct-FP8", "sm90", tmp_path, tp=4)
    assert p.source.kind == "preset" and p.source.quant_sidecar is not None
    assert p.key_string == (
        "nvidia/Llama-3.1-70B-Instruct-FP8|torch.bfloat16|None|auto|4|1|1|1|LlamaConfig|"
        "candidate_selection=v2_default|skip_ops=")
    (w,) = p.workloads
    shapes = {o.recipe.id: (o.recipe.kwargs["A"].shape, o.recipe.kwargs["B"].shape, o.recipe.kwargs["B"].layout) for o in w.ops}
    assert shapes == {
        "linear.qkv_proj": ((1, "M", 8192), (1, 8192, 2560), "column_major"),
        "linear.o_proj": ((1, "M", 2048), (1, 2048, 8192), "column_major"),
        "linear.gate_up_proj": ((1, "M", 8192), (1, 8192, 14336), "column_major"),
        "linear.down_proj": ((1, "M", 7168), (1, 7168, 8192), "column_major"),
    }
    assert all(o.recipe.kwargs["backend"] == "cublas" and o.recipe.custom_ops == ("fp8_gemm",) for o in w.ops)
    qkv = w.ops[0]
    assert qkv.buckets[-1] == 8192 and max(qkv.engine_keys) == 4096
    assert p.profiles == 4 * len(qkv.buckets)
    assert qkv.recipe.file_keys(128) == [
        "('fp8_gemm', 'CublasFp8GemmRunner', ((1, 128, 8192), (1, 8192, 2560), (1,), (1,), (1, -1, 2560), (-1,)), "
        "(torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16))"]


def test_qwen3_30b_cutlass_tp2_sm90_keys(tmp_path):
    """Qwen3-30B-A3B bf16 with --moe-runner-backend flashinfer_cutlass at TP2 on sm90:
    cutlass_fused_moe(input [M, 2048], fc1 [128, 2*384, 2048], fc2 [128, 2048, 384]); SGLang's
    tune_max_num_tokens = min(8192 x 1, 8192) (flashinfer_cutlass.py _cutlass_moe_tune_max_num_tokens)."""
    p = plan("Qwen/Qwen3-30B-A3B", "sm90", tmp_path, tp=2, moe_runner_backend="flashinfer_cutlass")
    op = only_op(p, "cutlass_fused_moe")
    assert op.buckets == op.engine_keys and op.buckets[-1] == 8192 and len(op.buckets) == 21
    assert op.recipe.file_keys(16) == [
        f"('trtllm::fused_moe::{g}', 'MoERunner', ((16, 2048), (128, 768, 2048), (0,), (128, 2048, 384), (0,)), "
        "(torch.bfloat16, torch.bfloat16, torch.bfloat16, 8, 2, 1, 1, False, False, False, False, False, False, True, 3, False, False))"
        for g in ("gemm1", "gemm2")]


def test_engine_keys_outside_the_superset_are_added(tmp_path):
    """--max-tokens below the engine's own maximum, and a cutlass tune_max that is not a grid value
    (chunked prefill 3000 -> SGLang tunes up to 3000 and looks M >= 3000 up under 3000)."""
    p = plan("Qwen/Qwen3-30B-A3B", "sm90", tmp_path, tp=2, moe_runner_backend="flashinfer_cutlass", chunked_prefill_size=3000)
    op = only_op(p, "cutlass_fused_moe")
    assert op.buckets[-1] == 3000 and 3000 in op.engine_keys and op.added == ()  # the superset follows the engine
    p = make_plan("Qwen/Qwen3-30B-A3B", ServerFlags(tp=2, moe_runner_backend="flashinfer_cutlass", chunked_prefill_size=3000),
                  "sm90", cache_root=tmp_path, flashinfer_version="x", max_tokens=2048)
    op = only_op(p, "cutlass_fused_moe")
    assert op.added == (2560, 3000) and op.buckets[-2:] == (2560, 3000)
    small = make_plan("nvidia/Llama-3.1-70B-Instruct-FP8", ServerFlags(tp=4, max_running_requests=160), "sm90",
                      cache_root=tmp_path, flashinfer_version="x", max_tokens=64)
    op = small.workloads[0].ops[0]
    # a pool of 160 requests -> the dummy pass's 160 is looked up as 256 (map_to_hybrid_bucket_uncapped)
    assert 256 in op.engine_keys and 160 not in op.engine_keys
    assert op.added == (128, 256) and set(op.engine_keys) <= set(op.buckets)


def test_dp_gather_48x8(tmp_path):
    """--max-running-requests 384 under DP8 attention: 48 per DP rank, the MoE sees 384 tokens;
    trtllm passes tune_max_num_tokens = 512, so the engine's keys run up to 512."""
    p = plan("zai-org/GLM-5.1-FP8", "sm100", tmp_path, tp=8, dp=8, max_running_requests=384)
    op = only_op(p, "trtllm_fp8_block_scale_moe")
    assert p.resolution.moe_tokens == 384 and max(op.engine_keys) == 512
    assert set(op.engine_keys) <= set(op.buckets)


def test_pp_stages_and_layer_split():
    assert pp_layer_ranges(61, 2) == [(0, 30), (30, 61)]  # sglang get_pp_indices: extra to the last
    assert pp_layer_ranges(80, 3) == [(0, 26), (26, 53), (53, 80)]


@pytest.mark.parametrize("path", sorted(p for p in REF.glob("*.json") if not p.stem.endswith(".hf_quant_config")), ids=lambda p: p.stem)
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("topo", [dict(tp=1), dict(tp=8, dp=8), dict(tp=8, ep=8), dict(tp=4, pp=2), dict(tp=2, dp=2, dp_attention=False)])
def test_every_reference_model_plans(tmp_path, path, arch, topo):
    """Every reference config, from --config (a real file), on both targets and several topologies."""
    model = path.stem.replace("--", "/")
    p = make_plan(model, ServerFlags(**topo), arch, config=str(path), cache_root=tmp_path, flashinfer_version="0.7.2.post1")
    json.dumps(p.to_dict())  # the warm input serializes
    assert p.source.kind == "config-file"
    assert len(p.rank_files) == topo.get("tp", 1) * topo.get("pp", 1) * (topo.get("dp", 1) if topo.get("dp_attention") is False else 1)
    for w in p.workloads:
        for op in w.ops:
            assert set(op.engine_keys) <= set(op.buckets)
            assert op.recipe.file_keys(op.buckets[0])


@pytest.mark.parametrize("flags,needle", [
    (dict(tp=8, dp=3), "divisible"),
    (dict(tp=4, ep=3), "must divide"),
    (dict(tp=1, moe_runner_backend="bogus"), "unknown --moe-runner-backend"),
    (dict(tp=1, chunked_prefill_size=-5), "chunked-prefill-size"),
])
def test_invalid_topology_for_the_model(tmp_path, flags, needle):
    with pytest.raises(UsageError, match=needle):
        plan("Qwen/Qwen3-30B-A3B", "sm90", tmp_path, **flags)


def test_plan_cli_json_and_errors(tmp_path):
    proc = run_cli("plan", "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--dp", "8", "--arch", "sm100", "--json", "--cache-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (d,) = json.loads(proc.stdout)["workers"]
    assert d["key"] == "d99390dfa961185d" and d["autotunes"] and d["source"]["kind"] == "preset"
    assert d["key_dir"].endswith("flashinfer/autotune/0.7.2.post1/sm100/d99390dfa961185d") or "/sm100/d99390dfa961185d" in d["key_dir"]
    human = run_cli("plan", "--model", "zai-org/GLM-5.1-FP8", "--tp", "8", "--dp", "8", "--arch", "sm100", "--cache-dir", str(tmp_path))
    assert "built-in preset" in human.stdout and "256 experts, top-8; per rank 256 experts, intermediate 256" in human.stdout
    for args, code, needle in [
        (["--model", "nobody/nothing", "--arch", "sm90"], 2, "no config for 'nobody/nothing'"),
        (["--model", "zai-org/GLM-5.1-FP8", "--arch", "sm80"], 2, "supported targets"),
        (["--model", "zai-org/GLM-5.1-FP8", "--tp", "0", "--arch", "sm90"], 2, "0 is not in the range"),
        (["--model", "zai-org/GLM-5.1-FP8"], 2, "pass --arch"),
    ]:
        # the last needs a host without a GPU: on a GPU host, CUDA_VISIBLE_DEVICES="" makes one
        proc = run_cli("plan", *args, "--cache-dir", str(tmp_path), env={"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""})
        assert proc.returncode == code and needle in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
