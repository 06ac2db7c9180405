"""The import graph of ``autotune_cache/`` and ``cli/``, read with ``ast`` (nothing is imported),
and the rules of issue 21 checked on it. Used by tests/test_architecture.py; also a script:

    python tests/support/import_graph.py [ROOT]     # prints every rule's offenders and their counts

What counts as an import edge: a module-level ``import``/``from ... import`` of one of our modules
(class bodies and ``try`` blocks included). An import inside ``if TYPE_CHECKING:`` is no edge (it
never runs); one inside a function is a *local* import, which the rules forbid for our own
modules (heavy third-party packages may be imported lazily; they are not ours, so not counted) -
except one of ours whose import imports torch or flashinfer (``tune/verify.py``, through the skeleton):
importing it lazily is importing torch lazily, which is what keeps ``ls`` and ``diff`` fast.
The implicit import of a parent package (``import a.b.c`` runs ``a/__init__`` and ``a/b/__init__``)
is not an edge, as in every import-graph tool: the rules are about what a module names.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("autotune_cache", "cli")
# The CLI's folder is ``cli/``; it installs as ``fi_autotune_cli`` (absolute imports use that).
ALIASES = {"fi_autotune_cli": "cli"}
#: Third-party packages whose import costs seconds (CUDA libraries): the one reason for a lazy import.
HEAVY = ("torch", "flashinfer", "triton")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
#: The folder that holds one package per engine: only that package imports its modules.
ENGINES = "autotune_cache.engines"
#: At most this many modules at the top of a package folder (``__init__`` aside), except in a
#: folder of one file per command.
MAX_FOLDER_MODULES = 15
COMMAND_FOLDERS = ("cli.commands",)

# Floors, bottom to top: a module may import from its own group, or from a group on a lower floor.
# (module-name prefix or exact module, group, floor); the first match wins, most specific first.
FLOORS = (
    ("autotune_cache.errors", "base", 0),
    ("autotune_cache.humanize", "base", 0),
    ("autotune_cache.version", "base", 0),
    ("autotune_cache.registry", "base", 0),
    ("autotune_cache.safeopen", "base", 0),
    ("autotune_cache.autotuner", "autotuner", 1),
    ("autotune_cache.plan", "plan", 2),
    ("autotune_cache.tree", "tree", 3),
    ("autotune_cache.calls", "calls", 3),
    ("autotune_cache.tree.layout_kinds.flashinfer_v2", "managed_store", 4),
    # doctor: it reads every engine's log through the dialects the engines hand it (registry)
    ("autotune_cache.logs", "logs", 4),
    ("autotune_cache.engines", "engines", 5),
    ("autotune_cache.tune", "tune", 6),
    ("autotune_cache.check", "check", 6),
    ("autotune_cache", "reexports", 7),  # the package's __init__ only (exact match below)
    ("cli", "cli", 8),
)


@dataclass(frozen=True)
class Import:
    """One import of one of our modules: ``src`` names ``target`` (and ``name`` from it)."""

    src: str
    target: str
    name: str | None
    line: int
    local: bool  # inside a function
    type_only: bool  # under ``if TYPE_CHECKING:``


@dataclass(frozen=True)
class Function:
    module: str
    qualname: str
    line: int
    length: int


@dataclass
class Graph:
    root: Path
    files: dict[str, Path] = field(default_factory=dict)  # module name -> file
    lines: dict[str, int] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)
    functions: list[Function] = field(default_factory=list)
    heavy: set[str] = field(default_factory=set)  # our modules that import a HEAVY package at module level

    def where(self, module: str, line: int | None = None) -> str:
        rel = self.files[module].relative_to(self.root)
        return f"{rel}:{line}" if line is not None else str(rel)

    @property
    def edges(self) -> list[Import]:
        """The imports that run when the module is imported: module level, not type-only."""
        return [i for i in self.imports if not i.local and not i.type_only]


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def read_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> Graph:
    root = Path(root)
    g = Graph(root)
    for pkg in packages:
        for p in sorted((root / pkg).rglob("*.py")):
            if "__pycache__" not in p.parts:
                g.files[module_name(root, p)] = p
    for mod, path in g.files.items():
        src = path.read_text()
        g.lines[mod] = len(src.splitlines())
        _Visitor(g, mod, path.name == "__init__.py").visit(ast.parse(src, str(path)))
    return g


def _owning_module(g: Graph, dotted: str) -> str | None:
    """The longest prefix of ``dotted`` that is one of our modules."""
    first, _, rest = dotted.partition(".")
    dotted = ".".join(filter(None, [ALIASES.get(first, first), rest]))
    while dotted and dotted not in g.files:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


class _Visitor(ast.NodeVisitor):
    def __init__(self, g: Graph, module: str, is_pkg: bool):
        self.g, self.module, self.is_pkg = g, module, is_pkg
        self.scope: list[str] = []
        self.in_function = 0
        self.type_only = 0

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        qual = ".".join([*self.scope, node.name])
        self.g.functions.append(Function(self.module, qual, node.lineno, node.end_lineno - node.lineno + 1))
        self.scope.append(node.name)
        self.in_function += 1
        self.generic_visit(node)
        self.in_function -= 1
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" not in ast.unparse(node.test):
            self.generic_visit(node)
            return
        self.type_only += 1
        for child in node.body:
            self.visit(child)
        self.type_only -= 1
        for child in node.orelse:
            self.visit(child)

    def _add(self, dotted: str, name: str | None, line: int) -> None:
        if dotted.partition(".")[0] in HEAVY and not self.in_function and not self.type_only:
            self.g.heavy.add(self.module)
        target = _owning_module(self.g, dotted)
        if target is None or target == self.module:
            return
        self.g.imports.append(Import(self.module, target, name, line, self.in_function > 0, self.type_only > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, None, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.module.split(".") if self.is_pkg else self.module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            package = ".".join(base + ([node.module] if node.module else []))
        else:
            package = node.module or ""
        for alias in node.names:
            sub = f"{package}.{alias.name}"
            if _owning_module(self.g, sub) == sub:  # ``from pkg import submodule``
                self._add(sub, None, node.lineno)
            else:
                self._add(package, alias.name, node.lineno)


# -- the rules: each returns its offenders as lines of text ---------------------------------------

def cycles(g: Graph) -> list[str]:
    """Every strongly connected component of more than one module, with the edges inside it."""
    succ: dict[str, set[str]] = {}
    for i in g.edges:
        succ.setdefault(i.src, set()).add(i.target)
    out = []
    for comp in _sccs(list(g.files), succ):
        inside = sorted({f"{g.where(i.src, i.line)} -> {i.target}" for i in g.edges
                         if i.src in comp and i.target in comp})
        out.append(f"cycle of {len(comp)}: {', '.join(sorted(comp))}\n      " + "\n      ".join(inside))
    return out


def _sccs(nodes: list[str], succ: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iteratively (no recursion limit on a deep graph)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(succ.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


def heavy_modules(g: Graph) -> set[str]:
    """Our modules whose import imports torch or flashinfer: directly, or through one of ours."""
    heavy = set(g.heavy)
    while True:
        more = {i.src for i in g.edges if i.target in heavy} - heavy
        if not more:
            return heavy
        heavy |= more


def local_imports(g: Graph) -> list[str]:
    """Function-local imports of our modules, except of those that import torch or flashinfer."""
    heavy = heavy_modules(g)
    return [f"{g.where(i.src, i.line)}: imports {i.target}" + (f" ({i.name})" if i.name else "") + " inside a function"
            for i in g.imports if i.local and i.target not in heavy]


def private_imports(g: Graph) -> list[str]:
    return [f"{g.where(i.src, i.line)}: from {i.target} import {i.name}" for i in g.imports
            if i.name and i.name.startswith("_") and not (i.name.startswith("__") and i.name.endswith("__"))]


def long_modules(g: Graph, limit: int = MAX_MODULE_LINES) -> list[str]:
    return [f"{g.where(m)}: {n} lines" for m, n in sorted(g.lines.items()) if n > limit]


def long_functions(g: Graph, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    return [f"{g.where(f.module, f.line)}: {f.qualname} is {f.length} lines" for f in g.functions if f.length > limit]


def floor_of(module: str) -> tuple[str, int] | None:
    for prefix, group, floor in FLOORS:
        if group == "reexports":
            if module == prefix:
                return group, floor
        elif module == prefix or module.startswith(prefix + "."):
            return group, floor
    return None


def floor_violations(g: Graph) -> list[str]:
    """Imports that run up a floor or sideways into another group; modules on no floor."""
    out = [f"{g.where(m)}: {m} is on no floor" for m in g.files if floor_of(m) is None]
    names: dict[tuple[str, int, str], list[str]] = {}  # one line per import statement and target
    for i in g.edges:
        src, dst = floor_of(i.src), floor_of(i.target)
        if src is None or dst is None or dst[1] < src[1] or dst[0] == src[0]:
            continue
        names.setdefault((i.src, i.line, i.target), []).extend([i.name] if i.name else [])
    for (src_mod, line, target), imported in names.items():
        (src, sf), (dst, df) = floor_of(src_mod), floor_of(target)
        what = f" ({', '.join(imported)})" if imported else ""
        out.append(f"{g.where(src_mod, line)}: {src_mod} (floor {sf}, {src}) imports {target}{what} "
                   f"(floor {df}, {dst}): {'up' if df > sf else 'sideways'}")
    return out


def engine_of(module: str) -> str | None:
    """``autotune_cache.engines.<name>`` for a module inside one engine's package, else None."""
    parts = module.split(".")
    if module.startswith(ENGINES + ".") and len(parts) > 3:
        return ".".join(parts[:3])
    return None


