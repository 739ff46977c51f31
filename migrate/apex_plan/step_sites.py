"""Where an optimizer steps: the ``optimizer.step()`` calls of a statement or of the file, the
loops stepping each optimizer of a list, and the steps of what callers hand a function that
scales a loss."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.syntax import is_step
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import EACH, TRANSPARENT, normal
from migrate.step_model.shapes import parameters_of
from migrate.tree_walk import walk


def steps_in(statement: cst.CSTNode, wanted: str) -> list[tuple[cst.SimpleStatementLine, int]]:
    """The steps of ``wanted`` in ``statement``, through the blocks a step may sit in."""
    if isinstance(statement, cst.SimpleStatementLine):
        return [(statement, i) for i, small in enumerate(statement.body) if is_step(small, wanted)]
    if steps_each(statement, wanted):
        return [(statement, EACH)]
    if not isinstance(statement, TRANSPARENT):
        return []
    found = []
    for child in statement.children:
        if isinstance(child, cst.IndentedBlock):
            for inner in child.body:
                found += steps_in(inner, wanted)
        elif isinstance(child, TRANSPARENT):
            found += steps_in(child, wanted)
    return found


def steps_each(statement: cst.CSTNode, wanted: str) -> list[tuple[cst.SimpleStatementLine, int]]:
    """``for opt in optimizers: opt.step()`` over the list ``wanted``: the steps in its body."""
    if not (isinstance(statement, cst.For) and isinstance(statement.target, cst.Name) and statement.orelse is None
            and normal(nodes.code(statement.iter)) == normal(wanted)):
        return []
    return [hit for inner in statement.body.body for hit in steps_in(inner, statement.target.value)]


def steps_in_file(module: cst.Module, wanted: str) -> list[tuple[cst.SimpleStatementLine, int]]:
    """Every ``wanted.step()`` of the file, and every loop stepping each optimizer of the
    list ``wanted`` (``for opt in self.optimizers: opt.step()``), as ``steps_in`` finds them."""
    found = []

    class _Steps(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
            found.extend((node, i) for i, small in enumerate(node.body) if is_step(small, wanted))
            return False

        def visit_For(self, node: cst.For) -> bool:
            if steps_each(node, wanted):
                found.append((node, EACH))
                return False
            return True

    walk(module, _Steps())
    return found


def steps_of_callers(tree: FileTree, function: cst.FunctionDef | None,
                     wanted: str) -> dict[str, list[tuple[cst.SimpleStatementLine, int]]]:
    """Where ``wanted`` is a parameter of ``function`` (the one scaling the loss), the steps of
    what the file's calls of that function give it, by its name there: none unless every call gives it
    a name that some step of the file steps (a call leaving it to its default, or handing an
    optimizer stepped nowhere in the file, is not followed)."""
    if function is None or wanted not in {param.name.value for param in parameters_of(function)}:
        return {}
    given: set[str] = set()
    for call in tree.calls_of(function):
        argument = tree.arguments(function, call).get(wanted)
        if argument is None or not isinstance(argument, (cst.Name, cst.Attribute)):
            return {}
        given.add(nodes.code(argument))
    stepped = {name: steps_in_file(tree.module, name) for name in sorted(given)}
    return stepped if stepped and all(stepped.values()) else {}
