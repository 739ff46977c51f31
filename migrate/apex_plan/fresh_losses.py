"""A scaled loss made from nothing that trains: a new tensor (``torch.zeros(1, requires_grad=True)``,
a template's placeholder) whose backward reaches no parameter. apex stepped such an optimizer
(nothing changed); ``GradScaler.step`` raises "No inf checks were recorded for this optimizer"."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.tree import FileTree
from migrate.flow.bindings import bound_names
from migrate.names import qualified_names
from migrate.step_model.shapes import parameters_of
from migrate.tree_walk import descendants

_FACTORIES = frozenset({"zeros", "ones", "full", "empty", "tensor", "as_tensor", "rand", "randn", "arange",
                        "zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like",
                        "Tensor", "FloatTensor", "HalfTensor", "DoubleTensor"})
# what leaves a tensor new: moved, cast, marked as requiring grad, copied
_KEEPS_NEW = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "requires_grad_", "clone",
                        "detach", "contiguous", "view", "reshape", "squeeze", "unsqueeze", "sum", "mean"})


def fresh_loss(tree: FileTree, statement: cst.With, loss: cst.BaseExpression) -> str | None:
    """Why the loss ``statement`` scales reaches no parameter, or None. A name counts where every
    binding of it in its function is such a tensor (``loss = torch.zeros(...)``, in each arm);
    one other binding (``loss = criterion(out, y)``, ``loss += aux``) or a parameter of that name
    clears it."""
    if _new_tensor(tree, loss):
        return f"the scaled loss `{nodes.code(loss)}` is a new tensor"
    if not isinstance(loss, cst.Name):
        return None
    function = tree.function(statement)
    if function is not None and loss.value in {param.name.value for param in parameters_of(function)}:
        return None
    scope = tree.module if function is None else function.body
    bindings = [(node, new) for node in descendants(scope, nodes.not_a_definition)
                for new in [_binding(tree, node, loss.value)] if new is not None]
    if not bindings or not all(new for _, new in bindings):
        return None
    return f"the scaled loss `{loss.value}` is only ever a new tensor (line {tree.line(bindings[0][0])})"


def refusal(reason: str) -> str:
    return (f"{reason}: its backward reaches no parameter, and `GradScaler.step` raises \"No inf checks were "
            "recorded for this optimizer\" where apex's step left the model as it was")


def _binding(tree: FileTree, node: cst.CSTNode, name: str) -> bool | None:
    """Whether ``node`` binds ``name`` to a new tensor (``loss = loss_G = torch.zeros(1)`` too), False
    where it binds it otherwise (``+=``, a loop, ``with ... as``, ``global``), None where it does not bind it."""
    if type(node) in (cst.Global, cst.Nonlocal):
        return False if any(item.name.value == name for item in node.names) else None
    if name not in bound_names(node):
        return None
    if type(node) is cst.Assign:
        return all(type(target.target) is cst.Name for target in node.targets) and _new_tensor(tree, node.value)
    return type(node) is cst.AnnAssign and node.value is not None and _new_tensor(tree, node.value)


def _new_tensor(tree: FileTree, value: cst.BaseExpression) -> bool:
    """``torch.zeros(1, requires_grad=True).float().to(device)``, ``torch.tensor(0.0).cuda()``,
    ``Variable(torch.zeros(1), requires_grad=True)``: made here, from no computation."""
    while isinstance(value, cst.Call):
        func = value.func
        if isinstance(func, cst.Attribute) and func.attr.value in _KEEPS_NEW:
            value = func.value
            continue
        if nodes.call_name(value) == "Variable" and value.args:
            value = value.args[0].value
            continue
        return nodes.call_name(value) in _FACTORIES and _is_torch(tree, func)
    if isinstance(value, cst.BinaryOperation):  # `torch.ones(1, requires_grad=True) * 0`
        return all(_new_tensor(tree, side) or isinstance(side, cst.Integer | cst.Float) for side in (value.left, value.right))
    return False


def _is_torch(tree: FileTree, func: cst.BaseExpression) -> bool:
    return any(name.startswith("torch.") for name in qualified_names(tree.provider, func))
