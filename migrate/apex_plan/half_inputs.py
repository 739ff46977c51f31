"""Whether a statement runs a forward pass of a model on float16 tensors it made itself.

A script feeding ``image = batch.half().cuda() / 255`` to its model trained under apex O1, whose
patched functions cast inputs to each op's precision: the float32 weights met float16 inputs
without complaint, in an evaluation too. Outside autocast, natively, the same pass raises
("Input type (c10::Half) and bias type (float) should be the same"): such a pass, in the
training loop or in the loop calling the training function, goes under autocast as the training
region does. Followed in the statement and in the file's functions it calls, name by name: a
name bound from a ``.half()`` (``.to(torch.float16)``, ``.type(torch.HalfTensor)``), or from one
such, handed to a model.
"""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.hidden_readers import helpers_reached
from migrate.apex_plan.syntax import read_names
from migrate.apex_plan.tree import FileTree
from migrate.tree_walk import descendants

__all__ = ["fed_half"]

_HALF_DTYPES = frozenset({"torch.float16", "torch.half", "torch.cuda.HalfTensor", "torch.HalfTensor"})


def fed_half(tree: FileTree, statement: cst.CSTNode, models: set[str], amp_calls: frozenset[int]) -> bool:
    """Whether ``statement``, or a function of the file it calls, hands one of ``models`` a
    float16 tensor it made (``model(x.half())``, or through the names bound from one)."""
    return any(_in_scope(scope, models) for scope in (statement, *helpers_reached(tree, statement, amp_calls)))


def _in_scope(scope: cst.CSTNode, models: set[str]) -> bool:
    assigns = [node for node in nodes.own_code(scope) if type(node) is cst.Assign]
    halves: set[str] = set()
    changed = True
    while changed:  # `image = batch.half()`, then `image = image.unsqueeze(1)`
        changed = False
        for assign in assigns:
            if _is_half(assign.value, halves):
                bound = {name for target in assign.targets for name in nodes.bound_texts(target.target)} - halves
                if bound:
                    halves |= bound
                    changed = True
    for call in nodes.own_code(scope):
        if type(call) is cst.Call and _calls_a_model(call, models) and any(_is_half(arg.value, halves) for arg in call.args):
            return True
    return False


def _calls_a_model(call: cst.Call, models: set[str]) -> bool:
    func = call.func
    return nodes.code(func) in models or (type(func) is cst.Attribute and func.attr.value == "forward"
                                          and nodes.code(func.value) in models)


def _is_half(expression: cst.BaseExpression, halves: set[str]) -> bool:
    """Whether ``expression`` makes a float16 tensor or reads a name bound to one."""
    if read_names(expression) & halves:
        return True
    for node in descendants(expression, nodes.not_a_definition):
        if type(node) is not cst.Call or type(node.func) is not cst.Attribute:
            continue
        name = node.func.attr.value
        if name == "half" or (name in ("to", "type") and any(nodes.code(arg.value) in _HALF_DTYPES for arg in node.args)):
            return True
    return False
