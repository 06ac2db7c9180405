"""Skeleton layers at the argument level, on CPU, with a recorder in place of the FlashInfer op.

This is how the sm100 recipes (trtllm-gen MoE, mm_fp4, MLA decode) are tested here: no Blackwell
GPU is lent, so the recorder checks the exact keyword arguments our code would hand FlashInfer.
The sm90 recipes are additionally run for real in tests/tune/test_gpu.py.
"""

from __future__ import annotations

import pytest

from autotune_cache import lm_head_stub, lm_head_stubbed
from autotune_cache.engines.sglang.planner import make_plan
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.tune.session.work import work_queue
from autotune_cache.tune.careful.workdir import merge_cache_files
from autotune_cache.errors import FiAutotuneError
from autotune_cache.autotuner.rankfile import cache_file_bytes

from tests.support.lazy import importorskip_lazily

# Imported by the first test that uses them, not while collecting (tests/support/lazy.py); without
# torch the module is skipped here, at collection, as before. The skeleton imports torch.
torch = importorskip_lazily("torch")
skeleton = importorskip_lazily("autotune_cache.tune.workers.skeleton")


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)


def ops_of(model, arch, **flags):
    import tempfile

    p = make_plan(model, ServerFlags(**flags), arch, cache_root=tempfile.mkdtemp(), flashinfer_version="0.7.2.post1").to_dict()
    return p, [op for w in p["workloads"] for op in w["ops"]]


def shape_dtype(x):
    return (tuple(x.shape), str(x.dtype).replace("torch.", ""))


def test_glm51_fp8_block_moe_arguments_sm100():
    _, ops = ops_of("zai-org/GLM-5.1-FP8", "sm100", tp=8, dp=8)
    moe = next(o for o in ops if o["api"].endswith("trtllm_fp8_block_scale_moe"))
    rec = Recorder()
    layer = skeleton.OpLayer(moe, "meta", api=rec)  # 1.2 GB of expert weights: shapes, dtypes, strides only
    layer(48 * 8)
    (kw,) = rec.calls
    assert shape_dtype(kw["hidden_states"]) == ((384, 6144), "float8_e4m3fn")
    assert shape_dtype(kw["hidden_states_scale"]) == ((48, 384), "float32")
    assert shape_dtype(kw["gemm1_weights"]) == ((256, 512, 6144), "float8_e4m3fn")
    assert shape_dtype(kw["gemm2_weights_scale"]) == ((256, 48, 2), "float32")
    assert shape_dtype(kw["routing_logits"]) == ((384, 256), "float32")
    assert kw["tune_max_num_tokens"] == 512  # next_power_of_2(384), as flashinfer_trtllm.py passes it
    assert (kw["num_experts"], kw["top_k"], kw["intermediate_size"], kw["local_num_experts"]) == (256, 8, 256, 256)
    assert int(kw["routing_method_type"]) == 2 and int(kw["fp8_quantization_type"]) == 1


def test_synthetic_fp8_and_bf16_values_are_finite():
    from autotune_cache.tune.workers.skeleton import _fill

    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float8_e4m3fn, torch.bfloat16):
        for fill in ("weight", "activation", "scale", "router_logits", "bias"):
            x = _fill((64, 256), dtype, fill, "row_major", "cpu", gen, {})
            assert torch.isfinite(x.float()).all(), (dtype, fill)


def test_gpt_oss_mxfp4_arguments_sm100_and_packed_values_are_finite():
    _, ops = ops_of("openai/gpt-oss-20b", "sm100", tp=4)
    (moe,) = ops
    rec = Recorder()
    skeleton.OpLayer(moe, "cpu", api=rec)(7)
    (kw,) = rec.calls
    # SGLang's own call (tests/data/sglang-0.5.23): hidden 2880 padded to 3072, the expert width
    # sharded in whole 32-blocks (ceil(90 / 4) x 32 = 736) then padded to 768; MXFP8 activations.
    assert shape_dtype(kw["gemm1_weights"]) == ((32, 1536, 1536), "uint8")  # 2 x 768 rows, 3072/2 bytes
    assert shape_dtype(kw["gemm1_weights_scale"]) == ((32, 1536, 96), "float8_e4m3fn")
    assert shape_dtype(kw["hidden_states"]) == ((7, 3072), "float8_e4m3fn")
    for name in ("gemm1_weights_scale", "hidden_states", "hidden_states_scale"):
        assert torch.isfinite(kw[name].float()).all(), name


