"""apex's ``amp`` read where no binding reaches it: ``from apex import amp`` made local to
``__init__`` (or ``setup()``) while ``train()`` calls ``amp.scale_loss``, or the import commented
out. Python raises ``NameError`` there the first time mixed precision runs; the code meant apex's
module, and only apex's has ``scale_loss``. The plan takes such reads as apex's (an unsafe
rewrite: the original never ran that far), and says so."""
from __future__ import annotations

from collections.abc import Mapping

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.tree_walk import descendants

# What no ``amp`` but apex's has: ``torch.cuda.amp`` has neither, and a config's ``initialize``
# takes no ``opt_level``.
_APEX_ONLY = frozenset({"scale_loss", "master_params"})


def unbound_reads(scopes: Mapping[cst.CSTNode, object], module: cst.Module) -> dict[int, cst.Name]:
    """The receivers ``amp`` of ``amp.<attr>`` that no binding reaches (by id), where the file
    calls an apex-only API through such an unbound name. None in a file with a star import: it
    may bind anything. Scopes are asked only of the names an apex-only call goes through."""
    receivers, apex_only = [], []
    for node in descendants(module):
        if type(node) is cst.ImportFrom and type(node.names) is cst.ImportStar:
            return {}
        if type(node) is cst.Attribute and type(node.value) is cst.Name:
            receivers.append(node.value)
        elif type(node) is cst.Call and type(node.func) is cst.Attribute and type(node.func.value) is cst.Name and _apex_only(node):
            apex_only.append(node.func.value)
    apex_names = {name.value for name in apex_only if not _reachable(scopes, name)}
    return {id(name): name for name in receivers if name.value in apex_names and not _reachable(scopes, name)}


def _reachable(scopes: Mapping[cst.CSTNode, object], name: cst.Name) -> bool:
    scope = scopes.get(name)
    return scope is None or name.value in scope  # a builtin is in reach too


def _apex_only(call: cst.Call) -> bool:
    """``amp.scale_loss(...)``, ``amp.master_params(...)``, ``amp.initialize(..., opt_level=...)``."""
    attr = call.func.attr.value
    return attr in _APEX_ONLY or (attr == "initialize" and "opt_level" in nodes.keyword_names(call))
