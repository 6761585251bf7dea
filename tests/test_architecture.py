"""The import rules of the layout, read from the source (every import statement, function-level
ones included): packages import one way, grpo_core's sub-packages in layer order, no module
imports itself back through a circle, flows' units (sub-packages and top-level modules) neither,
and only flows imports Prefect."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.flow_helpers import REPO

PACKAGES = ("flows", "grpo_core", "reward_models", "storage")
# What each package may import of ours (README.md, "Layout"). storage's one import of
# grpo_core is the user-error base class, in a leaf that imports nothing.
ALLOWED = {
    "flows": {"grpo_core", "reward_models", "storage"},
    "reward_models": {"grpo_core"},
    "grpo_core": set(),
    "storage": {"grpo_core.contracts.errors"},
}
# grpo_core's layers, bottom up: a sub-package imports only its own layer or lower ones.
GRPO_CORE_LAYERS = ("contracts", "data", "model", "algo", "engines")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
    }


def imported(path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """(module imported, line) for each import of `path`, resolved to a module of ours when
    `from pkg import name` names a sub-module; third-party names as written."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in known else base), node.lineno


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {
        name: {m for m, _ in imported(path, known) if m in known and m != name}
        for name, path in found.items()
    }


def test_packages_import_one_way() -> None:
    found = modules()
    known = set(found)
    wrong = []
    for name, path in found.items():
        top = name.split(".")[0]
        for target, line in imported(path, known):
            other = target.split(".")[0]
            if other in PACKAGES and other != top:
                allowed = ALLOWED[top]
                if not any(target == a or target.startswith(a + ".") for a in allowed):
                    wrong.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_grpo_core_sub_packages_import_only_their_layer_or_lower() -> None:
    found = modules()
    rank = {layer: i for i, layer in enumerate(GRPO_CORE_LAYERS)}
    wrong = []
    for name, path in found.items():
        parts = name.split(".")
        if parts[0] != "grpo_core" or len(parts) < 2:
            continue
        assert parts[1] in rank, f"{name}: a grpo_core sub-package outside the layer order"
        for target, line in imported(path, set(found)):
            other = target.split(".")
            if other[0] == "grpo_core" and len(other) > 1 and rank[other[1]] > rank[parts[1]]:
                wrong.append(f"{path.relative_to(REPO)}:{line} ({parts[1]}) imports {target}")
    assert not wrong, "\n".join(wrong)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_circles_are_found_where_there_are_some() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(edges) == [["a", "b", "c"]]


def test_no_import_circle_anywhere() -> None:
    assert circles(graph()) == []


def flows_unit(module: str) -> str:
    """The unit of flows a module belongs to: its direct sub-package of flows (flows.ablate,
    flows.tracking, ...), or itself for a top-level module (flows.config)."""
    return ".".join(module.split(".")[:2])


def flows_unit_imports() -> dict[str, dict[str, list[str]]]:
    """unit -> {unit it imports: each import doing so, as 'file:line imports module'}."""
    found = modules()
    known = set(found)
    units: dict[str, dict[str, list[str]]] = {}
    for name, path in found.items():
        if name.split(".")[0] != "flows":
            continue
        unit = units.setdefault(flows_unit(name), {})
        for target, line in imported(path, known):
            if target.split(".")[0] == "flows" and flows_unit(target) != flows_unit(name):
                where = f"{path.relative_to(REPO)}:{line} imports {target}"
                found_here = unit.setdefault(flows_unit(target), [])
                if where not in found_here:  # `from m import a, b`: one import of m
                    found_here.append(where)
    return units


def closing_edges(edges: dict[str, set[str]], circle: list[str]) -> list[tuple[str, str]]:
    """Edges of `circle` whose removal leaves it without a circle: those a depth-first walk of
    it (in name order) finds pointing back to a unit still on its path."""
    inside = set(circle)
    state: dict[str, str] = {}  # "open" while on the walk's path, then "done"
    back: list[tuple[str, str]] = []

    def walk(v: str) -> None:
        state[v] = "open"
        for w in sorted(edges[v] & inside):
            if w not in state:
                walk(w)
            elif state[w] == "open":
                back.append((v, w))
        state[v] = "done"

    for v in sorted(circle):
        if v not in state:
            walk(v)
    return back


def path_between(edges: dict[str, set[str]], start: str, end: str) -> list[str]:
    """A shortest chain of imports from `start` to `end` (breadth first)."""
    came_from = {start: start}
    queue = [start]
    for v in queue:
        for w in sorted(edges[v]):
            if w not in came_from:
                came_from[w] = v
                queue.append(w)
    chain = [end]
    while chain[-1] != start:
        chain.append(came_from[chain[-1]])
    return chain[::-1]


def test_closing_edges_break_every_circle() -> None:
    edges = {"a": {"b"}, "b": {"a", "c"}, "c": {"a"}, "d": {"a"}}
    back = closing_edges(edges, ["a", "b", "c"])
    assert back == [("b", "a"), ("c", "a")]
    assert path_between(edges, "a", "c") == ["a", "b", "c"]
    assert circles({v: {w for w in ws if (v, w) not in back} for v, ws in edges.items()}) == []


def test_flows_units_import_one_way() -> None:
    """Each sub-package of flows and each top-level module of flows is one unit; the units form
    layers: no import leads from a unit back to one that (through others) imports it."""
    imports = flows_unit_imports()
    edges = {unit: set(others) for unit, others in imports.items()}
    report = []
    for circle in circles(edges):
        report.append(f"circle of {', '.join(circle)}; the imports that close it:")
        for unit, other in closing_edges(edges, circle):
            back = " -> ".join(path_between(edges, other, unit))
            report += [f"  {where}  (back: {back})" for where in imports[unit][other]]
    assert not report, "\n".join(report)


@pytest.mark.parametrize("package", [p for p in PACKAGES if p != "flows"])
def test_only_flows_imports_prefect(package: str) -> None:
    users = [
        f"{path.relative_to(REPO)}:{line}"
        for name, path in modules().items()
        if name.split(".")[0] == package
        for target, line in imported(path, set())
        if target.split(".")[0] in ("prefect", "prefect_ray")
    ]
    assert not users
