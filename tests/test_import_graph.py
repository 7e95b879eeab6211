"""The package's imports run one way: no cycles between modules, no import up the layers.

The layers, bottom to top: ``echoline``'s own small modules (``paths``, ``version``),
``kernels`` (compute, knowing nothing of models), ``engine`` (models and generation,
knowing nothing of LSP), ``sidecar`` (the language server), and the entry point
``echoline.__main__``. A module may import its own layer and those below.

Why static (``ast``) and not ``sys.modules`` after an import: most cycles here would hide
behind imports inside functions, which only run on some paths (the loop this test was
written against went gguf_file → config → models → … → gguf_file, all function-level).
So every ``import`` statement counts, wherever it stands; only those under
``if TYPE_CHECKING:`` are left out of the cycle check (they never run), though they must
still respect the layers.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

#: The installed subpackages, bottom layer first.
LAYERED = ("echoline.kernels", "echoline.engine", "echoline.sidecar")
#: Modules of the ``echoline`` package itself that stand above everything (entry points).
ENTRY_POINTS = frozenset({"echoline.__main__"})


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` (both module names) at ``line``."""

    source: str
    target: str
    line: int
    runtime: bool  # False: only under ``if TYPE_CHECKING:``


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, name
    for location in spec.submodule_search_locations:
        if (Path(location) / "__init__.py").is_file():
            return Path(location)
    raise AssertionError(f"{name}: no folder with an __init__.py")


def package_modules() -> dict[str, Path]:
    """Module name → file for every module of the installed ``echoline`` package."""
    modules: dict[str, Path] = {}
    top = _package_dir("echoline")
    for path in top.glob("*.py"):  # the echoline package's own modules, not its subpackages
        modules["echoline" if path.stem == "__init__" else f"echoline.{path.stem}"] = path
    for package in LAYERED:
        root = _package_dir(package)
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Line numbers of statements inside ``if TYPE_CHECKING:`` blocks."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for stmt in node.body:
                    for sub in ast.walk(stmt):
                        if hasattr(sub, "lineno"):
                            lines.add(sub.lineno)
    return lines


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The package module ``name`` stands for: itself, or its longest known prefix
    (``echoline.engine.models.MODEL_CLASSES`` → ``echoline.engine.models``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def module_edges(name: str, path: Path, modules: dict[str, Path]) -> Iterator[Edge]:
    """Every import in ``path`` of another module of the package (function-level ones too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    hidden = _type_checking_lines(tree)
    is_package = path.stem == "__init__"
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` mod.
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            resolved = _resolve(target, modules)
            if resolved is not None and resolved != name:
                yield Edge(name, resolved, node.lineno, node.lineno not in hidden)


def import_graph() -> list[Edge]:
    modules = package_modules()
    return [edge for name, path in sorted(modules.items()) for edge in module_edges(name, path, modules)]


def layer_of(module: str) -> int:
    """0 for echoline's own small modules, then kernels, engine, sidecar, entry points."""
    if module in ENTRY_POINTS:
        return len(LAYERED) + 1
    for rank, package in enumerate(LAYERED, start=1):
        if module == package or module.startswith(package + "."):
            return rank
    return 0


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if e.runtime:
            graph.setdefault(e.source, set()).add(e.target)
            graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the module count (~200)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe_cycle(component: list[str], edges: list[Edge]) -> str:
    members = set(component)
    inside = [e for e in edges if e.runtime and e.source in members and e.target in members]
    return " | ".join(f"{e.source}:{e.line} -> {e.target}" for e in inside)


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return import_graph()


def test_the_walk_sees_the_package(edges: list[Edge]) -> None:
    """Guards the test itself: every layer is found, and function-level imports count."""
    modules = package_modules()
    for package in LAYERED:
        assert package in modules
    assert "echoline.version" in modules
    cli_edges = {e.target for e in edges if e.source == "echoline.sidecar.cli"}
    assert "echoline.engine.api" in cli_edges  # imported inside a function only


def test_no_import_cycles(edges: list[Edge]) -> None:
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(_describe_cycle(c, edges) for c in found)


def test_no_upward_imports(edges: list[Edge]) -> None:
    upward = [e for e in edges if layer_of(e.target) > layer_of(e.source)]
    assert not upward, "imports up the layers:\n" + "\n".join(
        f"{e.source}:{e.line} -> {e.target}" for e in upward
    )


#: The benchmark packages: above the modules they measure, outside the product's paths.
BENCH_PACKAGES = ("echoline.engine.bench", "echoline.sidecar.bench")


def _in_bench(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in BENCH_PACKAGES)


def _module_level_imports(path: Path) -> list[str]:
    """Names imported by ``path`` outside any function (what importing the module runs)."""
    names: list[str] = []
    stack: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"))]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        stack.extend(ast.iter_child_nodes(node))
    return names


def test_only_the_bench_command_imports_the_benchmarks(edges: list[Edge]) -> None:
    """Benchmark code never loads with the product: outside the bench packages only the
    CLI imports them, and only inside a function (the ``bench`` command), so neither
    ``serve`` nor ``import echoline.sidecar.cli`` pulls them in."""
    importers = {e.source for e in edges if _in_bench(e.target) and not _in_bench(e.source)}
    assert importers == {"echoline.sidecar.cli"}
    cli = package_modules()["echoline.sidecar.cli"]
    assert not [name for name in _module_level_imports(cli) if _in_bench(name)]


def test_the_checks_can_fail() -> None:
    """A made-up graph with a function-level loop and an upward import is caught."""
    made_up = [
        Edge("echoline.engine.a", "echoline.engine.b", 1, True),
        Edge("echoline.engine.b", "echoline.engine.c", 1, True),
        Edge("echoline.engine.c", "echoline.engine.a", 9, True),
        Edge("echoline.engine.c", "echoline.engine.d", 2, False),
        Edge("echoline.engine.d", "echoline.engine.c", 2, True),
        Edge("echoline.kernels.x", "echoline.engine.a", 3, True),
    ]
    assert cycles(made_up) == [["echoline.engine.a", "echoline.engine.b", "echoline.engine.c"]]
    assert [e.source for e in made_up if layer_of(e.target) > layer_of(e.source)] == [
        "echoline.kernels.x"
    ]
