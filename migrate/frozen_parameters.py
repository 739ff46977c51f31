"""Where a project freezes parameters (``p.requires_grad = False``, ``module.requires_grad_(False)``).

apex's ``convert_syncbn_model`` gave each converted BatchNorm layer new parameters, which require
gradients; torch's ``convert_sync_batchnorm`` keeps the layer's own. A BatchNorm weight frozen
before the conversion therefore trained under apex and stays frozen natively. The freezing is
usually in the model's file, so the project is searched: its files saying ``requires_grad`` are
read with ``ast``.
"""
from __future__ import annotations

import ast

from migrate.files import first_in_project

__all__ = ["freezing_line", "frozen_in_project"]


def frozen_in_project(filename: str) -> str | None:
    """The first line of the project holding ``filename`` that freezes a parameter, as
    ``path:line`` (from the project's root); None where there is none or no file on disk."""
    return first_in_project(filename, (b"requires_grad",), freezing_line)


def freezing_line(tree: ast.AST) -> int | None:
    """The first line of ``tree`` that sets ``.requires_grad`` to something other than ``True``
    (``False``, a flag) or calls ``.requires_grad_(...)`` with such an argument."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Attribute) and target.attr == "requires_grad" for target in node.targets):
            value = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "requires_grad_":
            value = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "requires_grad"), None)
            if value is None:
                continue  # `requires_grad_()` turns gradients on
        else:
            continue
        if not (isinstance(value, ast.Constant) and value.value is True):
            found.append(node.lineno)
    return min(found) if found else None
