"""apex cast registrations in other files of a project, which a file's ``amp.initialize`` obeyed.

``amp.register_half_function(torch, "einsum")`` in ``models/attention.py`` changes what apex's
O1 casts everywhere, once ``amp.initialize`` runs in ``train.py``. Native autocast reads no such
list: the rewrite of ``train.py``'s initialize then computes those ops in autocast's own
precision, whether or not ``attention.py`` is migrated in the same run. So a file whose
``amp.initialize`` is rewritten is told (``SETTING``) where else in its project (``files.
project_root``, searched on disk even when one file is given) the cast lists change, and its
rewrite is unsafe. A registration that asks for the cast native autocast makes anyway
(``native_casts``) changes nothing and is not counted.
"""
from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

from migrate import disk_reads, quiet
from migrate.files import in_project, place, places_elsewhere, project_files_saying
from migrate.native_casts import registered_natively

__all__ = ["SETTING", "elsewhere"]

SETTING = "apex-casts-elsewhere"  # the setting that hands a file these places (not a user setting)
_REGISTERS = frozenset({"register_half_function", "register_float_function", "register_promote_function"})


def elsewhere(texts: Mapping[Path, str]) -> dict[Path, tuple[str, ...]]:
    """For each file in ``texts`` that calls ``amp.initialize``, the places (``path:line``,
    relative to its project) where another file of its project changes apex's cast lists."""
    return places_elsewhere(texts, "initialize", lambda path, _, root: tuple(
        place(file, line, root) for file, line in _registrations(root) if file != path.resolve()))


@disk_reads.cached(maxsize=64)
def _registrations(root: Path) -> tuple[tuple[Path, int], ...]:
    """Every cast registration native autocast does not make, in the project's ``.py`` files."""
    places = []
    for file, data in project_files_saying(root, b"register_"):
        if not any(name.encode() in data for name in _REGISTERS):
            continue
        try:
            tree = quiet.parse(data)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        found = [(file, node.lineno) for node in ast.walk(tree) if _changes_casts(node)]
        if found and in_project(file, root):  # not a project of its own inside this one
            places += found
    return tuple(places)


def _changes_casts(node: ast.AST) -> bool:
    """``amp.register_half_function(torch, "einsum")`` asking for a cast native autocast does not make."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _REGISTERS):
        return False
    module = ast.unparse(node.args[0]) if node.args else ""
    name = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
    return not registered_natively(f"apex.amp.{node.func.attr}", {module}, name if isinstance(name, str) else None)
