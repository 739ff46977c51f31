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
from migrate.step_model.shapes import parameters_of
from migrate.tree_walk import descendants

__all__ = ["helpers_reached", "reads_grads", "updates_otherwise"]

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
    calls = list(_calls(tree, statement, skip))
    helpers = frozenset(id(call) for call, helper in calls if helper is not None)  # judged by their bodies below
    if grad_readers.reads_grads(statement, own, helpers if depth < _DEPTH else frozenset()):
        return True
    for call, helper in calls:
        if helper is not None:
            # a helper that scales a loss with apex itself is planned on its own
            if depth < _DEPTH and not _scales(helper, skip) and reads_grads(tree, helper.body, holders, skip, frozenset(), depth + 1):
                return True
        elif _hands_on(tree, call, holders):
            return True
    return False


def helpers_reached(tree: FileTree, statement: cst.CSTNode, skip: frozenset[int], depth: int = 0) -> list[cst.FunctionDef]:
    """The file's functions ``statement`` calls, and those they call, as ``reads_grads`` follows
    them: where an ``unscale_`` before ``statement`` covers (or would have to cover) their reads."""
    found: list[cst.FunctionDef] = []
    for _, helper in _calls(tree, statement, skip):
        if helper is not None and depth < _DEPTH and not _scales(helper, skip) and helper not in found:
            found += [helper, *helpers_reached(tree, helper.body, skip, depth + 1)]
    return found


def _calls(tree: FileTree, statement: cst.CSTNode, skip: frozenset[int]):
    """Each call in ``statement`` but apex's own (``skip``), with the file's function it runs
    (a function, a closure, a method of the caller's class or of an object of a class of the
    file), or None."""
    for call in nodes.own_code(statement):
        if type(call) is cst.Call and id(call) not in skip:
            yield call, tree.helper(call) or _method_of_own_class(tree, call)


def _scales(function: cst.FunctionDef, skip: frozenset[int]) -> bool:
    """Whether ``function`` scales a loss with apex itself: planned on its own. One that only
    reads ``amp.master_params`` is followed like any helper."""
    return any(id(node) in skip and type(node) is cst.Call and isinstance(node.func, cst.Attribute)
               and node.func.attr.value == "scale_loss" for node in descendants(function))


def _hands_on(tree: FileTree, call: cst.Call, holders: frozenset[str]) -> bool:
    """Whether ``call``, of code the file does not show, is handed what holds the gradients: one
    of ``holders`` as an argument, or as what its receiver (``self.handler``) was made with. The
    optimizer handed on is not counted: what takes it steps it (``xm.optimizer_step(optimizer)``),
    the step's own concern; a method of the model or the optimizer that reads gradients says so
    in its name (``clip_master_grads``: ``grad_readers``)."""
    if isinstance(call.func, cst.Name) and call.func.value in _LOOKS_ONLY or nodes.root_name(call.func) in _LIBRARIES:
        return False
    if "grad" in nodes.call_name(call).lower() and grad_readers.names_a_gradient_flag(nodes.call_name(call)):
        return False  # `set_requires_grad(nets, False)`: it turns the flag, whatever it is handed
    if any(_holds(arg.value, holders) for arg in call.args):
        return True
    return any(
        argument in holders for making in _makings(tree, call) for argument in _handed(tree, making)
    )


def _holds(value: cst.BaseExpression, holders: frozenset[str]) -> bool:
    """Whether ``value`` is one of ``holders``, or a part of a model among them (``model.module_list``,
    ``self.model.backbone``: its parameters' gradients are there); not another attribute of ``self``
    (``self.iteration``)."""
    if nodes.code(value) in holders:
        return True
    while type(value) is cst.Attribute:
        value = value.value
        if nodes.code(value) in holders:
            return nodes.code(value) != "self"
    return False


def _method_of_own_class(tree: FileTree, call: cst.Call) -> cst.FunctionDef | None:
    """The method of a class of the file that ``receiver.method()`` calls, where the receiver
    (``reg``, ``self.regularizer``) was made by calling that class: ``reg = FisherReg(model)``, or
    is that call itself (``FisherReg(model).penalty()``)."""
    if not isinstance(call.func, cst.Attribute):
        return None
    for making in _makings(tree, call):
        made = next((s for s in tree.module.body if isinstance(s, cst.ClassDef) and isinstance(making.func, cst.Name)
                     and s.name.value == making.func.value), None)
        method = next((s for s in made.body.body if isinstance(s, cst.FunctionDef) and s.name.value == call.func.attr.value), None) if made else None
        if method is not None:
            return method
    return None


