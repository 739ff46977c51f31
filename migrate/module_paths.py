"""Which file an import names: ``from .utils import misc``, ``import slowfast.utils.misc``.

A relative import names exact files (``utils/misc.py`` or ``utils/misc/__init__.py`` beside the
importer's package); an absolute one names any file whose path ends in its dotted name, since the
folder it is imported from (the project's root, a ``src`` folder on ``sys.path``) is not known.
Used to pair a project's files (``halves``, ``importers``) and to read a helper's file
(``step_model.imported_helpers``, ``grad_norms``: ``parsed_module``).
"""
from __future__ import annotations

import ast
from collections.abc import Container, Iterator, Sequence
from pathlib import Path

from migrate import quiet

__all__ = ["PROJECT_FOLDERS_UP", "find_on_disk", "is_module", "parsed_module", "project_imports"]

PROJECT_FOLDERS_UP = 8  # how far above a file a module of its project is looked for, reading a helper's file
_LARGEST_FILE = 2_000_000  # a module larger than this is not read (generated code, vendored data)


def is_module(path: Path, importer: Path, level: int, parts: Sequence[str]) -> bool:
    """Whether ``path`` is the module ``parts`` (``level`` dots before it) that ``importer`` imports;
    both paths resolved."""
    if not parts:
        return False
    if level:
        if level > len(importer.parents):
            return False  # above the root: nothing there
        base = importer.parents[level - 1]
        return path in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py"))
    endings = ((*parts[:-1], parts[-1] + ".py"), (*parts, "__init__.py"))
    return any(path.parts[-len(ending):] == ending for ending in endings)


def find_on_disk(importer: Path, level: int, parts: Sequence[str], folders_up: int) -> Path | None:
    """The file of the module ``parts`` as ``importer`` imports it: for an absolute import, looked
    for in the importer's folder and up to ``folders_up`` folders above (as Python finds it from a
    script run at the project's root); None where none is there."""
    if not parts or level > len(importer.parents):
        return None
    bases = [importer.parents[level - 1]] if level else list(importer.parents)[:folders_up]
    for base in bases:
        for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate
    return None


def project_imports(path: Path, tree: ast.Module, names: Container[str] | None = None) -> Iterator[tuple[ast.ImportFrom, Path]]:
    """Each ``from module import name`` of ``tree`` (``path``'s) whose module is another file of
    its project found on disk, with that file; with ``names``, only those importing one of them
    (as the file names it): the others are not looked for on disk."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None and (
                names is None or any((alias.asname or alias.name) in names for alias in node.names)):
            file = find_on_disk(path.resolve(), node.level, node.module.split("."), PROJECT_FOLDERS_UP)
            if file is not None and file.resolve() != path.resolve():
                yield node, file


def parsed_module(file: str) -> ast.Module | None:
    """``file``'s syntax tree (``ast``), read to know what its functions do; None where it cannot
    be read or parsed, or is larger than a module is written by hand."""
    try:
        with open(file, "rb") as handle:
            data = handle.read(_LARGEST_FILE + 1)
        if len(data) > _LARGEST_FILE:
            return None
        return quiet.parse(data)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
