"""A pasted serving command and the serving options' values are read by an engine, reached through
the registry (``Engine.parse_serving_command``, ``Engine.check_option_values``): the CLI and the
request builder never import one engine's parser."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from autotune_cache import registry
from autotune_cache.engines.requests import read_serving_command
from autotune_cache.plan.engine import Engine
from autotune_cache.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("path", ["cli/serving.py", "autotune_cache/engines/requests.py"])
def test_the_seam_names_no_engine_module(path):
    assert not [m for m in _imported_modules(ROOT / path) if m.startswith("autotune_cache.engines.sglang")]


def test_the_default_engine_reads_a_serving_command():
    reading = registry.default_engine().parse_serving_command(
        ["SGLANG_FLASHINFER_AUTOTUNE_EXTEND=1", "python", "-m", "sglang.launch_server", "--model-path", "m",
         "--tp", "2", "--dp-size", "2", "--enable-dp-attention", "--host", "0.0.0.0"])
    assert reading.options == {"model_path": "m", "tp": 2, "dp": 2, "no_dp_attention": False, "autotune_extend": True}
    assert reading.ignored == ("--host 0.0.0.0",) and reading.not_understood == () and reading.notes == ()


def test_a_flag_that_matters_is_refused_by_the_reader():
    with pytest.raises(UsageError, match=r"^serving command: --enable-waterfill changes what SGLang"):
        registry.default_engine().parse_serving_command(["--model-path", "m", "--enable-waterfill"])


@pytest.mark.parametrize("name", ["sglang", "vllm"])
def test_every_engine_checks_the_options_as_sglang_spells_them(name):
    """The options are spelled as SGLang's flags whatever the engine, so their values are checked as
    SGLang's - except where the option sets one of the engine's own flags (vLLM: --moe-backend)."""
    engine = registry.get_engine(name)
    with pytest.raises(UsageError, match=r"^--attention-backend 'flashinfr': SGLang 0.5.23 takes triton"):
        engine.check_option_values({"attention_backend": "flashinfr"})
    engine.check_option_values({"attention_backend": "flashinfer", "moe_runner_backend": "auto"})


def test_flags_alone_are_read_by_the_engine_that_reads_them():
    reading = registry.get_engine("sglang").parse_serving_command(["--model-path", "m", "--tp", "4"])
    assert reading.options == {"model_path": "m", "tp": 4}
    # FlashInfer's managed store is a layout of no engine: flags alone with it are the default engine's
    engine, reading = read_serving_command(["--model-path", "m", "--tp", "4"], "flashinfer-v2")
    assert engine is registry.default_engine() and reading.options == {"model_path": "m", "tp": 4}
    reading = registry.get_engine("vllm").parse_serving_command(["--model", "m", "-tp", "4"])
    assert (reading.options, reading.layout) == ({"model_path": "m", "tp": 4}, "vllm")


def test_vllm_checks_the_options_it_spells_itself_against_its_own_choices():
    vllm = registry.get_engine("vllm")
    vllm.check_option_values({"moe_runner_backend": "batched_triton"})  # vLLM's, not SGLang's
    with pytest.raises(UsageError, match=r"^--moe-runner-backend 'flashinfer_cutlas': vLLM 0.33's --moe-backend takes"):
        vllm.check_option_values({"moe_runner_backend": "flashinfer_cutlas"})
    with pytest.raises(UsageError, match=r"SGLang 0.5.23 takes"):
        registry.get_engine("sglang").check_option_values({"moe_runner_backend": "batched_triton"})


class _Mute(Engine):
    name = "mute"
    label = title = "Mute"
    layouts = ()


def test_a_default_engine_without_a_reader_says_so(monkeypatch):
    """Not an endless recursion: the engine every other one asks must answer itself."""
    monkeypatch.setattr(registry, "KNOWN_ENGINES", {"mute": "", **registry.KNOWN_ENGINES})  # first: the default
    registry.register_engine("mute", _Mute(), clobber=True)
    try:
        with pytest.raises(NotImplementedError, match="reads no serving command"):
            registry.get_engine("vllm").check_option_values({})
    finally:
        registry.unregister_engine("mute")
