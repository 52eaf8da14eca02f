"""No import cycle anywhere in specjax/ or models/, lazy imports included.

import-linter's layers contract (pyproject.toml) sees arrows between packages, not a cycle
inside one, and Python hides a cycle closed by an import inside a function until the
function runs. So this test reads every module's source: every `import` and `from ...
import` anywhere in it (module level, functions, methods), with relative imports and
`from package import submodule` resolved to the module they load, except those under
`if TYPE_CHECKING:` (never executed). It fails with each cycle written out as a chain of
modules, each arrow with the line that draws it.
"""

from __future__ import annotations

import ast
import collections
import itertools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Package name -> its directory: models/ installs as specjax.models (pyproject.toml's package-dir).
PACKAGES = {"specjax": ROOT / "specjax", "specjax.models": ROOT / "models"}

Edge = tuple[str, int, bool]  # (the importing module's file, line, inside a function)


def module_files(packages: dict[str, Path]) -> dict[str, Path]:
    """{dotted module name: file} of every .py file under the packages' directories."""
    modules = {}
    for name, base in packages.items():
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            modules[".".join((name, *parts))] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module):
    """(Import | ImportFrom node, inside a function) for every import that can run."""
    stack = [(tree, False)]
    while stack:
        node, lazy = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((child, lazy) for child in node.orelse)  # only the else branch runs
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, lazy
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))


def _known(name: str, modules) -> str | None:
    """The longest prefix of `name` that is one of our modules (`import a.b.c` loads a.b.c)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


def _targets(node: ast.Import | ast.ImportFrom, module: str, path: Path, modules) -> set[str]:
    """The modules of ours that `node`, in `module` (file `path`), loads."""
    if isinstance(node, ast.Import):
        return {t for alias in node.names if (t := _known(alias.name, modules)) is not None}
    if node.level:  # relative: level 1 is the module's own package
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    found = set()
    for alias in node.names:
        # `from package import submodule` loads the submodule; any other name comes from
        # the package's (or module's) own source.
        target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else _known(base, modules)
        if target is not None:
            found.add(target)
    return found


def import_graph(packages: dict[str, Path]) -> dict[str, dict[str, Edge]]:
    """{module: {imported module: the first line importing it}} over the packages' modules."""
    modules = module_files(packages)
    graph: dict[str, dict[str, Edge]] = {}
    for module, path in modules.items():
        edges: dict[str, Edge] = {}
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, lazy in sorted(_imports(tree), key=lambda item: item[0].lineno):
            for target in _targets(node, module, path, modules):
                if target != module:
                    edges.setdefault(target, (str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
                                              node.lineno, lazy))  # fmt: skip
        graph[module] = edges
    return graph


def _components(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
    return sorted(found)


def _shortest_cycle(graph, start: str, within: set[str]) -> list[str]:
    """[start, ..., start]: a shortest import chain from `start` back to itself."""
    previous, queue = {start: None}, collections.deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w == start:
                chain = [v]
                while previous[chain[-1]] is not None:
                    chain.append(previous[chain[-1]])
                return [*reversed(chain), start]
            if w in within and w not in previous:
                previous[w] = v
                queue.append(w)
    raise AssertionError(f"{start} is in a cycle but no chain leads back to it")


def import_cycles(graph) -> list[list[str]]:
    """Cycles as chains [a, b, ..., a]: for each tangle of modules, shortest cycles until
    every module of it is on one."""
    cycles = []
    for component in _components(graph):
        covered: set[str] = set()
        for module in component:
            if module not in covered:
                chain = _shortest_cycle(graph, module, set(component))
                covered.update(chain)
                cycles.append(chain)
    return cycles


def describe(graph, chain: list[str]) -> str:
    """'a -> b -> a' with the line behind each arrow, e.g. 'specjax/x.py:12, in a function'."""
    steps = [chain[0]]
    for a, b in itertools.pairwise(chain):
        path, line, lazy = graph[a][b]
        steps.append(f"  -> {b}    ({path}:{line}{', in a function' if lazy else ''})")
    return "\n".join(steps)


@pytest.fixture(scope="module")
def graph():
    return import_graph(PACKAGES)


def test_no_import_cycle_in_specjax_or_models(graph):
    cycles = import_cycles(graph)
    assert not cycles, "import cycles (break each by moving what both sides need into a lower module):\n\n" + (
        "\n\n".join(describe(graph, chain) for chain in cycles)
    )


def test_the_graph_sees_the_real_imports(graph):
    """The scan is not vacuous: module-level, lazy, relative and models/ imports all show up."""
    assert graph["specjax.engine.generation"]["specjax.engine.adaptive"][2] is False
    assert graph["specjax.api"]["specjax.io.presets"][2] is True  # inside build_drafter
    assert "specjax.models.config" in graph["specjax.models"]  # `from .config import ...`
    assert "specjax.models.attention" in graph["specjax.models.llama"]
    assert "specjax.bench.config" not in graph["specjax.bench.context"]  # under TYPE_CHECKING
    assert len(graph) > 100


def _write(base: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = base / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_finds_lazy_relative_and_submodule_cycles_and_ignores_type_checking(tmp_path):
    _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            # a -> b at module level, b -> a lazily (the engine's old cycle)
            "a.py": "from pkg.b import f\n",
            "b.py": "def f():\n    from pkg import a\n    return a\n",
            # c -> d by a relative import, d -> c through `from package import submodule`
            "sub/__init__.py": "",
            "sub/c.py": "from .d import g\n",
            "sub/d.py": "import os\nfrom pkg.sub import c\n",
            # e -> f, f -> e only for type checkers: no cycle
            "e.py": "import pkg.f\n",
            "f.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg import e\nelse:\n    import os\n",
            # h -> g's package __init__ -> h: `from . import name` reads the __init__
            "g/__init__.py": "from .h import x\ny = 1\n",
            "g/h.py": "x = 0\ndef z():\n    from . import y\n",
        },
    )
    graph = import_graph({"pkg": tmp_path / "pkg"})
    cycles = import_cycles(graph)
    assert sorted(cycles) == [
        ["pkg.a", "pkg.b", "pkg.a"],
        ["pkg.g", "pkg.g.h", "pkg.g"],
        ["pkg.sub.c", "pkg.sub.d", "pkg.sub.c"],
    ]
    text = describe(graph, ["pkg.a", "pkg.b", "pkg.a"])
    assert "-> pkg.b    (" in text and "b.py:2, in a function)" in text and "a.py:1)" in text
