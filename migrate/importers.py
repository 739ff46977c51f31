"""The names other files of a project import from a file that imports apex: those its apex
imports bind, and the functions it defines.

A rewrite that swaps ``FusedLayerNorm`` for ``torch.nn.LayerNorm`` at every use also drops the
apex import that bound the name. Where a sibling module does ``from .layers import LayerNorm``
(the name the apex import gave, ``FusedLayerNorm as LayerNorm``), that package then fails to
import. Told which names those are (``SETTING``), the rename rules keep such a name bound to its
native counterpart, and AMP001 keeps such an import.

Only the names a file's apex imports bind at module level are looked for, in the ``.py`` files
of its project on disk (``files.project_root``): each is read as bytes, and parsed with ``ast``
only when it names one of them. A module is matched to an import by its path, as
``migrate.halves`` matches the halves of apex amp; an absolute import matches every file whose
path ends in its dotted name, so a name may be kept where it was not needed, never the reverse.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

from migrate import quiet
from migrate.files import project_python_files, project_root
from migrate.module_paths import is_module
from migrate.prefilter import APEX_FLAG_NAME, sets_apex_flag

__all__ = ["FUNCTIONS_SETTING", "SETTING", "apex_bound_names", "functions_imported_elsewhere", "imported_elsewhere", "importers_of",
           "top_level_statements"]

SETTING = "imported-elsewhere"  # the setting that hands a file's rules these names (not a user setting)
FUNCTIONS_SETTING = "functions-imported-elsewhere"  # and the plan the file's functions others import


def imported_elsewhere(texts: Mapping[Path, str]) -> dict[Path, frozenset[str]]:
    """For each file in ``texts`` (files that say apex), the names its apex imports bind that
    another file of its project imports from it; files with none are left out."""
    return _imported({path: names for path, text in texts.items() if (names := apex_bound_names(text))})


def functions_imported_elsewhere(texts: Mapping[Path, str]) -> dict[Path, frozenset[str]]:
    """For each file in ``texts``, the functions it defines at its top level that another file of
    its project imports from it (``from train import train_epoch``): a parameter the rewrite adds
    to one (the GradScaler handed on) would be missing from those calls."""
    return _imported({path: names for path, text in texts.items() if (names := _top_level_functions(text))})


def importers_of(path: Path, names: frozenset[str]) -> frozenset[Path]:
    """The files of ``path``'s project (resolved) that import any of ``names`` from it."""
    exporter = path.resolve()
    return frozenset(importer.resolve() for importer in project_python_files(project_root(path))
                     if any(found for _, found in _imports_from(importer, {exporter: names}, names)))


def _imported(bound: Mapping[Path, frozenset[str]]) -> dict[Path, frozenset[str]]:
    """Of the names each file of ``bound`` binds, those another file of its project imports from it."""
    by_root: dict[Path, dict[Path, frozenset[str]]] = {}
    for path, names in bound.items():
        by_root.setdefault(project_root(path), {})[path.resolve()] = names
    found: dict[Path, set[str]] = {}
    for root, exporters in by_root.items():
        wanted = frozenset().union(*exporters.values())
        for importer in project_python_files(root):
            for exporter, names in _imports_from(importer, exporters, wanted):
                found.setdefault(exporter, set()).update(names)
    resolved = {path.resolve(): path for path in bound}
    return {resolved[path]: frozenset(names) for path, names in found.items() if names}


def _top_level_functions(text: str) -> frozenset[str]:
    try:
        tree = quiet.parse(text)
    except (SyntaxError, ValueError):
        return frozenset()
    return frozenset(node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def apex_bound_names(text: str) -> frozenset[str]:
    """The names an apex import binds at the top level of ``text`` (inside ``if``/``try`` too,
    not in functions or classes): ``LayerNorm`` for ``from apex.normalization import
    FusedLayerNorm as LayerNorm``; and the apex-availability flags it sets there (``HAS_APEX``),
    which AMP018 removes once the file itself no longer reads them."""
    if "apex" not in text and not sets_apex_flag(text):
        return frozenset()
    try:
        tree = quiet.parse(text)
    except (SyntaxError, ValueError):
        return frozenset()
    names: set[str] = set()
    for node in top_level_statements(tree.body):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _is_apex(node.module or ""):
            names.update(alias.asname or alias.name for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Import):
            names.update(alias.asname or alias.name.split(".")[0] for alias in node.names if _is_apex(alias.name))
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets
                         if isinstance(target, ast.Name) and APEX_FLAG_NAME.match(target.id))
    return frozenset(names)


def _is_apex(module: str) -> bool:
    return module == "apex" or module.startswith("apex.")


def top_level_statements(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when the module is imported, through ``if``, ``try`` and ``with``."""
    for statement in statements:
        yield statement
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from top_level_statements(getattr(statement, field, []) or [])
        for handler in getattr(statement, "handlers", []) or []:
            yield from top_level_statements(handler.body)


def _imports_from(importer: Path, exporters: Mapping[Path, frozenset[str]], wanted: frozenset[str]) -> Iterator[tuple[Path, set[str]]]:
    """Each exporter ``importer`` imports some of its names from, with those names: by name
    (``from .layers import LayerNorm``), by ``*``, or as the module's attribute
    (``from . import layers`` then ``layers.LayerNorm``)."""
    try:
        data = importer.read_bytes()
    except OSError:
        return
    # a `from .layernorm import *` names nothing it takes: every public name is (a package's
    # `__init__` re-exporting a module's `LayerNorm`)
    if b"import" not in data or not (b"*" in data or any(name.encode() in data for name in wanted)):
        return
    try:
        tree = quiet.parse(data.decode("utf-8", "replace"))
    except (SyntaxError, ValueError):
        return
    modules_bound: dict[str, Path] = {}  # a local name bound to an exporter module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            parts = node.module.split(".") if node.module else []
            exporter = _exporter(importer, node.level, parts, exporters)
            if exporter is not None and exporter != importer:
                names = exporters[exporter]
                if any(alias.name == "*" for alias in node.names):
                    yield exporter, {name for name in names if not name.startswith("_")}
                else:
                    yield exporter, {alias.name for alias in node.names} & names
            for alias in node.names:  # `from package import module`
                exporter = _exporter(importer, node.level, [*parts, alias.name], exporters)
                if exporter is not None and exporter != importer:
                    modules_bound[alias.asname or alias.name] = exporter
        elif isinstance(node, ast.Import):
            for alias in node.names:
                exporter = _exporter(importer, 0, alias.name.split("."), exporters)
                if exporter is not None and exporter != importer and (alias.asname or "." not in alias.name):
                    modules_bound[alias.asname or alias.name] = exporter  # `import utils` then `utils.HAS_APEX`
    if modules_bound:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules_bound:
                exporter = modules_bound[node.value.id]
                if node.attr in exporters[exporter]:
                    yield exporter, {node.attr}


def _exporter(importer: Path, level: int, parts: list[str], exporters: Mapping[Path, frozenset[str]]) -> Path | None:
    """The exporter the module ``parts`` (``level`` dots before it) is, if any."""
    return next((path for path in exporters if is_module(path, importer, level, parts)), None)

