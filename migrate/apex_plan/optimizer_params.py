"""Which model's ``parameters()`` an optimizer holds, exactly, where its function shows it.

``amp.master_params(optimizer)`` becomes the optimizer's parameters. Written out, that is
``(p for group in optimizer.param_groups for p in group["params"])``; a person writes
``model.parameters()`` where the optimizer was made from exactly those:
``optimizer = torch.optim.SGD(model.parameters(), lr=0.1)`` is what reaches the call, on every way
through the function (``flow.reaching``), through no rebinding of ``optimizer`` but
``amp.initialize`` (which hands the same objects back); the bindings of ``model`` that reach
the call are those that reached that construction, through nothing but ``amp.initialize`` or a
``DistributedDataParallel``/``DataParallel`` wrapper (whose ``parameters()`` are the wrapped
model's, in the same order); and no parameter group is added or replaced anywhere in the file.
Then both yield the same tensors in the same order. ``if sgd: opt = SGD(model.parameters())
else: opt = Adam(model.parameters())`` holds the model's parameters either way.
"""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.tree import FileTree
from migrate.flow.bindings import bound_value
from migrate.flow.control import Graph
from migrate.flow.reaching import binding_nodes, reaching
from migrate.names import qualified_names
from migrate.tree_walk import descendants

_WRAPPERS = frozenset({"torch.nn.parallel.DistributedDataParallel", "torch.nn.DataParallel",
                       "torch.nn.parallel.DataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"})


def model_parameters(tree: FileTree, optimizer: cst.BaseExpression, site: cst.CSTNode,
                     initialize_calls: frozenset[int]) -> str | None:
    """``model.parameters()`` where that is exactly what ``optimizer`` holds at ``site``; None
    where the function does not show it. ``initialize_calls``: the ids of ``amp.initialize`` calls."""
    function = tree.function(site)
    if not isinstance(optimizer, cst.Name) or function is None or _param_groups_changed(tree):
        return None
    graph = tree.control_flow(site, exceptions=True)
    statement = tree.statement(site)
    if not graph.holds(statement):
        return None
    made, outside = _origins(tree, graph, optimizer.value, statement, frozenset(), initialize_calls)
    models = {_optimizer_of(tree, construction) for construction in made}
    if outside or len(models) != 1 or None in models:
        return None  # an optimizer handed in, or made from no one model's parameters on every way
    model = models.pop()
    # the model's parameters at the site are those each construction took: the same bindings of
    # `model` reach both, through nothing but `amp.initialize` and wrappers
    wrapped = _origins(tree, graph, model, statement, _WRAPPERS, initialize_calls)
    if any(_origins(tree, graph, model, construction, _WRAPPERS, initialize_calls) != wrapped for construction in made):
        return None
    return f"{model}.parameters()"


def _origins(tree: FileTree, graph: Graph, name: str, statement: cst.CSTNode, wrappers: frozenset[str],
             initialize_calls: frozenset[int]) -> tuple[tuple[cst.CSTNode, ...], bool]:
    """The statements whose binding of ``name`` gives the object it holds at ``statement``,
    followed back through the bindings that keep the same object (``_same_object``), and
    whether what it held when the function began may reach."""
    origins: dict[int, cst.CSTNode] = {}
    outside = False
    seen: set[int] = set()
    pending = [statement]
    while pending:
        found = reaching(graph, name, pending.pop())
        outside = outside or found.from_outside
        for binding in found.bindings:
            if id(binding) in seen:
                continue
            seen.add(id(binding))
            if all(_same_object(tree, node, name, wrappers, initialize_calls) for node in binding_nodes(binding, name)):
                pending.append(binding)
            else:
                origins[id(binding)] = binding
    return tuple(origins.values()), outside


def _optimizer_of(tree: FileTree, statement: cst.CSTNode) -> str | None:
    """``model`` where ``statement`` is ``opt = torch.optim.X(model.parameters(), ...)``."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1):
        return None
    call = statement.body[0].value
    if not isinstance(call, cst.Call) or not any(q.startswith("torch.optim.") for q in qualified_names(tree.provider, call.func)):
        return None
    params = nodes.argument(call, 0, "params")
    value = params.value if params is not None else None
    if not (isinstance(value, cst.Call) and not value.args and isinstance(value.func, cst.Attribute)
            and value.func.attr.value == "parameters" and isinstance(value.func.value, cst.Name)):
        return None
    return value.func.value.value


def _same_object(tree: FileTree, binding: cst.CSTNode, name: str, wrappers: frozenset[str],
                 initialize_calls: frozenset[int]) -> bool:
    """Whether ``binding`` (an assignment binding ``name``) leaves the same parameters: it is
    ``amp.initialize``'s result, or ``name = Wrapper(name, ...)``."""
    if not isinstance(binding, cst.Assign):
        return False
    if isinstance(binding.value, cst.Call) and id(binding.value) in initialize_calls:
        return True
    value = bound_value(binding, name)  # `model, opt = DDP(model), opt`: each name's own part
    if isinstance(value, cst.Name) and value.value == name:
        return True  # bound to itself
    if not (wrappers and isinstance(value, cst.Call) and qualified_names(tree.provider, value.func) & wrappers):
        return False
    first = nodes.argument(value, 0, "module")
    return first is not None and isinstance(first.value, cst.Name) and first.value.value == name


_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "add_param_group"})


def _param_groups_changed(tree: FileTree) -> bool:
    """``add_param_group``, or ``param_groups`` (or what it holds) assigned, deleted or grown,
    anywhere in the file; asked once per file."""
    return tree.per_scope(("param groups changed",), lambda: _changes_param_groups(tree))


def _changes_param_groups(tree: FileTree) -> bool:
    for node in descendants(tree.module):
        if not isinstance(node, cst.Attribute) or node.attr.value not in ("param_groups", "add_param_group"):
            continue
        if node.attr.value == "add_param_group":
            return True
        top, holder = node, tree.parent.get(id(node))
        while isinstance(holder, (cst.Subscript, cst.Attribute, cst.SubscriptElement, cst.Index)) or (
                isinstance(holder, cst.Call) and holder.func is top):
            if isinstance(holder, cst.Attribute) and holder.attr.value in _MUTATORS:
                return True
            top, holder = holder, tree.parent.get(id(holder))
            if isinstance(top, (cst.SubscriptElement, cst.Index)):
                break  # `x[param_groups...]`: used as an index, not changed
        if isinstance(holder, (cst.AssignTarget, cst.Del)) or (
                isinstance(holder, (cst.AugAssign, cst.AnnAssign)) and holder.target is top):
            return True
    return False
