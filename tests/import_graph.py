"""A source tree's import graph, read from the source (no module runs), for the tests that
hold its shape: tests/unit/test_engine_layers.py (engine's layers) and
tests/unit/test_rooms.py (the top-level rooms).

Every ``import`` and ``from`` anywhere in a module counts, inside functions too (an import
that runs late still ties the two modules together); relative imports are resolved, and
``from package import name`` counts as an import of ``package.name`` when that is a module.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root/<package>``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Dotted names an import node may load (resolved against ``module``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def raw_imports(known: dict[str, Path]) -> dict[str, set[str]]:
    """module -> every dotted name it imports (ours and third-party), anywhere in its body."""
    found: dict[str, set[str]] = defaultdict(set)
    for module, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            found[module].update(imported(node, module, path.name == "__init__.py"))
        found.setdefault(module, set())
    return found


def resolve(name: str, known: dict[str, Path] | set[str]) -> str | None:
    """The module of ``known`` that a dotted name loads (a name inside a module: the module)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of ``known`` it imports, anywhere in its body."""
    graph: dict[str, set[str]] = {}
    for module, names in raw_imports(known).items():
        graph[module] = {target for name in names if (target := resolve(name, known)) and target != module}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found
