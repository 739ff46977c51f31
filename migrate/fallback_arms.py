"""``else: amp = None``: the arm of an ``if`` that gave an import's name ``None`` for the runs
that skipped the import, and whether anything still reads those names. Syntax only: the planner
(``apex_plan.module_fallbacks``), AMP001 and the engine's import removal (``import_changes``) ask it."""
from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.tree_walk import descendants


def given_none(arm: cst.CSTNode | None) -> set[str]:
    """The names an ``else`` arm gives ``None``, where that is all it does (else empty)."""
    if not isinstance(arm, cst.Else) or not isinstance(arm.body, cst.IndentedBlock):
        return set()
    names: set[str] = set()
    for line in arm.body.body:
        if not isinstance(line, cst.SimpleStatementLine):
            return set()
        for small in line.body:
            if not (isinstance(small, cst.Assign) and nodes.is_none(small.value)
                    and all(isinstance(target.target, cst.Name) for target in small.targets)):
                return set()
            names |= {target.target.value for target in small.targets}
    return names


def read_in(function: cst.FunctionDef, names: set[str], parent_of: Callable[[cst.CSTNode], cst.CSTNode | None]) -> bool:
    """Whether ``function`` reads any of ``names``: a name of them that is not an assignment's
    target, an attribute (``torch.amp``), a keyword (``f(amp=...)``) nor a parameter. ``global
    amp`` is a read."""
    for node in descendants(function):
        if type(node) is cst.Name and node.value in names:
            parent = parent_of(node)
            if not (isinstance(parent, (cst.AssignTarget, cst.Param)) or (isinstance(parent, cst.Attribute) and parent.attr is node)
                    or (isinstance(parent, cst.Arg) and parent.keyword is node)):
                return True
    return False


def commented(arm: cst.Else) -> bool:
    """Whether the ``else`` says something in a comment (``amp = None  # apex is optional``): it
    stays, as a person wrote it for a reader."""
    if not isinstance(arm.body, cst.IndentedBlock):
        return False
    lines = arm.body.body
    return (arm.body.header.comment is not None
            or any(line.comment for line in (*arm.leading_lines, *arm.body.footer, *(e for s in lines for e in s.leading_lines)))
            or any(isinstance(s, cst.SimpleStatementLine) and s.trailing_whitespace.comment for s in lines))
