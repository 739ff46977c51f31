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
    """The module-level functions of ``file`` that cast a module they are handed to float16
    (``.half()``, ``.to(torch.float16)``, ``.to(dtype=torch.half)``), by name, with their line."""
    tree = parsed_module(file)
    if tree is None:
        return {}
    return {node.name: node.lineno for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _casts_a_module_handed(node)}


_MODULE_METHODS = frozenset({"eval", "train", "cuda", "cpu", "to", "float", "half", "type", "requires_grad_"})  # return the module
_SUBMODULES = frozenset({"modules", "children", "named_modules", "named_children"})


def _casts_a_module_handed(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``function`` casts to float16 a module it is handed: a parameter (of it or of a
    lambda in it), a name bound to one, or one of its ``modules()`` looped over. A tensor it
    makes or gets back from a forward pass (``scores.data.squeeze(1).half()``) is no module."""
    handed = {arg.arg for node in ast.walk(function) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
              for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}
    for _ in range(2):  # a name bound to a name bound to a parameter
        for node in ast.walk(function):
            if isinstance(node, ast.For) and _module_root(node.iter, handed, _SUBMODULES) is not None:
                handed |= {name.id for name in ast.walk(node.target) if isinstance(name, ast.Name)}
            elif isinstance(node, ast.Assign) and _module_root(node.value, handed) is not None:
                handed |= {name.id for target in node.targets for name in ast.walk(target) if isinstance(name, ast.Name)}
    return any(_casts_to_half(node) and _module_root(node.func.value, handed) is not None for node in ast.walk(function))


def _module_root(value: ast.AST, handed: set[str], last: frozenset[str] = _MODULE_METHODS) -> str | None:
    """The handed name ``value`` is a module of (``m``, ``m.eval()``, ``model.module``,
    ``net if x else model``); with ``last``, the final call must be one of those methods."""
    if isinstance(value, ast.IfExp):
        return _module_root(value.body, handed) or _module_root(value.orelse, handed)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in last:
        return _module_root(value.func.value, handed)
    if last is _SUBMODULES:
        return None
    if isinstance(value, ast.Attribute) and value.attr == "module":  # a wrapper's module
        return _module_root(value.value, handed)
    return value.id if isinstance(value, ast.Name) and value.id in handed else None


def _casts_to_half(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    if node.func.attr == "half" and not node.args:
        return True
    values = [*node.args, *(keyword.value for keyword in node.keywords)]
    return node.func.attr == "to" and any(ast.unparse(value) in ("torch.float16", "torch.half") for value in values)
