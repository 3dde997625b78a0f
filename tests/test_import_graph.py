"""The import graph of ``streams`` and ``market``, read from the source: no circle in it.

A circle between modules makes the event path unreadable from the tree (which module comes
first?) and its import order fragile; Python only copes with it through a deferred import
inside a function. So the graph counts every import that runs — at module level (class bodies
included) and inside functions — and reports those inside functions apart: they are the ones
that hide a circle. Imports under ``if TYPE_CHECKING:`` never run and are left out.

``from p import y`` is an edge to the module ``p.y`` if there is one, else to ``p`` (its
``__init__``); ``import p.q.m`` is one to ``p.q.m``. The packages' ``__init__`` that Python runs
first are not edges: a module inside ``p`` is imported while ``p`` is already in
``sys.modules``, so counting them would report every package as a circle, and a reader of the
tree would see none.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("streams", "market")


@dataclass(frozen=True)
class Edge:
    """One import of one project module by another.

    Attributes
    ----------
    source, target : str
        The importing and the imported module (dotted names).
    line : int
        The import's line in ``source``.
    deferred : bool
        Inside a function: it runs on the first call, not when ``source`` is imported.
    """

    source: str
    target: str
    line: int
    deferred: bool

    def __str__(self) -> str:
        where = "in a function, " if self.deferred else ""
        return f"{self.source} -> {self.target} ({where}line {self.line})"


def modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``, by dotted name (a package by its own)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): its body never runs."""
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(nodes: Iterable[ast.AST], deferred: bool) -> Iterable[tuple[ast.stmt, bool]]:
    """Every import statement among ``nodes`` (and inside them) that runs, and whether it runs
    inside a function (a method of a class is one; a class body runs on import)."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, deferred
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _imports(node.orelse, deferred)
        else:
            inner = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from _imports(ast.iter_child_nodes(node), deferred or inner)


def _targets(node: ast.stmt, name: str, is_package: bool, known: set[str]) -> list[str]:
    """The project modules one import statement in module ``name`` loads by name."""
    if isinstance(node, ast.Import):
        dotted = [alias.name for alias in node.names]
        return [
            max((m for m in known if d == m or d.startswith(m + ".")), key=len, default="")
            for d in dotted
        ]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        package = name.split(".") if is_package else name.split(".")[:-1]
        anchor = ".".join(package[: len(package) - node.level + 1])
        base = f"{anchor}.{base}" if base else anchor
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> list[Edge]:
    """Every import between modules of ``packages`` under ``root``, read with :mod:`ast`."""
    found = modules(root, packages)
    known = set(found)
    edges = set()
    for name, path in found.items():
        tree = ast.parse(path.read_text(), str(path))
        for node, deferred in _imports(tree.body, False):
            for target in _targets(node, name, path.name == "__init__.py", known):
                if target in known and target != name:
                    edges.add(Edge(name, target, node.lineno, deferred))
    return sorted(edges, key=lambda e: (e.source, e.target, e.line))


def cycles(edges: Iterable[tuple[str, str]], limit: int = 200) -> list[list[str]]:
    """The elementary circles of a directed graph, each from its smallest node, sorted.

    Each circle is found once, from its smallest node, by a depth-first search that only
    visits larger nodes of the same strongly connected component; ``limit`` bounds the
    answer (a tangle of modules has exponentially many circles, and the first ones tell it).
    """
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    component = _components(graph)
    found: list[list[str]] = []
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack and len(found) < limit:
            node, path = stack.pop()
            for nxt in sorted(graph[node], reverse=True):
                if nxt == start:
                    found.append(path)
                elif nxt > start and nxt not in path and component[nxt] == component[start]:
                    stack.append((nxt, [*path, nxt]))
    return sorted(found)[:limit]


def _components(graph: dict[str, set[str]]) -> dict[str, str]:
    """Each node's strongly connected component, named by its root (Tarjan's algorithm,
    iterative: a deep import chain must not meet the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    comp: dict[str, str] = {}
    stack: list[str] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    while True:
                        member = stack.pop()
                        comp[member] = node
                        if member == node:
                            break
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child not in comp:
                low[node] = min(low[node], index[child])
    return comp


def _report(edges: list[Edge], found: list[list[str]]) -> str:
    """Each circle with the imports that make it, those inside functions marked."""
    lines = []
    for circle in found:
        lines.append(" -> ".join([*circle, circle[0]]))
        for a, b in zip(circle, [*circle[1:], circle[0]], strict=True):
            lines += [f"    {e}" for e in edges if (e.source, e.target) == (a, b)]
    return "\n".join(lines)


# -- the finder has power ----------------------------------------------------------------------
def test_cycle_finder_reports_every_circle_of_a_small_graph() -> None:
    edges = [
        ("a", "b"),
        ("b", "c"),
        ("c", "a"),
        ("c", "d"),
        ("d", "e"),
        ("b", "a"),
        ("e", "f"),
        ("x", "y"),
        ("y", "x"),
        ("z", "z"),
        ("f", "d"),
    ]
    assert cycles(edges) == [["a", "b"], ["a", "b", "c"], ["d", "e", "f"], ["x", "y"], ["z"]]
    assert cycles([("a", "b"), ("b", "c"), ("a", "c")]) == []  # a diamond is no circle
    assert len(cycles([(a, b) for a in "abcdef" for b in "abcdef"], limit=50)) == 50


def test_import_graph_reads_every_import_that_runs(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from .. import a\nimport pkg.b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from .a import f\nelse:\n    import os\n"
    )
    (pkg / "a.py").write_text(
        "import json\nfrom .sub import c\nclass K:\n    from . import b\n"
        "    def m(self):\n        from .sub.c import x\n"
    )
    got = {(e.source, e.target, e.deferred) for e in import_graph(tmp_path, ["pkg"])}
    assert got == {
        ("pkg", "pkg.a", False),
        ("pkg.a", "pkg.sub.c", False),
        ("pkg.a", "pkg.b", False),
        ("pkg.a", "pkg.sub.c", True),
        ("pkg.sub.c", "pkg.a", False),
        ("pkg.sub.c", "pkg.b", False),
    }
    assert cycles((e.source, e.target) for e in import_graph(tmp_path, ["pkg"])) == [
        ["pkg.a", "pkg.sub.c"]
    ]


# -- the project ---------------------------------------------------------------------------------
def test_the_graph_of_the_project_is_read() -> None:
    edges = import_graph(ROOT)
    sources = {e.source.split(".")[0] for e in edges}
    assert sources == set(PACKAGES) and len(edges) > 100, len(edges)
    assert any(e.deferred for e in edges)  # the commands' imports are deferred: they are seen


def test_streams_and_market_import_no_circle() -> None:
    """No circle at all, through imports inside functions too (listed with their lines)."""
    edges = import_graph(ROOT)
    found = cycles((e.source, e.target) for e in edges)
    assert not found, "import circles:\n" + _report(edges, found)
