"""The backward slice of a loss: the statements of a block that compute what it is made from,
through the names each binds. apex cast all of it; the autocast region covers at least that."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.syntax import assigned_names, read_names
from migrate.apex_plan.tree import MODULE_METHODS
from migrate.step_model.vocabulary import moves_only
from migrate.tree_walk import descendants


def backward_slice(window: list[cst.BaseStatement], wanted: set[str], networks: frozenset[str] | None = None,
                    computing: bool = False) -> tuple[int | None, set[str]]:
    """The first statement of ``window`` that binds what ``wanted`` is computed from, through the
    names each binds, and every name that computation reads, some of which may be bound before
    ``window``. With ``networks``: the first such that runs a network; ``computing``: the first
    that is not data moved or picked (``y = y.cuda()``, ``x, y = batch``, ``total = 0.0``)."""
    wanted, start = set(wanted), None
    for index in range(len(window) - 1, -1, -1):
        if assigned_names(window[index]) & wanted:
            if (networks is None or runs_a_network(window[index], networks)) and not (computing and moves_data(window[index])):
                start = index
            wanted |= read_names(window[index])
    return start, wanted


def carried(region: list[cst.BaseStatement]) -> set[str]:
    """The names ``region`` binds and whose earlier value it reads (``loss = loss / n``, ``loss += aux``,
    also in a block: ``if n > 1: loss = loss / n``)."""
    bound, read = set(), set()
    lines = [line for statement in region for line in descendants(statement, nodes.not_a_definition)
             if type(line) is cst.SimpleStatementLine]
    for line in lines:
        for small in line.body:
            if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None:
                read |= read_names(small.value) - bound
            elif isinstance(small, cst.AugAssign):
                read |= (read_names(small.value) | read_names(small.target)) - bound
            bound |= assigned_names(small)
    return bound & read


def moves_data(statement: cst.BaseStatement) -> bool:
    """Whether ``statement`` binds data only: names, constants, items picked and tensors moved or
    reshaped (``y = y.cuda()``, ``x, y = batch[0], batch[1]``, ``Variable(x)``, ``tuple(t.cuda() for
    t in batch)``); nothing apex cast."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for node in descendants(statement):
        if type(node) is cst.Call and not (moves_only(node) or nodes.call_name(node) in _NOT_NETWORKS):
            return False
        if isinstance(node, (cst.BinaryOperation, cst.UnaryOperation)):
            return False
    return True


def function_slice(function: cst.FunctionDef, wanted: set[str]) -> list[cst.SimpleStatementLine]:
    """The lines of ``function`` that what reads ``wanted`` at its end is computed from, through the
    names each binds, last first (by their order in the text: a loop's later lines count too)."""
    wanted, found = set(wanted), []
    lines = [node for node in descendants(function.body, nodes.not_a_definition) if type(node) is cst.SimpleStatementLine]
    for line in reversed(lines):
        if assigned_names(line) & wanted:
            wanted |= read_names(line)
            found.append(line)
    return found


_NOT_NETWORKS = frozenset({"len", "float", "int", "bool", "list", "dict", "tuple", "set", "range", "zip", "enumerate",
                           "isinstance", "print", "sum", "max", "min", "abs", "sorted", "getattr", "next", "iter", "str",
                           "Variable"})  # `inputs = Variable(inputs.cuda())`: old torch's wrapper, moving data


def runs_a_network(statement: cst.CSTNode, networks: frozenset[str]) -> bool:
    """Whether ``statement`` calls something by a plain name or an attribute of ``self`` (a network
    held in a variable: ``teacher(x)``, ``self.head(h)``) or one of ``networks``, not a builtin nor
    a method of another object (``model.parse_batch(b)``, ``torch.randn(...)``)."""
    for node in descendants(statement):
        if type(node) is cst.Call:
            func = node.func
            if nodes.code(func) in networks:
                return True
            if isinstance(func, cst.Name) and func.value not in _NOT_NETWORKS:
                return True
            if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
                return True
    return False


# A network's methods that compute nothing with it (a call of any other is a pass: `encoder.encode(x)`).
_NOT_PASSES = MODULE_METHODS | {"named_modules", "named_children", "buffers", "named_buffers", "state_dict", "to",
                                "cuda", "cpu", "half", "float", "double", "type", "zero_grad", "register_buffer",
                                "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
                                "add_module", "get_submodule", "share_memory"}


def calls_model(statement: cst.CSTNode, models: set[str]) -> bool:
    """A call of the model itself (``model(x)``, ``model.forward(x)``) or of a method that computes
    with it (``encoder.encode(mels)``, also through ``.module``), not of what it is handed to
    (``nn.DataParallel(model)``)."""
    for node in descendants(statement, nodes.not_a_definition):
        if type(node) is cst.Call:
            func = node.func
            if nodes.code(func) in models or (type(func) is cst.Subscript and nodes.code(func.value) in models):
                return True  # `model(x)`, a layer of it: `model[0](x)`
            if isinstance(func, cst.Attribute) and func.attr.value not in _NOT_PASSES:
                owner = nodes.code(func.value)
                if owner in models or (owner.endswith(".module") and owner[: -len(".module")] in models):
                    return True
    return False
