"""``else: amp = None`` beside the ``if`` that imported (and initialized) apex: the arm only
gave apex's module name ``None`` for the runs that skipped apex. Once nothing reads that name,
the arm goes with the ``if``'s apex lines (an ``if args.fp16: pass`` with an ``else:`` of dead
stores otherwise stays): where the rewrite replaces every reference to the module
(``only_module_fallbacks``), or where the import's removal left the ``if`` guarding nothing
(``if_with_dead_fallback``)."""
from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.fallback_arms import commented, given_none, read_in
from migrate.apex_plan.context import Sites
from migrate.apex_plan.tree import FileTree


def only_module_fallbacks(tree: FileTree, sites: Sites, arm: cst.CSTNode | None) -> bool:
    """Whether ``arm`` (an ``if``'s ``else``, no comment in it) only assigns ``None`` to names an
    apex import binds, and every reference to apex's module in the file is a call of apex's API the plan
    rewrites (no ``if amp is not None:`` nor ``train(model, amp)`` still reads it)."""
    names = given_none(arm)
    if not names or not names <= set(tree.imports) or commented(arm):
        return False
    for node, _ in tree.refs:
        call = tree.parent.get(id(node))
        if not (isinstance(call, cst.Call) and call.func is node and id(call) in sites.ids):
            return False
    return True


def if_with_dead_fallback(statement: cst.CSTNode, parent_of: Callable[[cst.CSTNode], cst.CSTNode | None]) -> cst.If | None:
    """The ``if <names and comparisons>:`` whose whole body is ``statement`` (a ``try`` left
    guarding nothing) in a function, where its ``else`` only gives ``None`` to names nothing in
    that function reads (``amp``, the import's fallback), and says nothing in a comment: removing
    ``statement`` removes it all."""
    block = parent_of(statement)
    owner = parent_of(block) if block is not None else None
    if not isinstance(owner, cst.If) or owner.body is not block or len(block.body) != 1 or not nodes.is_pure(owner.test):
        return None
    names = given_none(owner.orelse) if not commented(owner.orelse) else set()
    # a function's locals, read in it only (a module's names another file may import; `global
    # amp` in the function is a read of its own)
    function = next((node for node in _ancestors(owner, parent_of) if isinstance(node, cst.FunctionDef)), None)
    if not names or function is None:
        return None
    return None if read_in(function, names, parent_of) else owner


def _ancestors(node: cst.CSTNode, parent_of: Callable[[cst.CSTNode], cst.CSTNode | None]):
    while (node := parent_of(node)) is not None:
        yield node
