"""The serving options, declared once (plan/options.py): the command line, targets files and the
request builder read the same table."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
import pytest

from autotune_cache.engines.requests import build_request
from autotune_cache.errors import UsageError
from autotune_cache.engines.sglang.serving_command import MODELLED, flag_table
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.options import BY_NAME, GIVEN_OPTIONS, RECORDED_AS, SERVING_OPTIONS, ServingOptions
from fi_autotune_cli.main import cli

#: The manifest's recorded server flags, in the order entries on disk hold them (``to_dict``).
RECORDED_KEYS = (
    "tp", "pp", "dp", "dp_attention", "ep", "dtype", "quantization", "moe_runner_backend", "moe_a2a_backend",
    "skip_ops", "max_running_requests", "cuda_graph_max_bs", "chunked_prefill_size", "autotune_extend",
    "trust_remote_code", "kv_cache_dtype", "page_size", "context_length", "attention_backend",
    "decode_attention_backend", "prefill_attention_backend", "dsa_decode_backend", "speculative_algorithm",
    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
    "speculative_moe_runner_backend", "speculative_draft_model_path", "speculative_attention_mode",
    "fp4_gemm_backend", "disaggregation_mode", "decode_cuda_graph", "moe_fused_finalize", "autotune_disabled_by",
    "gpu_uuids", "config_overrides",
)


def test_the_record_is_the_tables_rows():
    """``ServingOptions`` is generated from the table: a field per row, the row's default."""
    fields = {f.name: f for f in dataclasses.fields(ServingOptions)}
    assert list(fields) == [o.name for o in SERVING_OPTIONS] + ["not_understood"]
    assert all(fields[o.name].default == o.default for o in SERVING_OPTIONS)
    assert BY_NAME == {o.name: o for o in SERVING_OPTIONS if o.given}
    assert [o.name for o in SERVING_OPTIONS if not o.given] == ["autotune_disabled_by"]


def test_the_recorded_flags_are_what_the_table_fills():
    """``ServerFlags`` is written out by hand (the manifest's keys, in the order entries on disk
    hold them): it and the table's ``records`` column fail here when one is edited alone."""
    assert [f.name for f in dataclasses.fields(ServerFlags)] == list(RECORDED_KEYS)
    filled = [o.records for o in SERVING_OPTIONS if o.records is not None]
    assert sorted(filled) == sorted(RECORDED_KEYS) and len(set(filled)) == len(filled)
    # a flag recorded under another name is transformed, explicitly and in one place
    assert {o.name for o in SERVING_OPTIONS if o.records not in (None, o.name)} <= set(RECORDED_AS)
    assert set(RECORDED_AS) <= {o.name for o in SERVING_OPTIONS if o.records is not None}
    assert list(ServingOptions(skip_ops=("b", "a")).flags(("GPU-1",)).to_dict()) == list(RECORDED_KEYS)


def test_the_recorded_form_of_each_transformed_option():
    flags = ServingOptions(no_dp_attention=True, disable_cuda_graph=True, quantization="None", skip_ops="b, a,b",
                           moe_a2a_backend="", kv_cache_dtype="", fp4_gemm_backend="", disaggregation_mode="",
                           gpu_uuids="auto", autotune_disabled_by="--disable-flashinfer-autotune").flags(("GPU-1",))
    assert (flags.dp_attention, flags.decode_cuda_graph, flags.quantization, flags.skip_ops) == \
        (False, False, None, ("a", "b"))
    assert (flags.moe_a2a_backend, flags.kv_cache_dtype, flags.fp4_gemm_backend, flags.disaggregation_mode) == \
        ("none", "auto", "auto", "null")
    assert flags.gpu_uuids == ("GPU-1",) and flags.autotune_disabled_by == "--disable-flashinfer-autotune"
    assert ServingOptions().flags() == ServerFlags()


def test_the_sglang_flags_read_are_the_tables_reads_column():
    table = {f.dest: f for f in flag_table().values()}
    assert MODELLED == {dest: o.name for o in SERVING_OPTIONS for dest in o.reads}
    assert set(MODELLED) <= set(table) and len(MODELLED) == sum(len(o.reads) for o in SERVING_OPTIONS)
    assert all(table[dest].effect == "modelled" for dest in MODELLED)