def test_bmm_fp8_weight_is_column_major_and_scales_are_scalars():
    _, ops = ops_of("nvidia/Llama-3.1-70B-Instruct-FP8", "sm90", tp=4)
    rec = Recorder()
    skeleton.OpLayer(ops[0], "cpu", api=rec)(16)
    (kw,) = rec.calls
    a, b = kw["A"], kw["B"]
    assert a.shape == (1, 16, 8192) and b.shape == (1, 8192, 2560)
    assert b.stride() == (8192 * 2560, 1, 8192)  # column-major [K, N], as fp8_utils.py passes weight.t()
    assert kw["A_scale"].shape == (1,) and kw["dtype"] == torch.bfloat16 and kw["backend"] == "cublas"


@pytest.fixture(scope="module")
def qwen_cutlass():
    """Qwen3-30B-A3B's skeleton on CPU with a recorder in place of its MoE call, built once for
    this module (its tests run in one test process: the "torch" xdist group, tests/conftest.py).
    Its first layer is ``OpLayer(ops[0], "cpu", seed=0, api=recorder)``; each test clears the
    recorder. At tp=8 its expert weights are ~75M random values (1 CPU-s to build; 6 at tp=2):
    what these tests check (routing, token inputs per bucket) is the same at any tp."""
    _, ops = ops_of("Qwen/Qwen3-30B-A3B", "sm90", tp=8, moe_runner_backend="flashinfer_cutlass")
    rec = Recorder()
    model = skeleton.SkeletonModel(ops, hidden=2048, vocab=1000, tp=8, dp=1, dtype="bfloat16", device="cpu", apis={ops[0]["api"]: rec})
    return ops, model, rec


def test_cutlass_moe_routing_ids_are_valid_expert_indices(qwen_cutlass):
    ops, model, rec = qwen_cutlass
    layer = model.layers[0]
    assert isinstance(layer, skeleton.OpLayer) and layer.op is ops[0] and layer.api is rec
    rec.calls.clear()
    layer(33)
    (kw,) = rec.calls
    ids = kw["token_selected_experts"]
    assert ids.dtype == torch.int32 and ids.shape == (33, 8)
    assert int(ids.min()) >= 0 and int(ids.max()) < 128
    assert all(len(set(row.tolist())) == 8 for row in ids)  # top-k picks distinct experts
    assert torch.allclose(kw["token_final_scales"].sum(-1), torch.ones(33))
    assert int(kw["activation_type"]) == 3


def test_token_inputs_are_the_same_for_one_bucket_every_time(qwen_cutlass):
    """Every race of one (op, bucket) must time the same routing (a MoE call's time and its tactics'
    order depend on which experts the tokens pick): a bucket's inputs do not change between calls,
    nor with the calls made in between; another bucket draws another."""
    ops, model, rec = qwen_cutlass
    layer = model.layers[0]
    first = layer.call_kwargs(4)
    layer.call_kwargs(8)
    again = layer.call_kwargs(4)
    for name in ("token_selected_experts", "token_final_scales", "input"):
        assert torch.equal(first[name], again[name]), name
    assert not torch.equal(layer.call_kwargs(5)["token_selected_experts"][:4], first["token_selected_experts"])
    # another draw of the same bucket (a race rotating its inputs): other routing, the same weights
    other = layer.call_kwargs(4, draw=1)
    assert torch.equal(layer.call_kwargs(4, draw=0)["token_selected_experts"], first["token_selected_experts"])
    assert not torch.equal(other["token_selected_experts"], first["token_selected_experts"])
    assert other["fc1_expert_weights"] is first["fc1_expert_weights"]


