"""apex's ``amp`` handed out by a module of the project: ``utils/amp_compat.py`` imports it from
apex (often in a ``try``, with a stand-in for machines without apex), and the training files do
``from utils.amp_compat import amp``. Their ``amp.initialize`` and ``amp.scale_loss`` are apex's,
reached through an import the codemod does not follow to apex; AMP016 reports them, told here
which dotted names mean apex's amp in each file (``SETTING``).

A module hands out apex's amp where its top level binds it (``from apex import amp``, ``import
apex.amp as amp``, in an ``if`` or a ``try`` too), or imports it there by name from another such
module, or all of its public names (a package's ``__init__`` re-exporting it), followed through
``_DEPTH`` modules. A file imports it by name (``from utils.amp_compat import amp as A``), or imports
the module and reads it as an attribute (``from utils import amp_compat``, then ``amp_compat.amp``);
each gives the name as libcst's qualified names spell it there (``.amp_compat.amp`` for a relative
import). A file's own star import is not followed here: AMP016 reports a name no import binds
anyway. A module is the file on disk the import names, as Python finds it from a
script run at the project's root (``module_paths.find_on_disk``).
"""
from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

from migrate import quiet
from migrate.halves import shown
from migrate.importers import top_level_statements
from migrate.module_paths import PROJECT_FOLDERS_UP, find_on_disk, parsed_module
from migrate.prefilter import AMP_API

__all__ = ["SETTING", "reexported"]

SETTING = "apex-amp-reexported"  # the setting that hands a file these names and their modules (not a user setting)
_DEPTH = 3  # modules handing it on, one from the other, followed


def reexported(texts: Mapping[Path, str]) -> dict[Path, tuple[tuple[str, str], ...]]:
    """For each file of ``texts`` that imports apex's amp from a module of its project: each
    dotted name meaning it there, with the module's path relative to the project's root."""
    found: dict[Path, tuple[tuple[str, str], ...]] = {}
    bound: dict[Path, frozenset[str]] = {}  # each module read: the names its top level binds to apex's amp
    for path, text in texts.items():
        try:
            tree = quiet.parse(text)
        except (SyntaxError, ValueError):
            continue
        names = {(name, shown(module)) for name, module in _dotted_names(path.resolve(), tree, bound)}
        if names:
            found[path] = tuple(sorted(names))
    return found


def _dotted_names(importer: Path, tree: ast.Module, bound: dict[Path, frozenset[str]]) -> Iterator[tuple[str, Path]]:
    """Each dotted name meaning apex's amp in ``importer``, with the module it comes from; only
    imports binding a name that apex's API is read from (``A`` of ``A.initialize``, ``amp_compat``
    of ``amp_compat.amp.scale_loss``) are followed to their files."""
    read = {_root(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in AMP_API}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            parts = node.module.split(".") if node.module else []
            prefix = "." * node.level + (node.module or "")
            joined = f"{prefix}." if node.module else prefix
            for alias in node.names:
                if (alias.asname or alias.name) not in read:
                    continue
                module = _module(importer, node.level, parts)
                if module is not None and alias.name in _amp_bound(module, bound, _DEPTH):
                    yield f"{joined}{alias.name}", module  # `from utils.amp_compat import amp`
                named = _module(importer, node.level, [*parts, alias.name])
                if named is not None:  # `from utils import amp_compat`, then `amp_compat.amp`
                    yield from ((f"{joined}{alias.name}.{name}", named) for name in _amp_bound(named, bound, _DEPTH))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if (alias.asname or alias.name.split(".")[0]) not in read:
                    continue
                module = _module(importer, 0, alias.name.split("."))
                if module is not None:  # `import utils.amp_compat [as c]`, then `c.amp`
                    yield from ((f"{alias.name}.{name}", module) for name in _amp_bound(module, bound, _DEPTH))


def _root(node: ast.expr) -> str | None:
    """``a`` of ``a.b.c``."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _amp_bound(module: Path, bound: dict[Path, frozenset[str]], depth: int) -> frozenset[str]:
    """The names ``module``'s top level binds to apex's amp: imported from apex, or by name from
    a module that binds it (``depth`` more of them followed)."""
    if module in bound:
        return bound[module]
    bound[module] = frozenset()  # an import cycle finds nothing more
    tree = parsed_module(str(module))
    names: set[str] = set()
    for node in top_level_statements(tree.body) if tree is not None else ():
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "apex":
            names.update(alias.asname or alias.name for alias in node.names if alias.name == "amp")
        elif isinstance(node, ast.Import):
            names.update(alias.asname for alias in node.names if alias.name == "apex.amp" and alias.asname)
        elif isinstance(node, ast.ImportFrom) and depth > 1 and (
                source := _module(module, node.level, node.module.split(".") if node.module else [])) is not None:
            handed = _amp_bound(source, bound, depth - 1)
            names.update(alias.asname or alias.name for alias in node.names if alias.name in handed)
            if any(alias.name == "*" for alias in node.names):  # `from .amp_compat import *`
                names.update(name for name in handed if not name.startswith("_"))
    bound[module] = frozenset(names)
    return bound[module]


def _module(importer: Path, level: int, parts: list[str]) -> Path | None:
    """The file of the project's module ``parts`` (``level`` dots before it) as ``importer`` imports it."""
    if not parts or parts[0] in ("apex", "torch"):
        return None
    found = find_on_disk(importer, level, parts, PROJECT_FOLDERS_UP)
    return found.resolve() if found is not None and found.resolve() != importer else None
