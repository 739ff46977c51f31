"""The package's shape, held by tests: no import cycle between its modules, no module over 500
lines, and a plan's decisions that no planning step can change."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from migrate.apex_plan.vocabulary import Setup

PACKAGE = Path(__file__).resolve().parents[2] / "migrate"
LONGEST = 500


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``path`` imports, lazily or not (``from migrate import x`` is ``migrate.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
            found |= submodules if len(submodules) == len(node.names) else {node.module, *submodules}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found & modules.keys()


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, as the modules along it, or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        for imported in sorted(graph[module]):
            found = visit(imported, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    return next((found for module in sorted(graph) if (found := visit(module, []))), None)


def test_no_import_cycle_between_the_packages_modules():
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    # the package's own `__init__` re-exports the API: importing a submodule is not importing it
    graph = {name: {imported for imported in found if imported != "migrate"} for name, found in graph.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("name", sorted(_modules()))
def test_no_module_is_over_500_lines(name):
    lines = len(_modules()[name].read_text().splitlines())
    assert lines <= LONGEST, f"{name} has {lines} lines: split it by concept"


def test_the_plans_decisions_cannot_be_changed_by_a_planning_step():
    setup = Setup(level="O1", o0=False, scaler="scaler", scope="local")
    with pytest.raises(dataclasses.FrozenInstanceError):
        setup.scaler = "other"  # type: ignore[misc]