def seam_violations(g: Graph) -> list[str]:
    """Imports of an engine's package from outside it: everything else reaches an engine through
    the registry (which names engines by import path, importing none), so no caller and no other
    engine depends on one engine's modules."""
    out = []
    for i in g.imports:
        owner = engine_of(i.target)
        if owner is None or i.type_only or engine_of(i.src) == owner:
            continue
        what = f" ({i.name})" if i.name else ""
        out.append(f"{g.where(i.src, i.line)}: {i.src} imports {i.target}{what}, inside {owner}")
    return out


def crowded_folders(g: Graph, limit: int = MAX_FOLDER_MODULES) -> list[str]:
    """Package folders holding more than ``limit`` modules at their top level: a folder that big
    needs wings (sub-packages by role). A folder of one file per command may hold more."""
    count: dict[str, int] = {}
    for m in g.files:
        package, _, leaf = m.rpartition(".")
        if leaf != "__init__" and package and not g.files[m].name == "__init__.py":
            count[package] = count.get(package, 0) + 1
    return [f"{p}: {n} modules" for p, n in sorted(count.items()) if n > limit and p not in COMMAND_FOLDERS]


RULES = {
    "cycles": cycles,
    "function-local imports": local_imports,
    "private names across modules": private_imports,
    f"modules over {MAX_MODULE_LINES} lines": long_modules,
    f"functions over {MAX_FUNCTION_LINES} lines": long_functions,
    "floors": floor_violations,
    "engine seam": seam_violations,
    f"folders over {MAX_FOLDER_MODULES} modules": crowded_folders,
}


