"""The package's shape (issue 21), read from the source with ``ast``: nothing is imported.

Floors, bottom to top (a module imports from its own group or from lower floors only):
errors/humanize/version/registry/safeopen (0) -> autotuner/ (1) -> plan/ (2) -> tree/ (3) -> engines/ (4)
-> tune/, check.py (5) -> autotune_cache/__init__.py (6, re-exports) -> cli/ (7).
No import cycles, no function-local imports of our own modules, no private names imported across
modules, no module over 400 lines, no function over 80. Each rule is one test whose failure lists
every offender. The checker itself is tested on a small package written to tmp_path.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from .support import import_graph as ig

REPO = Path(__file__).resolve().parent.parent


#: One test process reads the import graph once for every test here (xdist would hand the tests to
#: every worker, each reading it again).
pytestmark = pytest.mark.xdist_group("architecture")


@pytest.fixture(scope="module")
def graph() -> ig.Graph:
    return ig.read_graph(REPO)


def _assert_none(rule: str, offenders: list[str]) -> None:
    assert not offenders, f"{rule}: {len(offenders)}\n  " + "\n  ".join(offenders)


def test_the_graph_is_read(graph):
    """Guards the rule tests against passing on an empty graph (a moved folder, a wrong root)."""
    assert {"autotune_cache", "autotune_cache.errors", "cli.main"} <= set(graph.files)
    assert len(graph.edges) > 100


def test_no_import_cycles(graph):
    _assert_none("import cycles", ig.cycles(graph))


def test_no_function_local_imports_of_our_modules(graph):
    _assert_none("function-local imports of our modules", ig.local_imports(graph))


def test_no_private_names_imported_across_modules(graph):
    _assert_none("private names imported across modules", ig.private_imports(graph))


def test_no_module_over_400_lines(graph):
    _assert_none("modules over 400 lines", ig.long_modules(graph))


def test_no_function_over_80_lines(graph):
    _assert_none("functions over 80 lines", ig.long_functions(graph))


def test_imports_go_down_the_floors(graph):
    _assert_none("imports up a floor or sideways", ig.floor_violations(graph))


def test_engines_are_reached_only_through_the_registry(graph):
    """Issue 33's seam: no module outside ``engines/<name>/`` imports it, no engine a sibling."""
    _assert_none("imports across the engine seam", ig.seam_violations(graph))


def test_no_code_outside_the_layouts_asks_a_layouts_kind(graph):
    """Issue 46: callers ask the layout (``entry_configs``, ``entry_ops``, ``where_rows``...), never
    which kind it is; only the layouts wing and ``engines/<name>/layout.py`` know kinds."""
    _assert_none("layout kinds read outside the layouts", ig.layout_kind_reads(graph))


def test_doctor_names_no_engine(graph):
    """Issue 46: each engine's log lines, rank labels, version line and words are its dialect's
    (``engines/<name>/log_lines.py``, through the registry); ``logs/`` holds no engine's name."""
    _assert_none("engine names in logs/", ig.engine_name_literals(graph))


def test_no_package_folder_is_crowded(graph):
    _assert_none(f"package folders over {ig.MAX_FOLDER_MODULES} modules", ig.crowded_folders(graph))


# -- the checker, on a package made to break every rule once ---------------------------------------

SYNTHETIC = {
    "autotune_cache/__init__.py": "from autotune_cache.tune.run import go\n",
    "autotune_cache/errors.py": "class Error(Exception):\n    pass\n",
    "autotune_cache/plan/__init__.py": "",
    # plan imports tree (up a floor) and tree imports plan: a cycle, and one arrow up
    "autotune_cache/plan/spec.py": "from autotune_cache.tree import reader\nfrom ..errors import Error\n",
    "autotune_cache/tree/__init__.py": "",
    "autotune_cache/tree/reader.py": (
        "from typing import TYPE_CHECKING\n"
        "from autotune_cache.plan.spec import Error\n"
        "if TYPE_CHECKING:\n"
        "    from autotune_cache.tune.run import go  # type-only: no edge\n"
        "def _helper():\n"
        "    return 1\n"
    ),
    "autotune_cache/tune/__init__.py": "",
    "autotune_cache/tune/kernels.py": "import flashinfer.autotuner\n",
    "autotune_cache/tune/gpu.py": "from autotune_cache.tune.kernels import flashinfer as kernel\n",
    "autotune_cache/tune/run.py": (
        "from autotune_cache.tree.reader import _helper\n"
        "def go():\n"
        "    import torch  # a heavy dependency: allowed lazily\n"
        "    from autotune_cache.plan import spec  # ours: a local import\n"
        "    from autotune_cache.tune.gpu import kernel  # ours, but it imports torch: allowed lazily\n"
        "    return spec\n"
        "def long():\n" + "    x = 1\n" * 85
    ),
    "autotune_cache/stray.py": "\n" * 401,
    "autotune_cache/engines/__init__.py": "",
    "autotune_cache/engines/alpha/__init__.py": "",
    "autotune_cache/engines/alpha/layout.py": "X = 1\n",
    "autotune_cache/engines/alpha/engine.py": "from autotune_cache.engines.alpha.layout import X\n",
    "autotune_cache/engines/beta/__init__.py": "",
    "autotune_cache/engines/beta/engine.py": "from autotune_cache.engines.alpha.layout import X\n",
    "autotune_cache/engines/requests.py": "from autotune_cache.engines.alpha import engine\n",
    **{f"autotune_cache/crowd/m{i}.py": "" for i in range(16)},
    "autotune_cache/crowd/__init__.py": "",
    "autotune_cache/tree/layouts/__init__.py": "",
    "autotune_cache/tree/layouts/base.py": "class CacheLayout:\n    holds_rank_files = True\n",
    "autotune_cache/tune/kinds.py": (
        "def a(lay, CacheLayout):\n"
        "    return lay.holds_rank_files or isinstance(lay, (int, CacheLayout)) or lay.writes == 'x'\n"
    ),
    "autotune_cache/logs/__init__.py": "",
    "autotune_cache/logs/read.py": (
        '"""Reads Alpha\'s log (a docstring may name it)."""\n'
        "def kind(engine):\n"
        "    return engine == 'alpha' or f'{engine}' == 'ALPHA.cache'\n"
    ),
    "cli/__init__.py": "",
    "cli/main.py": "from fi_autotune_cli.cmd import run\nfrom autotune_cache.tune.run import go\n",
    "cli/cmd.py": "from .main import go\nrun = go\n",
}


