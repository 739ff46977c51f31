"""apex amp's internal state read in other files of a project, which a file's ``amp.initialize`` fills.

``amp._amp_state.loss_scalers`` in ``hooks/log_hooks.py`` (or ``from apex.amp._amp_state import
_amp_state`` in ``utils.py``) holds what ``amp.initialize`` in ``optimizer.py`` set up. Once that
initialize is rewritten away, those reads raise ``AttributeError`` the first time they run, and no
rewrite of ``optimizer.py`` can say so where it happens. So a file whose ``amp.initialize`` is
rewritten is told (``SETTING``) where else in its project (``files.project_root``, searched on disk
even when one file is given) apex's state is read, and is not rewritten while they are there.

Only reads that can reach this file's state count: in a package (``files.outermost_package``) that
holds this file or that this file imports from, in a file that initializes nothing itself (a
trainer of its own reads the state its own ``initialize`` fills). A folder of unrelated scripts
does not stop each other's rewrites.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import Path

from migrate import disk_reads
from migrate.files import outermost_package, place, places_elsewhere, project_trees_saying

__all__ = ["SETTING", "elsewhere"]

SETTING = "apex-state-read-elsewhere"  # the setting that hands a file these places (not a user setting)


def elsewhere(texts: Mapping[Path, str]) -> dict[Path, tuple[str, ...]]:
    """For each file in ``texts`` that calls ``amp.initialize``, the places (``path:line``,
    relative to its project) where another file of its project reads apex amp's internal state."""
    def reaching(path: Path, text: str, root: Path) -> tuple[str, ...]:
        me, imported = path.resolve(), _imported_roots(text)
        return tuple(place(file, line, root) for file, line, package in _reads(root)
                     if file != me and package is not None and (package in me.parents or package.name in imported))

    return places_elsewhere(texts, "initialize", reaching)


@disk_reads.cached(maxsize=64)
def _reads(root: Path) -> tuple[tuple[Path, int, Path | None], ...]:
    """Every read of ``_amp_state`` (``amp._amp_state``, ``from apex.amp._amp_state import ...``)
    in the project's ``.py`` files that initialize nothing, by file and line, with the package
    holding the file."""
    places = []
    for file, tree in project_trees_saying(root, b"_amp_state"):
        nodes = list(ast.walk(tree))
        if any(isinstance(node, ast.Attribute) and node.attr == "initialize" for node in nodes):
            continue
        package = outermost_package(file)
        loaded = frozenset(node.id for node in nodes if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load))
        places += [(file.resolve(), node.lineno, package) for node in nodes if _reads_state(node, loaded)]
    return tuple(places)


def _imported_roots(text: str) -> set[str]:
    """The top-level modules ``text`` imports from (``maskrcnn_benchmark`` for ``from
    maskrcnn_benchmark.engine import do_train``)."""
    return set(re.findall(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", text, re.MULTILINE))


def _reads_state(node: ast.AST, loaded: frozenset[str]) -> bool:
    """``amp._amp_state``, or an import of it whose name the file reads (``loaded``): one it never
    reads (``from apex.amp import _amp_state`` left over) needs no ``initialize`` to have run."""
    if isinstance(node, ast.Attribute):
        return node.attr == "_amp_state"
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("apex"):
        from_state = node.module.endswith("_amp_state")
        return any((from_state or alias.name == "_amp_state") and (alias.asname or alias.name) in loaded for alias in node.names)
    return False
