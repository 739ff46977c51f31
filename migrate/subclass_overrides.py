"""Methods of a file's classes that subclasses in other files of its project override.

``FP16Trainer._apex_backward(self, scaled_loss)`` runs ``scaled_loss.backward()`` inside
``amp.scale_loss``, and ``HVDTrainer(FP16Trainer)`` in ``trainer_hvd.py`` overrides it (and
``_apex_step``, its ``self.optimizer.step()``). A rewrite of the base file changes what those
methods are handed and must do (a scaled loss to step through the scaler), which the overrides,
not rewritten, do not do: the subclass's runs then step unscaled or raise. So each file that says
apex is told (``SETTING``) the methods of its classes that a subclass elsewhere in its project
(``files.project_root``, searched on disk even when one file is given) overrides, with where.
"""
from __future__ import annotations

import ast
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

from migrate import quiet
from migrate.files import place, project_root, project_trees_saying

__all__ = ["SETTING", "elsewhere"]

SETTING = "subclass-overrides"  # ((class, method, "path:line"), ...) (not a user setting)


def elsewhere(texts: Mapping[Path, str]) -> dict[Path, tuple[tuple[str, str, str], ...]]:
    """For each file of ``texts``, its classes' methods that a class of another file of its
    project, naming one of them as its base, defines again, with where."""
    found = {}
    for path, text in texts.items():
        try:
            classes = {node.name: {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
                       for node in ast.walk(quiet.parse(text)) if isinstance(node, ast.ClassDef)}
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        if not classes:
            continue
        root, me = project_root(path), path.resolve()
        overrides = tuple((base, method, place(file, line, root))
                          for name in sorted(classes)
                          for file, base, method, line in _subclass_methods(root, name, path.stem)
                          if file != me and method in classes[name] and not method.startswith("__"))
        if overrides:
            found[path] = overrides
    return found


@lru_cache(maxsize=256)
def _subclass_methods(root: Path, base: str, module: str) -> tuple[tuple[Path, str, str, int], ...]:
    """Every method of a class of the project naming ``base`` as a base (``class Sub(Base)``,
    ``class Sub(module.Base)``), by file, with its line; only in files that import ``module``
    (the base's, by its last name): a class of the same name elsewhere is another class."""
    found = []
    for file, tree in project_trees_saying(root, base.encode()):
        if not _imports(tree, module):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).split(".")[-1] == base for b in node.bases):
                found += [(file.resolve(), base, item.name, item.lineno) for item in node.body
                          if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return tuple(found)


def _imports(tree: ast.Module, module: str) -> bool:
    """Whether ``tree`` imports the module whose last name is ``module`` (``from pkg.fp16 import
    Base``, ``from pkg import fp16``, ``import pkg.fp16``, ``from .fp16 import Base``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and ((node.module or "").split(".")[-1] == module
                                                 or any(alias.name == module for alias in node.names)):
            return True
        if isinstance(node, ast.Import) and any(alias.name.split(".")[-1] == module for alias in node.names):
            return True
    return False
