"""Which bindings of a name reach a statement: the reaching definitions of one function's control flow.

A binding of ``name`` reaches a statement when some way through the function's control-flow
graph (``flow.control``) leads from it to the statement without binding ``name`` again: after
``if a: opt = SGD(...) else: opt = Adam(...)`` both reach; in ``for i, x in enumerate(xs):`` the
loop's target is what its body reads as ``i``, whatever ``i`` held before the loop; a binding
later in a loop's body reaches the reads at its top on the next pass. A statement's own binding
reaches it only round a loop (``loss = loss / accum`` reads the loss bound before it). A
statement that raises may have raised before it bound (a ``try`` body's line, to its handler),
and a loop that ends binds nothing more (``for i in []:`` leaves ``i`` as it was).

The migration asks it which construction an optimizer at a call is (``apex_plan.optimizer_params``);
the linter asks it which binding of a name a read sees (``step_model.values``). Both read what a
statement binds through ``flow.bindings``.
"""
from __future__ import annotations

from typing import NamedTuple

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.flow.bindings import BINDING_NODES, bound_names
from migrate.flow.control import Edge, Graph
from migrate.tree_walk import descendants

# What a simple statement's bindings are looked for in: not a lambda's body, nor a comprehension's
# own targets (Python 3 gives them their own scope).
_OWN_SCOPE = (cst.Lambda, cst.FunctionDef, cst.ClassDef, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


class Reaching(NamedTuple):
    """``bindings``: the statements (nodes of the graph) whose binding of the name may reach;
    ``from_outside``: some way from the function's entry reaches without a binding of the name
    (what a parameter, a global or an attribute held when the function began)."""

    bindings: tuple[cst.CSTNode, ...]
    from_outside: bool


def reaching(graph: Graph, name: str, statement: cst.CSTNode) -> Reaching:
    """The bindings of ``name`` (a name, or an attribute's text: ``self.opt``) that reach
    ``statement``, a node of ``graph``."""
    found: dict[int, cst.CSTNode] = {}
    outside = False
    seen = {id(statement)}
    pending = [statement]
    while pending:
        node = pending.pop()
        outside = outside or node is graph.entry
        for source, edge in graph.predecessors(node):
            bound = isinstance(source, cst.CSTNode) and binds(source, name) and _bound_on(graph, source, edge, node)
            if bound:
                found[id(source)] = source
            if (not bound or edge is Edge.EXCEPTION) and id(source) not in seen:
                seen.add(id(source))
                pending.append(source)
    return Reaching(tuple(found.values()), outside)


def _bound_on(graph: Graph, source: cst.CSTNode, edge: Edge, target) -> bool:
    """Whether the way from ``source`` (which binds the name) to ``target`` leaves it bound: a
    ``for`` loop binds its target going into its body, not when it ends (a ``while`` test's
    walrus binds either way)."""
    if type(source) is cst.For:
        return any(loop is source for loop in graph.loops_around(target)) if isinstance(target, cst.CSTNode) else False
    return True


def binds(statement: cst.CSTNode, name: str) -> bool:
    """Whether the graph node ``statement`` binds ``name`` where it runs: a line's assignments,
    imports and walruses; a compound statement's own header (a loop's target, ``with ... as``,
    a walrus in a test, ``except ... as``), not its body; a nested ``def`` or ``class`` its name."""
    return bool(binding_nodes(statement, name))


def binding_nodes(statement: cst.CSTNode, name: str) -> list[cst.CSTNode]:
    """The nodes by which the graph node ``statement`` binds ``name`` (see ``binds``): an
    ``Assign``, a ``For``, an ``AsName``, ..., for ``flow.bindings.bound_value`` to read."""
    return [node for node in _binding_parts(statement) if name in _bound_by(node)]


def _binding_parts(statement: cst.CSTNode):
    kind = type(statement)
    if kind in (cst.SimpleStatementLine, cst.SimpleStatementSuite):
        return descendants(statement, lambda node: node is statement or not isinstance(node, _OWN_SCOPE))
    if kind in (cst.For, cst.CompFor):
        return [statement, *_walruses(statement.iter)]
    if kind is cst.With:
        return [item.asname for item in statement.items if item.asname is not None] + [
            walrus for item in statement.items for walrus in _walruses(item.item)]
    if kind in (cst.If, cst.While):
        return _walruses(statement.test)
    if kind is cst.ExceptHandler:
        return [statement.name] if statement.name is not None else []
    if kind in (cst.FunctionDef, cst.ClassDef):
        return [statement]
    return []


def _walruses(expression: cst.CSTNode) -> list[cst.CSTNode]:
    return [node for node in descendants(expression, lambda n: not isinstance(n, _OWN_SCOPE[:1]))
            if type(node) is cst.NamedExpr]


def _bound_by(node: cst.CSTNode) -> tuple[str, ...]:
    kind = type(node)
    if kind in (cst.FunctionDef, cst.ClassDef):
        return (node.name.value,)
    if kind in (cst.Import, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
        return tuple(alias.evaluated_alias or alias.evaluated_name.split(".")[0] for alias in node.names)
    if kind is cst.Del:
        return tuple(nodes.bound_texts(node.target))  # unbound after it: what it held no longer reaches
    if kind in BINDING_NODES and kind is not cst.CompFor:
        return bound_names(node)
    return ()
