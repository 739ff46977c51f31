"""Where a name is bound within a function, a class or a module: each binding, the names it
binds, and what each part of it gives them.

The migration asks where a name is bound and what value it then has (``bindings``,
``bound_value``); the linter's walk records the same bindings in execution order and follows
each part's source (``bound_names``, ``parts``) to tell the training step's tensors from other
values. Both read a binding the same way, here.
"""
from __future__ import annotations

from typing import NamedTuple

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.tree_walk import descendants

# The nodes that bind names (what ``bound_names`` reads), by exact type.
BINDING_NODES = (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor, cst.AsName, cst.NamedExpr)


class Part(NamedTuple):
    """What one part of a binding gives its names: ``value`` is the value itself where ``exact``
    (``b`` in ``a, b = x, y`` is ``y``), else where it comes from (an element of ``xs`` for ``for x
    in xs``, ``d``'s values for ``for k, v in d.items()``); None where nothing of the code's
    gives it (the index of ``enumerate``, a dict's key)."""

    names: tuple[str, ...]
    value: cst.BaseExpression | None
    exact: bool


def bound_names(node: cst.CSTNode) -> tuple[str, ...]:
    """The text of each name, attribute or item ``node`` binds (``loss, (aux, self.total) = ...``
    binds ``loss``, ``aux``, ``self.total``); empty for a node that binds nothing."""
    kind = type(node)
    if kind is cst.Assign:
        return tuple(text for target in node.targets for text in nodes.bound_texts(target.target))
    if kind in (cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor):
        return tuple(nodes.bound_texts(node.target))
    if kind is cst.AsName:
        return tuple(nodes.bound_texts(node.name))
    if kind is cst.NamedExpr:
        return (nodes.code(node.target),)
    return ()


def parts(node: cst.CSTNode) -> list[Part]:
    """What each part of the binding ``node`` gives its names: the elements of ``a, b = x, y``;
    the value, not the key, of ``for k, v in d.items()`` and ``k, v = d.popitem()``; the item,
    not the index, of ``for i, x in enumerate(xs)``; each of ``for a, b in zip(xs, ys)``; else
    the whole binding's names from its value (or iterable)."""
    kind = type(node)
    if kind is cst.Assign and len(node.targets) == 1:
        target, value = node.targets[0].target, node.value
        if plain_sequence(target) and plain_sequence(value) and len(target.elements) == len(value.elements):
            return [Part(tuple(nodes.bound_texts(t.value)), v.value, True) for t, v in zip(target.elements, value.elements)]
        if (plain_sequence(target) and len(target.elements) == 2 and type(value) is cst.Call
                and type(value.func) is cst.Attribute and nodes.call_name(value) == "popitem"):
            return [Part(tuple(nodes.bound_texts(target.elements[0].value)), None, False),
                    Part(tuple(nodes.bound_texts(target.elements[1].value)), value.func.value, False)]
    elif kind in (cst.For, cst.CompFor) and plain_sequence(node.target) and type(node.iter) is cst.Call:
        elements, iterated = node.target.elements, node.iter
        name = nodes.call_name(iterated)
        given = [arg.value for arg in iterated.args]
        if name == "items" and type(iterated.func) is cst.Attribute and len(elements) == 2:
            return [Part(tuple(nodes.bound_texts(elements[0].value)), None, False),
                    Part(tuple(nodes.bound_texts(elements[1].value)), iterated.func.value, False)]
        if name == "enumerate" and given and len(elements) == 2:
            return [Part(tuple(nodes.bound_texts(elements[0].value)), None, False),
                    Part(tuple(nodes.bound_texts(elements[1].value)), given[0], False)]
        if name == "zip" and len(given) == len(elements):
            return [Part(tuple(nodes.bound_texts(t.value)), v, False) for t, v in zip(elements, given)]
    names = bound_names(node)
    if kind is cst.Assign or (kind is cst.AnnAssign and node.value is not None) or kind is cst.NamedExpr:
        return [Part(names, node.value, True)]
    if kind in (cst.For, cst.CompFor):
        return [Part(names, node.iter, False)]
    if kind is cst.AugAssign:
        return [Part(names, node.value, False)]
    return [Part(names, None, False)]


def plain_sequence(node: cst.CSTNode) -> bool:
    """A tuple or list display without a starred element: its elements pair up one to one."""
    return type(node) in (cst.Tuple, cst.List) and not any(type(e) is cst.StarredElement for e in node.elements)


def bindings(root: cst.CSTNode, name: str, *, methods: bool = False, declarations: bool = False) -> list[cst.CSTNode]:
    """The parts of statements in ``root`` that bind ``name``: an assignment, a loop or ``with``
    target, a walrus, and with ``declarations`` a ``global``/``nonlocal``. Nested functions and
    classes bind their own (a class's ``methods`` are entered when asked)."""
    nested = (cst.ClassDef, cst.Lambda) if methods else (cst.FunctionDef, cst.ClassDef, cst.Lambda)

    def enter(node: cst.CSTNode) -> bool:
        return node is root or not isinstance(node, nested)

    found: list[cst.CSTNode] = []
    for node in descendants(root, enter):
        if type(node) in BINDING_NODES and name in bound_names(node):
            found.append(node)
        elif declarations and isinstance(node, (cst.Global, cst.Nonlocal)) and any(n.name.value == name for n in node.names):
            found.append(node)
    return found


def bound_value(binding: cst.CSTNode, name: str) -> cst.CSTNode:
    """The value ``binding`` gives ``name`` where it is seen (``name = value``, ``name: T = value``,
    ``a, name = x, value``); the binding itself where it is not (a loop target, ``with ... as``,
    unpacking a call, ``+=``)."""
    for part in parts(binding) if type(binding) in BINDING_NODES else ():
        if part.exact and name in part.names and (len(part.names) == 1 or type(binding) is cst.Assign
                                                 and any(nodes.code(t.target) == name for t in binding.targets)):
            return part.value
    return binding
