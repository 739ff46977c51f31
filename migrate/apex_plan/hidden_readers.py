"""Gradients read out of the training function's sight, between the scaled backward and the step.

apex unscaled the gradients as ``scale_loss`` exited, so whatever ran before the step saw true
ones: a helper of the file (``self.log_grad_norm()``), and code the file does not show that was
handed what holds them (``for cb in self.callbacks: cb(self)``; ``self.handler.fire_event(...)``
where the handler was made with ``self``: allennlp's gradient-clip callback listens there).
Natively they stay multiplied by the scale until ``unscale_``: such a statement counts as a
reader, as a clip written in the function does.
"""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate import grad_readers
from migrate.apex_plan.tree import FileTree
from migrate.tree_walk import descendants

__all__ = ["reads_grads", "updates_otherwise"]

# Builtins that take an object without reading its gradients.
_LOOKS_ONLY = frozenset({"isinstance", "getattr", "hasattr", "setattr", "print", "str", "repr", "len", "id", "type",
                         "vars", "super", "format", "hash", "callable", "issubclass"})
# Methods of an optimizer or a model that do not read the gradients' values.
_KEEPS_GRADIENTS_UNREAD = frozenset({"zero_grad", "step", "state_dict", "load_state_dict", "add_param_group", "train",
                                     "eval", "parameters", "named_parameters", "modules", "children", "to", "cuda", "cpu"})
# Libraries whose calls read gradients only by names that say so (``clip_grad_norm_``: ``grad_readers``),
# not by being handed a model (``torch.nn.DataParallel(model)``, ``copy.deepcopy(model)``).
_LIBRARIES = frozenset({"torch", "nn", "F", "np", "numpy", "math", "copy", "time", "os", "logging", "json", "pickle"})
_DEPTH = 2  # helpers within helpers followed


def reads_grads(tree: FileTree, statement: cst.CSTNode, holders: frozenset[str], skip: frozenset[int],
                own: frozenset[str] = frozenset(), depth: int = 0) -> bool:
    """Whether ``statement`` reads gradients: itself (``grad_readers``), in a helper of the file it
    calls, or through a call of code not in the file handed one of ``holders`` (``self``, the
    models; or called on what was made with one). ``skip``: apex's own calls."""
    if grad_readers.reads_grads(statement, own):
        return True
    for call in descendants(statement, lambda node: node is statement or nodes.not_a_definition(node)):
        if type(call) is not cst.Call or id(call) in skip:
            continue
        helper = tree.helper(call)
        if helper is not None:
            # a helper that uses apex itself (the one that scales the loss) is planned on its own
            if depth < _DEPTH and not _uses_apex(helper, skip) and reads_grads(tree, helper.body, holders, skip, frozenset(), depth + 1):
                return True
            continue
        if _hands_on(tree, call, holders):
            return True
    return False


def _uses_apex(function: cst.FunctionDef, skip: frozenset[int]) -> bool:
    return any(id(node) in skip for node in descendants(function))


def _hands_on(tree: FileTree, call: cst.Call, holders: frozenset[str]) -> bool:
    """Whether ``call``, of code the file does not show, is handed what holds the gradients: one
    of ``holders`` as an argument, or as what its receiver (``self.handler``) was made with. The
    optimizer handed on is not counted: what takes it steps it (``xm.optimizer_step(optimizer)``),
    the step's own concern; a method of the model or the optimizer that reads gradients says so
    in its name (``clip_master_grads``: ``grad_readers``)."""
    if isinstance(call.func, cst.Name) and call.func.value in _LOOKS_ONLY or nodes.root_name(call.func) in _LIBRARIES:
        return False
    if any(nodes.code(arg.value) in holders for arg in call.args):
        return True
    receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
    if not (isinstance(receiver, cst.Attribute) and isinstance(receiver.value, cst.Name) and receiver.value.value == "self"):
        return False
    owner = tree.owner_class(tree.function(call))
    made_with = tree.per_scope(("made with", id(owner)), lambda: _made_with(owner))
    return any(holder in holders for holder in made_with.get(nodes.code(receiver), ()))


def _made_with(owner: cst.ClassDef | None) -> dict[str, set[str]]:
    """For each ``self.x`` the class assigns a call's result: the arguments that call was handed."""
    found: dict[str, set[str]] = {}
    for node in descendants(owner) if owner is not None else ():
        if type(node) is cst.Assign and type(node.value) is cst.Call:
            for target in node.targets:
                if type(target.target) is cst.Attribute:
                    found.setdefault(nodes.code(target.target), set()).update(nodes.code(arg.value) for arg in node.value.args)
    return found


def updates_otherwise(function: cst.CSTNode, optimizer: str) -> cst.Call | None:
    """A call of a method of ``optimizer`` in ``function`` that steps or reads its gradients other
    than ``step()``: SAM's ``first_step()``/``second_step()``, a wrapper's ``step_and_update_lr()``,
    a ``clip_grad_norm()`` of its own. GradScaler unscales and skips for ``step()`` only."""
    for node in descendants(function, lambda node: node is function or nodes.not_a_definition(node)):
        if type(node) is cst.Call and isinstance(node.func, cst.Attribute) and nodes.code(node.func.value) == optimizer:
            name = node.func.attr.value.lower()
            if name not in _KEEPS_GRADIENTS_UNREAD and any(word in name for word in ("step", "grad", "clip")):
                return node
    return None
