"""The names code gives the models ``amp.initialize`` was handed: a function's aliases
(``model = self.model``), the elements of a list of models (``loss_model = loss_models[i]``,
``for loss_model in loss_models:``), and a class's wrappers (``self.runner = DataParallel(self.model)``)."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.names import qualified_names
from migrate.tree_walk import descendants

COPIES = frozenset({"copy.deepcopy", "copy.copy"})


def seen_from(function: cst.FunctionDef | None, model_codes: set[str]) -> set[str]:
    """The model codes, and the names ``function`` gives them in its own top-level lines
    (``model = self.model``), or anywhere in it gives one of the models a list of them holds
    (``loss_model = loss_models[i]``, ``for loss_model in loss_models:``, where ``initialize``
    was handed the list)."""
    models = set(model_codes)
    if function is None:
        return models
    for line in function.body.body:
        for small in line.body if isinstance(line, cst.SimpleStatementLine) else ():
            if (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name)
                    and nodes.code(small.value) in model_codes):
                models.add(small.targets[0].target.value)
    # `amp.initialize(loss_models[i], ...)`: `loss_models` is a list of models too
    lists = set(model_codes) | {code.split("[")[0] for code in model_codes if code.endswith("]")}
    for node in descendants(function.body, nodes.not_a_definition):
        if type(node) is cst.Assign and len(node.targets) == 1 and type(node.targets[0].target) is cst.Name \
                and type(node.value) is cst.Subscript and nodes.code(node.value.value) in lists:
            models.add(node.targets[0].target.value)
        elif type(node) is cst.For:
            models |= _elements_of(node.target, node.iter, lists)
    return models


def wrapped(provider: cst.MetadataDependent, owner: cst.ClassDef | None, models: set[str]) -> set[str]:
    """The attributes a method of ``owner`` sets to one of ``models`` wrapped (``self.mnetwork =
    nn.DataParallel(self.network) if multi_gpu else self.network``): what the other methods
    run as the model."""
    if owner is None:
        return set()

    def wraps(value: cst.BaseExpression) -> bool:
        if type(value) is cst.IfExp:
            return wraps(value.body) and wraps(value.orelse)
        if type(value) is cst.Call and value.args and value.args[0].keyword is None and not value.args[0].star:
            if qualified_names(provider, value.func) & COPIES:
                return False  # a copy (`deepcopy(model)`, an EMA) has its own parameters: not the model trained
            value = value.args[0].value  # `DataParallel(model, ...)`
        return nodes.code(value) in models

    return {nodes.code(target.target) for node in descendants(owner) if type(node) is cst.Assign and wraps(node.value)
            for target in node.targets if nodes.code(target.target).startswith("self.")}


def _elements_of(target: cst.BaseExpression, iterable: cst.BaseExpression, lists: set[str]) -> set[str]:
    """The names a ``for`` target gives the elements of one of ``lists``: ``for m in models``,
    ``for i, m in enumerate(models)``, ``for m, opt in zip(models, optimizers)``."""
    if type(target) is cst.Name:
        return {target.value} if nodes.code(iterable) in lists else set()
    if type(target) is not cst.Tuple or type(iterable) is not cst.Call or nodes.code(iterable.func) not in ("enumerate", "zip"):
        return set()
    names = [element.value for element in target.elements]
    values = [arg.value for arg in iterable.args]
    if nodes.code(iterable.func) == "enumerate":
        names, values = names[1:2], values[:1]
    return {name.value for name, value in zip(names, values) if type(name) is cst.Name and nodes.code(value) in lists}
