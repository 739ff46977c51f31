"""Where a project checkpoints activations reentrantly (``torch.utils.checkpoint.checkpoint(blk, x)``).

apex's DistributedDataParallel all-reduced after the backward pass whatever got a gradient;
torch's, told to find unused parameters as apex tolerated them (``find_unused_parameters=True``),
raises at the first backward pass of a model that recomputes its blocks in a reentrant backward
("Expected to mark a variable ready only once"). A model is usually defined in another file
than the one wrapping it, so the project is searched: its files that import
``torch.utils.checkpoint`` are read with ``ast`` for a ``checkpoint``/``checkpoint_sequential``
call without ``use_reentrant=False`` (torch's default was reentrant).
"""
from __future__ import annotations

import ast

from migrate.files import first_in_project

__all__ = ["reentrant_in_project"]

_MODULE = "torch.utils.checkpoint"
_CALLS = frozenset({"checkpoint", "checkpoint_sequential"})


def reentrant_in_project(filename: str) -> str | None:
    """The first reentrant activation checkpoint of the project holding ``filename``, as
    ``path:line`` (from the project's root); None where there is none or no file on disk."""
    return first_in_project(filename, (b"torch.utils.checkpoint", b"torch.utils import checkpoint"), _reentrant_call)


def _reentrant_call(tree: ast.Module) -> int | None:
    functions: set[str] = set()  # names bound to torch's checkpoint functions
    modules: set[str] = {_MODULE}  # dotted names bound to torch.utils.checkpoint
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == _MODULE:
            functions.update(alias.asname or alias.name for alias in node.names if alias.name in _CALLS)
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.utils":
            modules.update(alias.asname or alias.name for alias in node.names if alias.name == "checkpoint")
        elif isinstance(node, ast.Import):
            modules.update(alias.asname for alias in node.names if alias.name == _MODULE and alias.asname)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        named = isinstance(func, ast.Name) and func.id in functions
        dotted = isinstance(func, ast.Attribute) and func.attr in _CALLS and ast.unparse(func.value) in modules
        if (named or dotted) and not any(
                keyword.arg == "use_reentrant" and isinstance(keyword.value, ast.Constant) and keyword.value.value is False
                for keyword in node.keywords):
            return node.lineno
    return None
