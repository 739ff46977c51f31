"""Where a name is bound within a function, a class or a module: each binding, and the value it
gives the name where the code spells it out."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.tree_walk import descendants


def bindings(root: cst.CSTNode, name: str, *, methods: bool = False, declarations: bool = False) -> list[cst.CSTNode]:
    """The parts of statements in ``root`` that bind ``name``: an assignment, a loop or ``with``
    target, a walrus, and with ``declarations`` a ``global``/``nonlocal``. Nested functions and
    classes bind their own (a class's ``methods`` are entered when asked)."""
    nested = (cst.ClassDef, cst.Lambda) if methods else (cst.FunctionDef, cst.ClassDef, cst.Lambda)

    def enter(node: cst.CSTNode) -> bool:
        return node is root or not isinstance(node, nested)

    found: list[cst.CSTNode] = []
    for node in descendants(root, enter):
        if isinstance(node, cst.Assign) and any(name in nodes.bound_texts(t.target) for t in node.targets):
            found.append(node)
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)) and nodes.code(node.target) == name:
            found.append(node)
        elif isinstance(node, (cst.For, cst.CompFor)) and name in nodes.bound_texts(node.target):
            found.append(node)
        elif isinstance(node, cst.AsName) and name in nodes.bound_texts(node.name):
            found.append(node)
        elif isinstance(node, cst.NamedExpr) and nodes.code(node.target) == name:
            found.append(node)
        elif declarations and isinstance(node, (cst.Global, cst.Nonlocal)) and any(n.name.value == name for n in node.names):
            found.append(node)
    return found


def bound_value(binding: cst.CSTNode, name: str) -> cst.CSTNode:
    """The value ``binding`` gives ``name`` where it is seen (``name = value``, ``name: T = value``);
    the binding itself where it is not (a loop target, ``with ... as``, unpacking, ``+=``)."""
    if isinstance(binding, cst.Assign) and any(nodes.code(t.target) == name for t in binding.targets):
        return binding.value
    if isinstance(binding, cst.AnnAssign) and binding.value is not None:
        return binding.value
    return binding
