"""Whether a loss was computed inside an autocast region the rewrite already planned.

A domain-adaptation trainer's net returns every loss: the main loss's scaled backward pass gets
the region around the forward pass, and each discriminator loss is then scaled in a loop over
the discriminators' optimizers, reading the same dict. That loss needs no marker asking for its
forward pass to go under autocast: it is there already.
"""
from __future__ import annotations

import libcst as cst

from migrate.apex_plan.syntax import read_names
from migrate.apex_plan.tree import FileTree
from migrate.flow.reaching import reaching


def computed_in_a_region(tree: FileTree, regions: set[int], loss: cst.BaseExpression, statement: cst.CSTNode,
                         depth: int = 2) -> bool:
    """Whether what ``loss`` reads was computed, on every way to ``statement``, by a statement
    of an autocast region (``regions``, by id), or taken from such a value by a loop
    (``for key, value in losses.items()``); builtins and globals count for nothing."""
    graph = tree.control_flow(statement, exceptions=False)
    if not graph.holds(statement):
        return False
    seen = False
    for name in sorted(read_names(loss)):
        found = reaching(graph, name, statement)
        if not found.bindings:
            continue
        if found.from_outside:
            return False
        for binding in found.bindings:
            if in_a_region(tree, regions, binding):
                continue
            if not (depth and type(binding) is cst.For and computed_in_a_region(tree, regions, binding.iter, binding, depth - 1)):
                return False
        seen = True
    return seen


def in_a_region(tree: FileTree, regions: set[int], statement: cst.CSTNode | None) -> bool:
    """Whether ``statement`` is, or is in, a statement that became an autocast region."""
    while statement is not None and not isinstance(statement, cst.FunctionDef):
        if id(statement) in regions:
            return True
        statement = tree.parent.get(id(statement))
    return False
