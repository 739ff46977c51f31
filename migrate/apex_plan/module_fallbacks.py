"""``else: amp = None`` beside the ``if`` that imported and initialized apex: the arm only
gave apex's module name ``None`` for the runs that skipped apex. Once every reference to the
module is a call the rewrite replaces, nothing reads that name, and the arm goes with the
``if``'s apex lines (an ``if args.fp16: pass`` with an ``else:`` of dead stores otherwise stays)."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Sites
from migrate.apex_plan.tree import FileTree


def only_module_fallbacks(tree: FileTree, sites: Sites, arm: cst.BaseSuite | cst.CSTNode | None) -> bool:
    """Whether ``arm`` (an ``if``'s ``else``) only assigns ``None`` to names an apex import
    binds, and every reference to apex's module in the file is a call of apex's API the plan
    rewrites (no ``if amp is not None:`` nor ``train(model, amp)`` still reads it)."""
    if not isinstance(arm, cst.Else) or not isinstance(arm.body, cst.IndentedBlock):
        return False
    for line in arm.body.body:
        if not isinstance(line, cst.SimpleStatementLine):
            return False
        for small in line.body:
            if not (isinstance(small, cst.Assign) and nodes.is_none(small.value) and all(
                    isinstance(target.target, cst.Name) and target.target.value in tree.imports for target in small.targets)):
                return False
    for node, _ in tree.refs:
        call = tree.parent.get(id(node))
        if not (isinstance(call, cst.Call) and call.func is node and id(call) in sites.ids):
            return False
    return True
