"""What a base class in another file of a project keeps of its ``__init__``'s parameters.

A pix2pix model initializes apex under ``if opt.apex:`` in ``__init__(self, opt)``, which hands
``opt`` to ``BaseModel.__init__(self, opt)``; ``BaseModel``, in ``base_model.py``, keeps it as
``self.opt = opt``, and the model's ``backward_D()`` tests ``if self.opt.apex:`` around the scaled
backward pass, its plain one in the ``else:``. Only that other file says ``self.opt.apex`` is the
flag that held ``initialize``. So each file that says apex is told (``SETTING``), for the classes
it imports by name from a module of its project found on disk, which attributes their
``__init__`` binds to one of its parameters as it is, and that parameter's position.
"""
from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

from migrate import disk_reads, quiet
from migrate.module_paths import parsed_module, project_imports

__all__ = ["SETTING", "elsewhere"]

# (class, attribute, position of the parameter after `self`): `BaseModel.__init__(self, opt)`
# binds `self.opt = opt` (not a user setting)
SETTING = "base-bindings"


def elsewhere(texts: Mapping[Path, str]) -> dict[Path, tuple[tuple[str, str, int], ...]]:
    """For each file of ``texts`` that scales a loss, the classes it imports from another file of
    its project whose ``__init__`` keeps a parameter as an attribute, with which and where."""
    found = {}
    for path, text in texts.items():
        if "scale_loss" in text and "__init__" in text:
            kept = _kept_for(path, text)
            if kept:
                found[path] = kept
    return found


def _kept_for(path: Path, text: str) -> tuple[tuple[str, str, int], ...]:
    tree = quiet.parse_or_none(text)
    if tree is None:
        return ()
    # only a class's base is asked about (`class Pix2PixModel(BaseModel):`)
    bases = {base.id for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef) for base in cls.bases if isinstance(base, ast.Name)}
    kept = set()
    for node, file in project_imports(path, tree, bases):
        classes = _parameters_kept(str(file))
        kept.update((alias.asname or alias.name, attribute, position)
                    for alias in node.names for attribute, position in classes.get(alias.name, ()))
    return tuple(sorted(kept))


@disk_reads.cached(maxsize=256)
def _parameters_kept(file: str) -> dict[str, tuple[tuple[str, int], ...]]:
    """For each module-level class of ``file``: ``(attribute, position)`` for each
    ``self.attribute = parameter`` in its ``__init__``'s own lines, the parameter bound nowhere
    else there, the attribute bound nowhere else in the class."""
    tree = parsed_module(file)
    if tree is None:
        return {}
    found = {}
    for cls in tree.body:
        init = next((item for item in getattr(cls, "body", ()) if isinstance(cls, ast.ClassDef)
                     and isinstance(item, ast.FunctionDef) and item.name == "__init__"), None)
        if init is None or init.args.vararg is not None:
            continue
        positional = [arg.arg for arg in [*init.args.posonlyargs, *init.args.args][1:]]
        targets = [target for node in ast.walk(cls) for target in _targets(node)]
        kept = []
        for line in init.body:
            if not (isinstance(line, ast.Assign) and len(line.targets) == 1 and isinstance(line.value, ast.Name)):
                continue
            attribute, parameter = ast.unparse(line.targets[0]), line.value.id
            if (attribute.startswith("self.") and attribute.count(".") == 1 and parameter in positional
                    and targets.count(attribute) == 1 and parameter not in targets):
                kept.append((attribute.removeprefix("self."), positional.index(parameter)))
        if kept:
            found[cls.name] = tuple(kept)
    return found


def _targets(node: ast.AST) -> list[str]:
    """What ``node`` binds, as written (``self.opt``, ``opt``, ``self.opt.apex``)."""
    if isinstance(node, ast.Assign):
        bound = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.NamedExpr)):
        bound = [node.target]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        bound = [node.optional_vars]
    else:
        return []
    names = []
    for target in bound:
        names.extend(ast.unparse(part) for part in ast.walk(target) if isinstance(part, (ast.Name, ast.Attribute, ast.Subscript)))
    return names
