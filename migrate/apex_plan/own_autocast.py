"""The file's own ``with ...autocast(...):`` that holds a statement, where a region would go inside it."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.tree import FileTree


def enclosing_autocast(tree: FileTree, statement: cst.CSTNode) -> cst.With | None:
    """The innermost ``with`` of one ``autocast(...)`` call around ``statement`` in its function
    (``with torch.cuda.amp.autocast(enabled=native):`` of a native path beside apex's), or None."""
    for node in tree.ancestors(statement):
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if isinstance(node, cst.With) and len(node.items) == 1 and isinstance(node.items[0].item, cst.Call) \
                and nodes.call_name(node.items[0].item) == "autocast":
            return node
    return None