def _makings(tree: FileTree, call: cst.Call) -> list[cst.Call]:
    """The calls whose results the receiver of ``call`` (``x.update()``) was assigned: for
    ``self.x``, in any method of the class or of its bases in the file; for a name ``x``, the
    classes called where it is bound: the function, or else a function around it or the module
    (a loop under ``if __name__ == "__main__":``, a global read in a function)."""
    receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
    function = tree.function(call)
    if isinstance(receiver, cst.Call):
        return [receiver]  # made where it is called: `Trainer(cfg).fit(model)`
    if isinstance(receiver, cst.Name):
        made = _made_where_bound(tree, function, receiver.value)
    elif isinstance(receiver, cst.Attribute) and isinstance(receiver.value, cst.Name) and receiver.value.value == "self":
        owner = tree.owner_class(function)
        scopes = tree.lineage(owner) if owner is not None else [None]  # set in a base class's `__init__` too
        made = [making for scope in scopes
                for making in tree.per_scope(("made by", id(scope)), lambda: _made_by(scope)).get(nodes.code(receiver), [])]
    else:
        return []
    if isinstance(receiver, cst.Name):
        # a local made by a class (`reg = Regularizer(model)`), not a value a call returned
        # (`loss = compute_loss(model, batch)`, whose `loss.item()` reads no gradient)
        made = [call for call in made if (nodes.code(call.func).rsplit(".", 1)[-1][:1]).isupper()]
    return made


def _made_where_bound(tree: FileTree, function: cst.FunctionDef | None, name: str) -> list[cst.Call]:
    """The calls ``name`` is assigned in the innermost scope that makes it: ``function``, a
    function around it, the module. None past a function taking it as a parameter."""
    while function is not None:
        made = tree.per_scope(("names made in", id(function)), lambda: _made_by(function, own_names=True)).get(name)
        if made or name in _parameters(function):
            return made or []
        function = tree.function(tree.parent.get(id(function)))
    return tree.per_scope(("names made in", id(tree.module)), lambda: _made_by(tree.module, own_names=True)).get(name, [])


def _parameters(function: cst.FunctionDef) -> set[str]:
    params = function.params
    starred = [star for star in (params.star_arg, params.star_kwarg) if isinstance(star, cst.Param)]
    return {param.name.value for param in parameters_of(function) + starred}


def _made_by(scope: cst.CSTNode | None, own_names: bool = False) -> dict[str, list[cst.Call]]:
    """For each name or ``self.x`` that ``scope`` assigns a call's result: those calls. With
    ``own_names``, only its own statements: a nested function's names are its own."""
    found: dict[str, list[cst.Call]] = {}
    within = (lambda node: node is scope or nodes.not_a_definition(node)) if own_names else None
    for node in descendants(scope, within) if scope is not None else ():
        if type(node) is cst.Assign and type(node.value) is cst.Call:
            for target in node.targets:
                if type(target.target) in (cst.Attribute, cst.Name):
                    found.setdefault(nodes.code(target.target), []).append(node.value)
    return found


def _handed(tree: FileTree, making: cst.Call) -> set[str]:
    """What ``making`` was handed, with the ``self.x`` its function keeps of a parameter handed
    on (``self.model = model`` beside ``self.regularizer = make(model)`` is ``self.model`` too)."""
    handed = {nodes.code(arg.value) for arg in making.args}
    function = tree.function(making)
    for node in descendants(function.body) if function is not None else ():
        if type(node) is not cst.Assign:
            continue
        for target in node.targets:  # `self.model = model`, `self.model, self.opt = model, opt`
            pairs = [(target.target, node.value)]
            if type(target.target) is cst.Tuple and type(node.value) is cst.Tuple and len(target.target.elements) == len(node.value.elements):
                pairs = [(kept.value, given.value) for kept, given in zip(target.target.elements, node.value.elements)]
            handed.update(nodes.code(kept) for kept, given in pairs if nodes.code(given) in handed)
    return handed


def updates_otherwise(function: cst.CSTNode, optimizer: str) -> cst.Call | None:
    """A call of a method of ``optimizer`` in ``function`` that steps or reads its gradients other
    than ``step()``: SAM's ``first_step()``/``second_step()``, a wrapper's ``step_and_update_lr()``,
    a ``clip_grad_norm()`` of its own. GradScaler unscales and skips for ``step()`` only."""
    for node in nodes.own_code(function):
        if type(node) is cst.Call and isinstance(node.func, cst.Attribute) and nodes.code(node.func.value) == optimizer:
            name = node.func.attr.value.lower()
            if name not in _KEEPS_GRADIENTS_UNREAD and any(word in name for word in ("step", "grad", "clip")):
                return node
    return None