def test_every_api_named_by_a_recipe_exists_in_flashinfer():
    names = set()
    for model, arch, flags in [("zai-org/GLM-5.1-FP8", "sm100", dict(tp=8, dp=8)), ("openai/gpt-oss-120b", "sm100", dict(tp=4)),
                               ("zai-org/GLM-5.1", "sm100", dict(tp=8)), ("nvidia/Llama-3.1-70B-Instruct-FP8", "sm90", dict(tp=4)),
                               ("Qwen/Qwen3-30B-A3B", "sm90", dict(tp=2, moe_runner_backend="flashinfer_cutlass"))]:
        names |= {o["api"] for o in ops_of(model, arch, **flags)[1]}
    for name in names:
        assert callable(skeleton.resolve_api(name)), name


def test_lm_head_stub_skips_the_vocab_sized_buffer():
    head = skeleton.LMHead(hidden=64, vocab=1000, tp=4, dp=2, dtype=torch.bfloat16, device="cpu")
    x = torch.zeros(3, 64, dtype=torch.bfloat16)
    full = head(x)
    assert full.shape == (6, 1000) and full.dtype == torch.float32  # [tokens x dp, vocab] after the all-gather
    with lm_head_stub():
        assert lm_head_stubbed()
        assert head(x).shape == (3, 0)
    assert not lm_head_stubbed()


def test_lm_head_stub_patches_and_restores_foreign_modules():
    lin = torch.nn.Linear(8, 100)
    x = torch.zeros(5, 8)
    with pytest.raises(RuntimeError):
        with lm_head_stub(lin):
            assert lin(x).shape == (5, 0)
            raise RuntimeError("boom")
    assert lin(x).shape == (5, 100) and "forward" not in vars(lin)


def test_skeleton_runs_layers_at_their_token_counts(qwen_cutlass):
    _, model, rec = qwen_cutlass
    rec.calls.clear()
    with lm_head_stub():
        out = model(lambda op: 12, lm_tokens=12)
    assert out.shape == (12, 0) and rec.calls[0]["input"].shape == (12, 2048)


def test_work_queue_order():
    ops = [{"buckets": [1, 2, 4, 8], "custom_ops": ["a"]}, {"buckets": [1, 2], "custom_ops": ["b", "c"]}]
    # op by op, largest first; bucket 2 of op 1 was already done
    assert work_queue(ops, [set(), {2}]) == [(0, 8), (0, 4), (0, 2), (0, 1), (1, 1)]


def test_merge_refuses_mixed_environments(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(cache_file_bytes({"gpu": "NVIDIA H100 80GB HBM3"}, {"k1": ["R", 1]}))
    b.write_bytes(cache_file_bytes({"gpu": "NVIDIA H200"}, {"k2": ["R", 2]}))
    with pytest.raises(FiAutotuneError, match="different environments"):
        merge_cache_files([a, b])
    b.write_bytes(cache_file_bytes({"gpu": "NVIDIA H100 80GB HBM3"}, {"k2": ["R", 2]}))
    meta, entries = merge_cache_files([a, b])
    assert entries == {"k1": ["R", 1], "k2": ["R", 2]}


def test_recipe_roundtrips_through_plan_json():
    from autotune_cache.autotuner.recipe import OpRecipe

    _, ops = ops_of("Qwen/Qwen3-30B-A3B", "sm90", tp=2, moe_runner_backend="flashinfer_cutlass")
    r = OpRecipe.from_dict(ops[0])
    assert r.to_dict() == {k: v for k, v in ops[0].items() if k in r.to_dict()}
    assert r.file_keys(64)[0].startswith("('trtllm::fused_moe::gemm1', 'MoERunner', ((64, 2048),")
