"""The ``rollart_sdk`` package graph has no cycle.

Nodes are the parts of the package one level down: each subpackage (``control``,
``cluster``, ``weights``, ...) and each top-level module (``config``, ``job``, ...).
There is an edge ``a -> b`` when a module in ``a`` imports from ``b``, read from the AST
of every module: imports at module level and inside functions both count (a function-
level import is still a dependency, only a later one); imports under
``if TYPE_CHECKING:`` do not (they never run). The package's own ``__init__`` (the
public facade every submodule import passes through) is not a node. A cycle means two
parts can only be understood, tested and moved together: the fix is to move what both
need to the lower one (or to :mod:`rollart_sdk.backends` for backend code), not to hide
the import inside a function.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rollart_sdk"
PKG = "rollart_sdk"
# Edges left for a later move, each with the move that removes it; the graph without
# them has no cycle, and each must still exist (drop the entry when its move lands).
PENDING: dict[tuple[str, str], str] = {}


def _part(module: str) -> str | None:
    """The node of a dotted module name inside the package (None: outside, or the root)."""
    parts = module.split(".")
    if parts[0] != PKG or len(parts) < 2:
        return None
    return parts[1]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, package: str) -> list[tuple[str, int]]:
    """``(imported module, line)`` of every runtime import in ``tree``; ``from X import
    y`` names ``X.y`` too, so that ``from rollart_sdk import config`` counts."""
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            if node.module:
                out.append((base, node.lineno))
            if base == PKG:  # from rollart_sdk import config: the submodule
                out.extend((f"{base}.{a.name}", node.lineno) for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def import_graph() -> dict[str, dict[str, list[str]]]:
    """``graph[a][b]``: the ``file:line`` sites where part ``a`` imports part ``b``."""
    # subpackages: every folder of modules (``control/`` is a namespace package)
    parts = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or any(p.glob("*.py"))}
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts)
        package = module if rel.name == "__init__" else module.rsplit(".", 1)[0]
        package = package.removesuffix(".__init__")
        src = _part(module)
        if src is None or src == "__init__":
            continue
        for target, line in _imports(ast.parse(path.read_text(), str(path)), package):
            dst = _part(target)
            if dst in parts and dst != src:
                graph[src][dst].append(f"{path.relative_to(ROOT.parent)}:{line}")
    return graph


def find_cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return [_cycle_in(graph, set(scc)) for scc in sccs]


def _cycle_in(graph: dict[str, dict[str, list[str]]], scc: set[str]) -> list[str]:
    """A shortest cycle through the component's first node (breadth-first)."""
    start = min(scc)
    prev: dict[str, str] = {}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, {})):
            if w not in scc:
                continue
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [*reversed(path), start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return sorted(scc)


def _describe(graph: dict[str, dict[str, list[str]]], cycle: list[str]) -> str:
    steps = [f"  {a} -> {b}: {', '.join(graph[a][b][:3])}" for a, b in pairwise(cycle)]
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


def test_cycle_finder_finds_a_planted_cycle() -> None:
    graph = {"a": {"b": ["a.py:1"]}, "b": {"c": ["b.py:2"]}, "c": {"a": ["c.py:3"]},
             "d": {"a": ["d.py:4"]}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b": ["x"]}, "b": {}}) == []


def test_the_graph_sees_function_level_imports() -> None:
    tree = ast.parse("import os\ndef f():\n    from rollart_sdk.control import x\n"
                     "if TYPE_CHECKING:\n    from rollart_sdk.job import y\n")
    assert _imports(tree, "rollart_sdk.cluster") == [("os", 1), ("rollart_sdk.control", 3)]
    assert import_graph()["control"]  # the real package has edges at all


def test_rollart_sdk_has_no_import_cycle() -> None:
    graph = import_graph()
    for (a, b), move in PENDING.items():
        assert graph[a].pop(b, None), f"{a} -> {b} is gone ({move}): drop it from PENDING"
    cycles = find_cycles(graph)
    assert not cycles, (
        "import cycles between parts of rollart_sdk (move what both sides need to the "
        "lower one):\n" + "\n".join(_describe(graph, c) for c in cycles))
