"""What the syntax of a binding says of the values in it, for ``values.StepValues``: the pairs
an assignment binds (``a, b = x, y``), the names a backward pass takes its loss through, whether a
name is a loss or a measure, and whether a call computes something (not a move, a pull, a builtin).
"""
from __future__ import annotations

import re

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.flow.bindings import BINDING_NODES, bound_names, parts
from migrate.step_model import vocabulary as words
from migrate.step_model.events import Loop

# Builtins whose result is a host value whatever they are given.
HOST_BUILTINS = frozenset({"len", "int", "float", "str", "bool", "round", "isinstance", "range", "repr", "format",
                            "hash", "id", "type", "print", "hasattr", "getattr", "callable", "divmod", "abs"})
# Methods of a tensor whose result is on the host (a pull, or metadata).
HOST_METHODS = frozenset(words.PULL_METHODS | {"keys", "size", "dim", "numel", "nelement", "ndimension", "get_device",
                                                "data_ptr", "element_size", "is_contiguous", "stride", "__len__",
                                                "is_floating_point", "format", "join", "split", "startswith"})
# Modules whose functions take and give host values.
HOST_MODULES = frozenset({"np", "numpy", "math", "time", "random", "os", "sys", "json", "logging", "datetime",
                           "itertools", "statistics", "wandb", "logger", "log"})
ITERATION = frozenset({"next", "iter", "enumerate", "zip"})
LOSS_WEIGHT = re.compile(r"(ratio|weight|scale|coef|lambda|factor|alpha|beta|\[)", re.IGNORECASE)


class Bound:
    """A comprehension's ``for`` as ``pairs_bound`` reads a binding."""

    def __init__(self, compfor: cst.CompFor) -> None:
        self.node, self.value = compfor, compfor.iter
        self.targets = bound_names(compfor)


def pairs_bound(assignment) -> list[tuple[tuple[str, ...], cst.BaseExpression | None]]:
    """``(targets, value)`` for each part of ``assignment`` bound on its own, as ``flow.bindings``
    reads a binding (``parts``: the elements of ``a, b = x, y``, the value of ``for k, v in
    d.items()``, the item of ``enumerate``), and not the keys of ``for k in loss_dict`` (strings).
    None: a host value. A binding the walk makes itself (a helper's parameter, its return) is whole."""
    node = assignment.node
    if type(node) in (cst.For, cst.CompFor) and type(node.iter) in (cst.Name, cst.Attribute) \
            and nodes.code(node.iter).lower().endswith("dict"):
        return [(assignment.targets, None)]  # `for key in loss_dict`: a dict's keys, strings
    if type(node) in BINDING_NODES:
        return [(part.names, part.value) for part in parts(node)]
    return [(assignment.targets, assignment.value)]


def loss_names(expression: cst.CSTNode) -> set[str]:
    """The names a backward pass takes its loss through: ``loss`` in ``loss``, ``loss / accum``,
    ``outputs.loss.mean()``, ``(ce + 0.1 * aux_loss)``, ``sum(losses)``; not a divisor or a weight
    from the configuration (``accum``, ``args.r1``) unless it is named a loss."""
    kind = type(expression)
    if kind in (cst.Name, cst.Attribute):
        return {nodes.code(expression)}
    if kind is cst.Subscript or (kind is cst.Call and type(expression.func) is cst.Attribute):
        root = words.root_text(expression)
        return {root} if root else set()
    if kind is cst.Call:
        return {name for arg in expression.args for name in loss_names(arg.value)}
    if kind is cst.UnaryOperation:
        return loss_names(expression.expression)
    if kind is cst.Dict:  # Lightning's `return {"loss": loss, "log": logs}`
        return {name for e in expression.elements if isinstance(e, cst.DictElement)
                and nodes.literal_string(e.key) == "loss" for name in loss_names(e.value)}
    if kind is cst.BinaryOperation:
        named = lambda side: {name for name in loss_names(side) if named_a_loss(name)}  # noqa: E731
        if isinstance(expression.operator, (cst.Add, cst.Subtract)):
            return loss_names(expression.left) | loss_names(expression.right)
        return loss_names(expression.left) | named(expression.right)  # `loss / accum`, `loss * weight`
    return set()


def named_a_loss(name: str) -> bool:
    """``aux_loss``, ``self.loss``; not a loss's weight from the configuration (``loss_ratio[0]``),
    nor a section of it (``self.LOSS``, ``cfg.LOSS.weight``: capitals name settings)."""
    return "loss" in name.lower() and not LOSS_WEIGHT.search(name) and not any(
        part.isupper() for part in name.split("."))


def names_a_measure(expression: cst.CSTNode) -> bool:
    text = words.root_text(expression) or ""
    return named_a_loss(text) or "norm" in text.lower()


def loops_of(assignment) -> tuple:
    return tuple(frame for frame in assignment.frames if type(frame) is Loop)


def container_of(target: str) -> str:
    """``losses`` for ``losses["ce"]``: an item's container holds a step tensor once an item does."""
    return target.split("[", 1)[0]


def computes(value: cst.CSTNode) -> bool:
    """Whether ``value`` is a call that computes something: not a move (``x.cuda()``), a pull, a builtin."""
    if type(value) is not cst.Call:
        return False
    name = nodes.call_name(value)
    if name in HOST_BUILTINS or name in HOST_METHODS or words.moves_only(value) or name in ITERATION:
        return False
    if type(value.func) is cst.Attribute and nodes.code(value.func.value).split(".")[0] in HOST_MODULES:
        return False
    return True
