"""Functions of other files of a project that cast modules to float16: ``set_bn_eval(m)`` doing
``m.eval().half()`` on every BatchNorm, applied as ``model.apply(set_bn_eval)``.

apex O1 took float16 parameters as they came: it unscaled and stepped their gradients like any
others. ``GradScaler.unscale_`` refuses float16 gradients ("Attempting to unscale FP16
gradients"), so a file that hands its model to such a function cannot be migrated, even unsafely
(the first step raises). Each file that says apex is told (``SETTING``) the names it imports by
name from a module of its project found on disk that are such functions, with where each is.
"""
from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

from migrate import disk_reads, quiet
from migrate.module_paths import parsed_module, project_imports

__all__ = ["SETTING", "elsewhere"]

SETTING = "half-cast-helpers"  # imported name -> "path:line" of a function casting modules to float16 (not a user setting)


def elsewhere(texts: Mapping[Path, str]) -> dict[Path, tuple[tuple[str, str], ...]]:
    """For each file of ``texts``, the names it imports from another file of its project that
    cast modules to float16, with where each is."""
    found = {}
    for path, text in texts.items():
        names = _helpers_for(path, text)
        if names:
            found[path] = names
    return found


def _helpers_for(path: Path, text: str) -> tuple[tuple[str, str], ...]:
    try:
        tree = quiet.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    found: dict[str, str] = {}
    for node, file in project_imports(path, tree):
        casting = _casting_functions(str(file))
        root = Path(path).resolve().parent
        where = file.relative_to(root) if file.is_relative_to(root) else file
        found.update((alias.asname or alias.name, f"{where}:{casting[alias.name]}")
                     for alias in node.names if alias.name in casting)
    return tuple(sorted(found.items()))


@disk_reads.cached(maxsize=256)
def _casting_functions(file: str) -> dict[str, int]:
    """The module-level functions of ``file`` whose body casts something to float16 (``.half()``,
    ``.to(torch.float16)``, ``.to(dtype=torch.half)``), by name, with their line."""
    tree = parsed_module(file)
    if tree is None:
        return {}
    return {node.name: node.lineno for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(map(_casts_to_half, ast.walk(node)))}


def _casts_to_half(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    if node.func.attr == "half" and not node.args:
        return True
    values = [*node.args, *(keyword.value for keyword in node.keywords)]
    return node.func.attr == "to" and any(ast.unparse(value) in ("torch.float16", "torch.half") for value in values)