@pytest.mark.parametrize("command", ["plan", "warm", "check", "verify", "pull"])
def test_the_command_line_and_the_targets_file_take_the_given_options(command):
    ctx = click.Context(cli)
    params = {p.name: p for p in cli.get_command(ctx, command).params}
    for o in GIVEN_OPTIONS:
        assert params[o.name].opts == [o.spelling] and params[o.name].get_default(ctx) == o.default, o.name
    assert "autotune_disabled_by" not in params
    fields = {o.spelling.lstrip("-").replace("-", "_"): o.default for o in GIVEN_OPTIONS}
    assert ServingOptions.from_fields(fields, "t[0]") == ServingOptions()


def test_targets_fields_are_typed_as_the_flags_are():
    opts = ServingOptions.from_fields({"model": "Qwen/Qwen3-30B-A3B", "tp": "4", "dp-attention": False,
                                       "skip_ops": ["b", "a"], "config": "/x/config.json", "page_size": 64,
                                       "speculative_num_steps": 3}, "t[0]")
    assert (opts.tp, opts.no_dp_attention, opts.skip_ops, opts.config_path, opts.page_size) == \
        (4, True, "b,a", "/x/config.json", 64)
    assert opts.flags().skip_ops == ("a", "b") and opts.flags().dp_attention is False


@pytest.mark.parametrize("fields, message", [
    ({"tp": 0}, "'--tp': 0 is not a positive integer"),
    ({"tp": "x"}, "'--tp': 'x' is not a positive integer"),
    ({"tp": True}, "'--tp': True is not a positive integer"),
    ({"autotune_extend": "yes"}, "autotune_extend is true or false"),
    ({"dp_attention": 1}, "dp_attention is true or false"),
    ({"disaggregation_mode": "prefill"}, "'prefill' is not one of 'null', 'decode'"),
    ({"tpp": 2}, "unknown field 'tpp' (known:"),
])
def test_bad_targets_fields_are_one_line_usage_errors(fields, message):
    with pytest.raises(UsageError, match=None) as e:
        ServingOptions.from_fields(fields, "t[1]")
    assert str(e.value).startswith("t[1]: ") and message in str(e.value)


def test_the_builder_checks_sglang_choices_and_needs_a_model():
    with pytest.raises(UsageError, match="give --model"):
        build_request(ServingOptions())
    with pytest.raises(UsageError, match="not one of SGLang's choices|SGLang 0.5.23 takes"):
        build_request(ServingOptions(model="Qwen/Qwen3-30B-A3B", attention_backend="flashinfr"))


def test_engine_options_go_with_their_engine():
    opts = ServingOptions(model="Qwen/Qwen3-30B-A3B")
    with pytest.raises(UsageError, match=r"--vllm-config-hash goes with --layout vllm \(or vllm-dir\)"):
        build_request(opts, engine_options={"vllm_config_hash": "ab" * 32})
    r = build_request(opts, layout="vllm-dir", engine_options={"vllm_config_hash": "ab" * 32})
    assert (r.engine.name, r.engine.layout, r.engine.config_hash) == ("vllm", "vllm-dir", "ab" * 32)
    # the hash is required by the plan, and only where vLLM reads per-rank files (not on one GPU) that
    # it tunes into (not where its MoE runs Triton: auto on Hopper)
    assert build_request(opts, layout="vllm").engine.config_hash == ""
    tp2 = dataclasses.replace(opts, tp=2, arch="sm90")
    with pytest.raises(UsageError, match="needs --vllm-config-hash"):
        build_request(dataclasses.replace(tp2, moe_runner_backend="flashinfer_cutlass"), layout="vllm").plan(
            Path("/nonexistent"))
    assert not build_request(tp2, layout="vllm").plan(Path("/nonexistent")).autotunes


@pytest.mark.parametrize("fields", [
    {"dp_attention": True, "no_dp_attention": True},
    {"no_dp_attention": True, "dp_attention": True},
    {"dp_attention": False, "no_dp_attention": False},
    {"no_dp_attention": False, "dp_attention": False},
])
def test_no_dp_attention_wins_whatever_the_field_order(fields):
    """As the flag: once a field says "no DP attention", the other cannot take it back (the key
    hashes attn_dp_size: a last-one-wins rule would silently name another entry)."""
    assert ServingOptions.from_fields({"tp": 2, "dp": 2, **fields}, "t[0]").no_dp_attention is True


def test_the_unknown_field_message_names_the_files_other_fields():
    with pytest.raises(UsageError) as e:
        ServingOptions.from_fields({"tpp": 2}, "t[0]", also_known=("layouts", "name"))
    known = str(e.value).split("(known: ")[1]
    assert "layouts" in known and "name" in known and "dp_attention" in known and "no_dp_attention" in known