@pytest.fixture
def synthetic(tmp_path) -> ig.Graph:
    for rel, text in SYNTHETIC.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text))
    return ig.read_graph(tmp_path)


def test_checker_finds_each_cycle_with_its_edges(synthetic):
    found = ig.cycles(synthetic)
    assert len(found) == 2, found
    plan_tree = next(c for c in found if "autotune_cache.plan.spec" in c)
    assert "autotune_cache.tree.reader" in plan_tree and "autotune_cache/plan/spec.py:1" in plan_tree
    cli = next(c for c in found if "cli.main" in c)
    assert "cli/main.py:1 -> cli.cmd" in cli and "cli/cmd.py:1 -> cli.main" in cli  # the installed name is ours


def test_checker_finds_local_imports_of_ours_only(synthetic):
    assert ig.local_imports(synthetic) == ["autotune_cache/tune/run.py:4: imports autotune_cache.plan.spec inside a function"]


def test_checker_finds_private_names(synthetic):
    assert ig.private_imports(synthetic) == ["autotune_cache/tune/run.py:1: from autotune_cache.tree.reader import _helper"]


def test_checker_finds_long_modules_and_functions(synthetic):
    assert ig.long_modules(synthetic) == ["autotune_cache/stray.py: 401 lines"]
    assert ig.long_functions(synthetic) == ["autotune_cache/tune/run.py:7: long is 86 lines"]


def test_checker_finds_imports_across_the_engine_seam(synthetic):
    """An engine importing a sibling's module, and a neutral module importing an engine's package
    (by ``from package import module`` too), are caught; an engine's own imports are not."""
    assert ig.seam_violations(synthetic) == [
        "autotune_cache/engines/beta/engine.py:1: autotune_cache.engines.beta.engine imports "
        "autotune_cache.engines.alpha.layout (X), inside autotune_cache.engines.alpha",
        "autotune_cache/engines/requests.py:1: autotune_cache.engines.requests imports "
        "autotune_cache.engines.alpha.engine, inside autotune_cache.engines.alpha",
    ]


def test_checker_finds_layout_kinds_read_outside_the_layouts(synthetic):
    assert ig.layout_kind_reads(synthetic) == [
        "autotune_cache/tune/kinds.py:2: reads .holds_rank_files",
        "autotune_cache/tune/kinds.py:2: isinstance(..., CacheLayout)",
        "autotune_cache/tune/kinds.py:2: compares .writes"]


def test_checker_finds_engine_names_in_doctors_code_not_its_docstrings(synthetic):
    found = ig.engine_name_literals(synthetic)
    assert [f.split(": ", 1)[0] for f in found] == ["autotune_cache/logs/read.py:3"] * 2, found


def test_checker_finds_crowded_folders(synthetic):
    assert ig.crowded_folders(synthetic) == ["autotune_cache.crowd: 16 modules"]
    assert ig.crowded_folders(synthetic, limit=16) == []


def test_checker_finds_arrows_up_the_floors(synthetic):
    found = [x for x in ig.floor_violations(synthetic) if "crowd" not in x]
    assert found == [
        "autotune_cache/stray.py: autotune_cache.stray is on no floor",
        "autotune_cache/plan/spec.py:1: autotune_cache.plan.spec (floor 2, plan) imports autotune_cache.tree.reader "
        "(floor 3, tree): up",
    ], found  # TYPE_CHECKING imports, down-going imports and the CLI's imports are not offenders



def test_every_package_folder_is_installed():
    """pyproject lists the packages one by one: a new folder left out would import here, from
    the checkout, and be missing from the installed wheel."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "autotune_cache").rglob("__init__.py")}
    assert folders <= listed, sorted(folders - listed)
    assert "fi_autotune_cli" in listed


def test_the_packages_public_names_resolve_and_load_only_when_asked():
    """``autotune_cache``'s names are imported on first use (PEP 562): each one in ``__all__``
    resolves, and importing ``autotune_cache.errors`` - what the console entry point does first,
    inside its Ctrl-C guard - runs no other module of ours."""
    import subprocess
    import sys

    code = ("import sys, autotune_cache.errors\n"
            "print(sorted(m for m in sys.modules if m.startswith('autotune_cache')))\n"
            "import autotune_cache as a\n"
            "print([n for n in a.__all__ if getattr(a, n, None) is None])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    loaded, unresolved = p.stdout.splitlines()
    assert loaded == "['autotune_cache', 'autotune_cache.errors', 'autotune_cache.version']", loaded
    assert unresolved == "[]"
