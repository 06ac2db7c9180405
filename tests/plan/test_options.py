"""The serving options, declared once (plan/options.py): the command line, targets files and the
request builder read the same table."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune_cache.engines.requests import build_request
from autotune_cache.errors import UsageError
from autotune_cache.plan.options import BY_NAME, SERVING_OPTIONS, ServingOptions


def test_every_option_is_a_field_and_every_user_field_an_option():
    fields = {f.name for f in dataclasses.fields(ServingOptions)} - {"autotune_disabled_by", "not_understood"}
    assert fields == {o.name for o in SERVING_OPTIONS}
    assert len(BY_NAME) == len(SERVING_OPTIONS)
    for o in SERVING_OPTIONS:  # defaults come from the dataclass
        assert o.default == ServingOptions.__dataclass_fields__[o.name].default


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
    # the hash is required by the plan, and only where vLLM reads per-rank files (not on one GPU)
    assert build_request(opts, layout="vllm").engine.config_hash == ""
    with pytest.raises(UsageError, match="needs --vllm-config-hash"):
        build_request(dataclasses.replace(opts, tp=2, arch="sm90"), layout="vllm").plan(Path("/nonexistent"))


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
