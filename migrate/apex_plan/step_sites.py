"""Where an optimizer steps: the ``optimizer.step()`` calls of a statement or of the file, the
loops stepping each optimizer of a list, and the steps of what callers hand a function that
scales a loss."""
from __future__ import annotations

import re

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.syntax import assigned_names, calls, is_step
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import EACH, TRANSPARENT, normal
from migrate.step_model.shapes import parameters_of
from migrate.tree_walk import descendants, walk


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


def steps_after(body: list[cst.BaseStatement], sibling: cst.BaseStatement,
                wanted: str) -> tuple[list[tuple[cst.SimpleStatementLine, int]], bool]:
    """The steps of ``wanted`` in the statements of ``body`` after ``sibling``, an ``if`` holding
    one, up to the next backward pass (``if accumulating and boundary: opt.step()``, then ``if not
    accumulating: opt.step()``); and whether only one of them can run in a pass: each in an ``if``
    whose test contradicts the tests of those before it."""
    if not isinstance(sibling, cst.If):
        return [], True
    found: list[tuple[cst.SimpleStatementLine, int]] = []
    tests, alone = [sibling], True
    for later in body[body.index(sibling) + 1 :]:
        if calls(later, lambda name: name in ("backward", "scale_loss")):
            break  # the next backward pass: its own step
        hits = steps_in(later, wanted)
        if hits:
            alone = alone and isinstance(later, cst.If) and all(_contradict(test, later) for test in tests)
            found += hits
            tests.append(later)
    return found, alone


_OPPOSITE = {"GreaterThan": "LessThanEqual", "LessThan": "GreaterThanEqual", "Equal": "NotEqual", "Is": "IsNot", "In": "NotIn"}
_OPPOSITE.update({value: key for key, value in _OPPOSITE.items()})


def _contradict(first: cst.If, second: cst.If) -> bool:
    """Whether the two ``if`` statements (no ``else``) never both run their bodies: a part of one
    test (``a and b``) is the negation of a part of the other (``x > 1`` and ``x <= 1``, ``f`` and ``not f``)."""
    if first.orelse is not None or second.orelse is not None or not (nodes.is_pure(first.test) and nodes.is_pure(second.test)):
        return False
    return any(_negates(one, other) or _negates(other, one) for one in _conjuncts(first.test) for other in _conjuncts(second.test))


def _conjuncts(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _conjuncts(test.left) + _conjuncts(test.right)
    return [test]


def _negates(one: cst.BaseExpression, other: cst.BaseExpression) -> bool:
    if isinstance(one, cst.UnaryOperation) and isinstance(one.operator, cst.Not):
        return nodes.code(one.expression) == nodes.code(other)
    if not (isinstance(one, cst.Comparison) and isinstance(other, cst.Comparison)
            and len(one.comparisons) == len(other.comparisons) == 1):
        return False
    (mine,), (theirs,) = one.comparisons, other.comparisons
    return (nodes.code(one.left) == nodes.code(other.left) and nodes.code(mine.comparator) == nodes.code(theirs.comparator)
            and _OPPOSITE.get(type(mine.operator).__name__) == type(theirs.operator).__name__)


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


def accumulates(loop: cst.CSTNode, wanted: str, conditions: list[str | None]) -> bool:
    """Whether ``loop`` is an inner loop of backward passes that the step after it follows
    (``for _ in range(accumulation): ... backward()`` then ``opt.step()``): no step of
    ``wanted`` or ``return`` in it, and none of the tests climbed out of
    (``elif use_apex_amp:``) assigned in it, so they hold after it as they did inside."""
    if not isinstance(loop, (cst.For, cst.While)) or loop.orelse is not None:
        return False
    inside = list(descendants(loop))
    # a `return` of a function defined in the loop (`def shaped(t): return ...`) leaves only it
    own = descendants(loop, enter=lambda node: node is loop or not isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)))
    if any(type(node) is cst.Return for node in own):
        return False
    if any(type(node) is cst.SimpleStatementLine and any(is_step(small, wanted) for small in node.body) for node in inside):
        return False
    assigned = assigned_names(loop.body)
    if isinstance(loop, cst.For):
        assigned |= set(nodes.bound_texts(loop.target))
    return not any(re.search(rf"(?<![\w.]){re.escape(name)}\b", condition)
                   for name in assigned for condition in conditions if condition)
