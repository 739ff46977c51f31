"""A test whose outcome is known, and what folding it leaves.

Two rules read a name whose value they know once the file is migrated: AMP018 a module-level apex
flag that is always ``True``, AMP001 apex's module, always imported (never ``None``). Both fold the
same shapes around that read: ``bool(x)``, ``not x``, ``x is None``, ``x == True``, an ``and`` it is
an operand of, and the ``if`` or conditional expression the test decides."""
from __future__ import annotations

import operator
from typing import Callable

import libcst as cst

from migrate import apex_nodes as nodes

ParentOf = Callable[[cst.CSTNode], "cst.CSTNode | None"]

# What a module is, for a comparison: truthy, not None, neither True nor False.
A_MODULE = object()

_COMPARE = {cst.Is: operator.is_, cst.IsNot: operator.is_not, cst.Equal: operator.eq, cst.NotEqual: operator.ne}
_CONSTANTS = {"None": None, "True": True, "False": False}
_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.BaseNumber, cst.BaseString)


def known_test(read: cst.Name, parent_of: ParentOf, value: object) -> tuple[cst.BaseExpression, bool]:
    """The largest test around ``read`` whose truth follows from ``read`` being ``value`` (``True``
    or ``A_MODULE``): ``bool(read)``, ``read is None``, ``read == True``, any ``not`` around
    them; and that truth."""
    test: cst.BaseExpression = read
    parent = parent_of(read)
    wrapper = parent_of(parent) if isinstance(parent, cst.Arg) and parent.keyword is None else None
    if isinstance(wrapper, cst.Call) and nodes.code(wrapper.func) == "bool" and len(wrapper.args) == 1:
        test, parent, value = wrapper, parent_of(wrapper), True
    if isinstance(parent, cst.Comparison) and parent.left is test and len(parent.comparisons) == 1:
        target = parent.comparisons[0]
        compare = _COMPARE.get(type(target.operator))
        constant = target.comparator.value if isinstance(target.comparator, cst.Name) else None
        if compare is not None and constant in _CONSTANTS:
            test, parent, value = parent, parent_of(parent), compare(value, _CONSTANTS[constant])
    holds = bool(value)
    while isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
        test, parent, holds = parent, parent_of(parent), not holds
    return test, holds


def decided_by(read: cst.Name, parent_of: ParentOf, value: object) -> tuple[cst.CSTNode, object] | None:
    """What ``read`` being ``value`` decides, and what takes its place: an ``and`` and its other
    operand (``flag and x`` is ``x``), a conditional expression and the arm it takes, an ``if``
    and whether its body runs (``not flag and x`` is False: the ``if`` takes its other arm), an
    ``assert`` that always passes (``assert not fp16 or fp16 and flag``), which goes."""
    test, holds = known_test(read, parent_of, value)
    holder = parent_of(test)
    if holds and isinstance(holder, cst.BooleanOperation) and isinstance(holder.operator, cst.And):
        other = holder.right if holder.left is test else holder.left
        if not _complemented(holder, other, parent_of):
            return holder, _parenthesized_as(other, holder)
        test, holder = parent_of(holder), parent_of(parent_of(holder))  # `not x or x and flag`: always true
    while holds and isinstance(holder, cst.BooleanOperation) and isinstance(holder.operator, cst.Or):
        test, holder = holder, parent_of(holder)  # `not fp16 or flag`: true too
    if holds and isinstance(holder, cst.Assert) and holder.test is test:  # it always passes
        line = parent_of(holder)
        return (line if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else holder), cst.RemoveFromParent()
    while not holds and isinstance(holder, cst.BooleanOperation) and isinstance(holder.operator, cst.And):
        test, holder = holder, parent_of(holder)
    if isinstance(holder, cst.If) and holder.test is test:
        return holder, holds
    if isinstance(holder, cst.IfExp) and holder.test is test:  # `128 if has_apex else 64`
        kept = holder.body if holds else holder.orelse
        return holder, kept if isinstance(kept, _ATOMS) or kept.lpar else _parenthesized_as(kept, holder)
    return None


def _complemented(operand: cst.BooleanOperation, kept: cst.BaseExpression, parent_of: ParentOf) -> bool:
    """Whether ``operand``, an ``and`` that folds to ``kept``, is an operand of an ``or`` whose other
    operand is ``not kept`` (``not fp16 or fp16 and has_apex``): that ``or`` is always true."""
    either = parent_of(operand)
    if not (isinstance(either, cst.BooleanOperation) and isinstance(either.operator, cst.Or)):
        return False
    other = either.left if either.right is operand else either.right
    return (isinstance(other, cst.UnaryOperation) and isinstance(other.operator, cst.Not)
            and nodes.code(other.expression) == nodes.code(kept))


def arm_that_runs(statement: cst.If, body_runs: bool) -> list[cst.BaseStatement]:
    """The statements of the arm of ``statement`` that runs: its body, or its ``else:`` (none
    where there is none; an ``elif`` is the caller's to handle)."""
    if body_runs:
        return list(statement.body.body)
    return list(statement.orelse.body.body) if isinstance(statement.orelse, cst.Else) else []


def in_place_of(statement: cst.CSTNode, kept: list[cst.BaseStatement]) -> cst.FlattenSentinel:
    """``kept`` where ``statement`` was, with the comments and blank lines above it."""
    first, *rest = kept
    return cst.FlattenSentinel([first.with_changes(leading_lines=[*statement.leading_lines, *first.leading_lines]), *rest])


def _parenthesized_as(expression: cst.BaseExpression, replaced: cst.BaseExpression) -> cst.BaseExpression:
    """``expression`` in ``replaced``'s place, with its parentheses (which may hold line breaks)."""
    return expression.with_changes(lpar=replaced.lpar, rpar=replaced.rpar) if replaced.lpar else expression