#: The layout classes whose kind a caller could test instead of asking the layout (issue 46).
LAYOUT_KINDS = frozenset({"CacheLayout", "RankFileLayout", "FlashInferV2Layout", "SGLangLayout", "VllmLayout",
                          "VllmDirLayout", "VllmManagedStore"})
#: Attributes that would say a layout's kind: the old flag, and ``writes`` compared.
KIND_ATTRIBUTES = frozenset({"holds_rank_files"})


def owns_layouts(module: str) -> bool:
    """The layouts wing (the contract in ``tree/layouts``, each kind in ``tree/layout_kinds``), and
    each engine's own ``layout`` module, may know layouts' kinds."""
    return module.startswith(("autotune_cache.tree.layouts", "autotune_cache.tree.layout_kinds")) or (
        module.startswith("autotune_cache.engines.") and module.endswith(".layout"))


def layout_kind_reads(g: Graph) -> list[str]:
    """Code outside the layouts that asks which kind a layout is (``isinstance`` against a layout
    class, the ``holds_rank_files`` flag, or ``.writes`` compared) instead of asking the layout."""
    out = []
    for module, path in sorted(g.files.items()):
        if owns_layouts(module):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in KIND_ATTRIBUTES:
                out.append(f"{g.where(module, node.lineno)}: reads .{node.attr}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                  and len(node.args) == 2):
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                if names & LAYOUT_KINDS:
                    out.append(f"{g.where(module, node.lineno)}: isinstance(..., {', '.join(sorted(names & LAYOUT_KINDS))})")
            elif isinstance(node, ast.Compare) and any(
                    isinstance(x, ast.Attribute) and x.attr == "writes" for x in [node.left, *node.comparators]):
                out.append(f"{g.where(module, node.lineno)}: compares .writes")
    return out


#: The package whose code must name no engine: ``doctor``'s (each engine's lines are its dialect's).
ENGINE_NEUTRAL = "autotune_cache.logs"


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def engine_name_literals(g: Graph) -> list[str]:
    """Strings in ``ENGINE_NEUTRAL``'s code (not its docstrings) that name an engine - one of the
    packages under ``engines/`` - in any case: a comparison with an engine's name, an engine's
    line pattern or its words, which belong in that engine's package."""
    names = {m.split(".")[2] for m in g.files if m.startswith(ENGINES + ".") and m.count(".") >= 3}
    out = []
    for module, path in sorted(g.files.items()):
        if not (module == ENGINE_NEUTRAL or module.startswith(ENGINE_NEUTRAL + ".")):
            continue
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                named = sorted(n for n in names if n in node.value.lower())
                if named:
                    out.append(f"{g.where(module, node.lineno)}: {node.value[:40]!r} names {', '.join(named)}")
    return out


RULES["engine names in doctor"] = engine_name_literals


def main(argv: list[str]) -> int:
    g = read_graph(Path(argv[0]) if argv else Path(__file__).resolve().parents[2])
    print(f"modules {len(g.files)}, import edges {len({(i.src, i.target) for i in g.edges})}")
    for name, rule in RULES.items():
        found = rule(g)
        print(f"{name}: {len(found)}")
        for line in found:
            print(f"   {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
