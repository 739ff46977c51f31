"""Whether a plain backward pass takes a loss the file's own GradScaler scaled.

Trainers offering a native path beside apex's write ``scaler.scale(loss).backward()``, or scale
the loss on the way: ``if use_amp: loss = self.scaler.scale(loss)``, then ``loss.backward()``
where apex is off. Such a pass is the native path's own: scaling it again would scale it twice.
Where some runs reach it with the natively scaled loss and others with an unscaled one (fp32),
one GradScaler cannot scale only the second: the file is left alone.
"""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import Unplannable
from migrate.flow.bindings import bound_value
from migrate.flow.reaching import binding_nodes, reaching


def natively_scaled(tree: FileTree, backward: cst.Call) -> bool:
    """Whether every run reaching ``backward`` hands it a natively scaled loss; raises where
    only some do."""
    receiver = backward.func.value if isinstance(backward.func, cst.Attribute) else None
    if isinstance(receiver, cst.Call):
        return _scaling(receiver)
    if not isinstance(receiver, cst.Name):
        return False
    statement = tree.statement(backward)
    graph = tree.control_flow(statement, exceptions=False)
    if not graph.holds(statement):
        return False
    found = reaching(graph, receiver.value, statement)
    scaled = [binding for binding in found.bindings
              if all(_scaling(bound_value(node, receiver.value)) for node in binding_nodes(binding, receiver.value))]
    if not scaled:
        return False
    if len(scaled) == len(found.bindings) and not found.from_outside:
        return True
    raise Unplannable(backward, (
        f"`{nodes.code(backward.func)}()` takes the loss the file's own GradScaler scaled at line {tree.line(scaled[0])} on some "
        "runs and an unscaled one on others: a second GradScaler cannot scale only the unscaled one"))


def _scaling(value: cst.CSTNode | None) -> bool:
    """``scaler.scale(loss)`` (any receiver: ``self._scaler``, ``native_scaler``)."""
    return type(value) is cst.Call and nodes.call_name(value) == "scale"
