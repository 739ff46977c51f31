"""Where a file, or a module it imports, freezes parameters (``p.requires_grad = False``,
``module.requires_grad_(False)``).

apex's ``convert_syncbn_model`` gave each converted BatchNorm layer new parameters, which require
gradients; torch's ``convert_sync_batchnorm`` keeps the layer's own. A BatchNorm weight frozen
before the conversion therefore trained under apex and stays frozen natively. The freezing is
usually in the model's file, which the converting file imports (``from model.deeplab import
DeeplabMulti``): the file and the project modules it imports, found on disk and followed from
module to module, are read with ``ast``.
"""
from __future__ import annotations

import ast
from pathlib import Path

from migrate import disk_reads
from migrate.files import project_root
from migrate.module_paths import PROJECT_FOLDERS_UP, find_on_disk, parsed_module

__all__ = ["freezing_line", "freezing_line_elsewhere", "frozen_in_imports"]

_MOST_MODULES = 200  # followed from one file: a project's models and their helpers, not a vendored library


def frozen_in_imports(filename: str, converted_at: int = 0) -> str | None:
    """The first line that freezes a parameter in ``filename`` or a module it imports, as
    ``path:line`` (from the project's root); None where there is none or no file on disk. In
    ``filename``, a freeze after the conversion at line ``converted_at``, in the same function (or
    both at module level), froze the converted parameters under apex too: it does not count."""
    path = Path(filename)
    if path.suffix != ".py" or not path.is_file():
        return None
    return _first_from(path.resolve(), converted_at)


@disk_reads.cached(maxsize=64)
def _first_from(start: Path, converted_at: int) -> str | None:
    root = project_root(start)
    seen, pending = {start}, [start]
    while pending and len(seen) <= _MOST_MODULES:
        path = pending.pop(0)
        tree = parsed_module(str(path))
        if tree is None:
            continue
        line = freezing_line(tree, converted_at if path == start else 0)
        if line is not None:
            shown = path.relative_to(root) if path.is_relative_to(root) else path
            return f"{shown.as_posix()}:{line}"
        for found in _imported_files(tree, path):
            if found not in seen:
                seen.add(found)
                pending.append(found)
    return None


def _imported_files(tree: ast.Module, importer: Path):
    """The files of the project that ``tree``'s imports name (a module, or a submodule imported
    from a package: ``from model import deeplab``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            wanted = [(0, alias.name.split(".")) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = node.module.split(".") if node.module else []
            wanted = [(node.level, parts)] + [(node.level, parts + [alias.name]) for alias in node.names if alias.name != "*"]
        else:
            continue
        for level, parts in wanted:
            found = find_on_disk(importer, level, parts, PROJECT_FOLDERS_UP)
            if found is not None:
                yield found.resolve()


def freezing_line_elsewhere(tree: ast.AST) -> int | None:
    """``freezing_line`` of another file of the project, but for a script converting a model of its
    own (it calls ``convert_syncbn_model``): what it freezes is that model, not this file's."""
    if any(isinstance(node, ast.Attribute) and node.attr == "convert_syncbn_model"
           or isinstance(node, ast.Name) and node.id == "convert_syncbn_model" for node in ast.walk(tree)):
        return None
    return freezing_line(tree)


def freezing_line(tree: ast.AST, converted_at: int = 0) -> int | None:
    """The first line of ``tree`` that sets ``.requires_grad`` to something other than ``True``
    (``False``, a flag) or calls ``.requires_grad_(...)`` with such an argument; not a copy of
    another tensor's (``new.weight.requires_grad = old.weight.requires_grad``), which freezes nothing;
    nor one after line ``converted_at`` (where given) in the function holding that line."""
    found = []
    functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))] if converted_at else []
    converting = _function_holding(tree, functions, converted_at) if converted_at else None
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
        copied = isinstance(value, ast.Attribute) and value.attr == "requires_grad"  # kept as another tensor's
        after = converted_at and node.lineno > converted_at and _function_holding(tree, functions, node.lineno) is converting
        if not (isinstance(value, ast.Constant) and value.value is True) and not copied and not after:
            found.append(node.lineno)
    return min(found) if found else None


def _function_holding(tree: ast.AST, functions: list[ast.AST], line: int) -> ast.AST:
    """The innermost of ``functions`` (those of ``tree``) whose lines hold ``line``; ``tree`` itself at module level."""
    holding = [node for node in functions if node.lineno <= line <= (node.end_lineno or node.lineno)]
    return max(holding, key=lambda node: node.lineno) if holding else tree
