"""The engine seam: an engine fi-autotune has never heard of, added by one module
(tests/support/toy_engine.py) and one registry line, works with plan, ls, show and rm - no command
and no library module names it."""

from __future__ import annotations

import json

import pytest

from autotune_cache import registry
from autotune_cache.errors import UsageError
from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.request import TuneRequest
from devtools.synthetic import write_plan_entry
from fi_autotune_cli.main import main

QWEN = ["--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass",
        "--arch", "sm90", "--flashinfer-version", "0.7.2.post1"]


@pytest.fixture
def toy(tmp_path, monkeypatch):
    registry.register_engine("toy", "tests.support.toy_engine:ENGINE")  # the one line
    root = tmp_path / "toy-root"
    root.mkdir()
    monkeypatch.setenv("TOY_CACHE_DIR", str(root))
    yield root
    registry.unregister_engine("toy")


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_registry_finds_the_toy_engine_and_its_layout(toy):
    assert registry.get_engine("toy").title == "Toy 1.0"
    assert registry.engine_of_layout("toy").name == "toy"
    assert "toy" in registry.layouts()
    registry.unregister_engine("toy")
    with pytest.raises(UsageError, match="unknown layout 'toy'"):
        registry.get_layout("toy")
    registry.register_engine("toy", "tests.support.toy_engine:ENGINE")


def test_a_name_taken_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        registry.register_engine("sglang", "tests.support.toy_engine:ENGINE")


def test_plan_for_the_toy_engine(toy, capsys):
    code, out, err = cli(capsys, "plan", "--layout", "toy", *QWEN, "--json")
    assert code == 0, err
    (plan,) = json.loads(out)["workers"]
    assert plan["layout"] == "toy" and plan["key_dir"].startswith(str(toy / "toy-autotune" / "0.7.2.post1" / "sm90"))
    code, out, err = cli(capsys, "plan", "--layout", "toy", *QWEN)
    assert code == 0, err
    assert "Toy pass" in out and "Toy 1.0 would run FlashInfer autotune" in out


def test_ls_show_rm_on_the_toy_tree(toy, capsys):
    request = TuneRequest("Qwen/Qwen3-30B-A3B", ServerFlags(tp=2, moe_runner_backend="flashinfer_cutlass"),
                          arch="sm90", flashinfer_version="0.7.2.post1", engine=registry.get_engine("toy").target())
    plan = request.plan(toy)
    eid = write_plan_entry(plan)
    assert plan.key_dir.is_dir() and plan.key_dir.parent.parent.parent == toy / "toy-autotune"

    code, out, err = cli(capsys, "ls", "--layout", "toy", "--cache-dir", str(toy), "-q")
    assert (code, out.split()) == (0, [str(eid)]), err
    listed = out.strip()
    assert listed.startswith("toy:")
    code, out, err = cli(capsys, "show", listed, "--layout", "toy", "--cache-dir", str(toy), "--json")
    assert code == 0, err
    assert json.loads(out)["entries"][0]["status"] == "complete"
    code, out, err = cli(capsys, "rm", listed, "--layout", "toy", "--cache-dir", str(toy), "-y")
    assert code == 0, err
    assert not plan.key_dir.exists()


def test_an_unregistered_layout_is_a_usage_error(capsys):
    code, out, err = cli(capsys, "plan", "--layout", "toy", *QWEN)
    assert code == 2 and "toy" in err


def test_the_layout_table_names_the_very_objects_the_engines_hand_out():
    """``registry.KNOWN_LAYOUTS`` (what the tree commands import, without the planners) and each
    built-in engine's ``layouts``: the same names, the same objects, in the same order."""
    from_engines = [(e.name, layout) for e in registry.engines() for layout in e.layouts]
    from_table = [(engine, registry.get_layout(name)) for name, (engine, _) in registry.KNOWN_LAYOUTS.items()
                  if engine is not None]
    assert [(e, lay.name) for e, lay in from_engines] == [(e, lay.name) for e, lay in from_table]
    assert all(a is b for (_, a), (_, b) in zip(from_engines, from_table))
    assert registry.default_layout() is registry.default_engine().layouts[0]


def test_flashinfers_managed_store_is_a_layout_of_no_engine():
    """Issue 46: FlashInfer's own store is registered as a layout, not as an engine that plans
    nothing: no engine owns it, warm writes it from an engine's entry that converts into it, and
    check reads it with the default engine's calls."""
    from autotune_cache.engines.requests import build_request
    from autotune_cache.engines.selection import warm_groups, warm_layouts
    from autotune_cache.plan.options import ServingOptions

    assert "flashinfer-v2" not in registry.KNOWN_ENGINES and "flashinfer-v2" in registry.layouts()
    assert registry.engine_of_layout("flashinfer-v2") is None and registry.engine_name_of_layout("flashinfer-v2") is None
    assert warm_layouts() == ["sglang", "flashinfer-v2", "vllm", "vllm-dir"]
    (group,) = warm_groups("sglang,flashinfer-v2")
    assert (group.engine.name, group.layout, group.also) == ("sglang", "sglang", ("flashinfer-v2",))
    with pytest.raises(UsageError, match="written from the sglang tuning"):
        warm_groups("flashinfer-v2")
    request = build_request(ServingOptions(model="Qwen/Qwen3-30B-A3B"), layout="flashinfer-v2")
    assert request.engine.name == registry.default_engine().name
    with pytest.raises(UsageError, match="unknown layout"):
        registry.engine_of_layout("no-such-layout")


def test_the_tree_commands_import_no_planner(tmp_path):
    """``ls`` reaches its layouts through the table: neither engine's planner is imported."""
    import subprocess
    import sys

    code = ("import sys\nfrom fi_autotune_cli.main import main\n"
            "try:\n    main(['ls', '--cache-dir', sys.argv[1]])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.endswith(('.planner', '.recipes', '.engine'))))\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"
