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
from pathlib import Path

from migrate import disk_reads, quiet
from migrate.files import place, project_root, project_trees_saying

__all__ = ["SETTING", "elsewhere"]

SETTING = "subclass-overrides"  # ((class, method, "path:line"), ...) (not a user setting)


def elsewhere(texts: Mapping[Path, str]) -> dict[Path, tuple[tuple[str, str, str], ...]]:
    """For each file of ``texts``, its classes' methods that a class of another file of its
    project, naming one of them as its base, defines again, with where."""
    classes_of: dict[Path, dict[str, set[str]]] = {}
    for path, text in texts.items():
        if "scale_loss" not in text or "class " not in text:
            continue  # the overrides that matter are of the methods around the scaled backward
        try:
            classes_of[path] = {node.name: {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
                                for node in quiet.parse(text).body if isinstance(node, ast.ClassDef) and _steps(node)}
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    by_root: dict[Path, set[str]] = {}
    for path, classes in classes_of.items():
        by_root.setdefault(project_root(path), set()).update(classes)
    found = {}
    for path, classes in classes_of.items():
        root, me = project_root(path), path.resolve()
        index = _subclasses(root, frozenset(by_root[root]))  # one search of the project for all the run's classes
        overrides = tuple((base, method, place(file, line, root))
                          for base in sorted(classes) for file, method, line, modules in index.get(base, ())
                          if file != me and method in classes[base] and not method.startswith("__") and path.stem in modules)
        if overrides:
            found[path] = overrides
    return found


@disk_reads.cached(maxsize=64)
def _subclasses(root: Path, bases: frozenset[str]) -> dict[str, tuple[tuple[Path, str, int, frozenset[str]], ...]]:
    """For each of ``bases``, every method of a class of the project naming it as a base (``class
    Sub(Base)``, ``class Sub(module.Base)``): its file, name and line, and the modules that file
    imports by their last name (a class of the same name from another module is another class)."""
    found: dict[str, list] = {}
    if not bases:
        return {}
    for file, tree in project_trees_saying(root, tuple(base.encode() for base in sorted(bases))):
        modules = _imported_modules(tree)
        for node in tree.body:  # the module's classes
            if not isinstance(node, ast.ClassDef):
                continue
            for base in {ast.unparse(b).split(".")[-1] for b in node.bases} & bases:
                found.setdefault(base, []).extend((file.resolve(), item.name, item.lineno, modules) for item in node.body
                                                  if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return {base: tuple(methods) for base, methods in found.items()}


def _imported_modules(tree: ast.Module) -> frozenset[str]:
    """The last names of the modules ``tree`` imports (``fp16`` for ``from pkg.fp16 import Base``,
    ``from pkg import fp16``, ``import pkg.fp16``, ``from .fp16 import Base``)."""
    names = set()
    # the module's imports, also those under a `try:` or an `if`
    for node in (inner for top in tree.body for inner in (top, *getattr(top, "body", ()), *getattr(top, "orelse", ()),
                                                          *(line for handler in getattr(top, "handlers", ()) for line in handler.body))):
        if isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[-1])
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[-1] for alias in node.names)
    return frozenset(names)


def _steps(owner: ast.ClassDef) -> bool:
    """Whether a method of ``owner`` scales a loss or steps an optimizer: the only classes whose
    overrides the rewrite can leave behind (a model's ``nn.Module`` is searched for nothing)."""
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr in ("scale_loss", "step", "master_params") for node in ast.walk(owner))
