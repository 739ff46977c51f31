"""Resolve what a name or call refers to through the file's imports, never by its spelling."""
from __future__ import annotations

from collections.abc import Collection

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import QualifiedNameProvider, QualifiedNameSource, ScopeProvider

from migrate.tree_walk import analysing, descendants, memo_per_tree
from migrate.types import ImportChange

_RESOLVED = (QualifiedNameSource.IMPORT, QualifiedNameSource.BUILTIN)


def qualified_names(visitor: cst.MetadataDependent, node: cst.CSTNode) -> frozenset[str]:
    """Every fully qualified name ``node`` may refer to, resolved through imports.

    ``from apex import amp as A; A.initialize`` and ``import apex.amp; apex.amp.initialize``
    both give ``{"apex.amp.initialize"}``; a local ``initialize`` gives nothing.
    """
    table = visitor.metadata.get(QualifiedNameProvider)
    found = _answers.get(id(node))
    if found is not None and found[1] is table:
        return found[2]
    if hasattr(table, "resolved_names"):  # migrate.metadata's, with a shortcut for local names
        try:
            names = table.resolved_names(node, _RESOLVED)
        except KeyError:
            names = frozenset()
    else:
        found = visitor.get_metadata(QualifiedNameProvider, node, ())
        names = frozenset(q.name for q in found if q.source in _RESOLVED)
    if analysing():
        _answers[id(node)] = (node, table, names)
    return names


# Every rule of an analysis asks about the same names: the answers are kept, by node, while it lasts.
_answers: dict[int, tuple[cst.CSTNode, object, frozenset[str]]] = memo_per_tree()


def may_resolve_within(visitor: cst.MetadataDependent, node: cst.CSTNode, packages: Collection[str]) -> bool:
    """Whether ``node`` may resolve to a name in one of ``packages`` (top-level: ``apex``,
    ``torch``). False only when no import of them binds its root: asked before ``qualified_names``
    of every name in a file, it spares the scope lookups of all the others."""
    table = visitor.metadata.get(QualifiedNameProvider)
    return not hasattr(table, "may_come_from") or table.may_come_from(node, packages)


def resolves_to(visitor: cst.MetadataDependent, node: cst.CSTNode, *names: str) -> str | None:
    """The first of ``names`` that ``node`` resolves to, or None."""
    found = qualified_names(visitor, node)
    return next((name for name in names if name in found), None)


def import_binding(visitor: cst.MetadataDependent, name: cst.Name) -> ImportChange | None:
    """The import statement that binds ``name`` where it is used, as an ``ImportChange``.

    ``from torch.cuda import amp as A`` gives ``ImportChange("torch.cuda", "amp", "A")`` for ``A``;
    ``import torch.cuda.amp`` gives ``ImportChange("torch.cuda.amp")`` for ``torch``. Hand it to
    ``remove_imports`` once a fix no longer uses the name. None for local names and relative imports.
    The visitor must declare ``ScopeProvider`` (``Rule`` does).
    """
    scope = visitor.get_metadata(ScopeProvider, name, None)
    if scope is None:
        return None
    for assignment in scope[name.value]:
        statement = getattr(assignment, "node", None)
        if not isinstance(statement, (cst.Import, cst.ImportFrom)) or isinstance(statement.names, cst.ImportStar):
            continue
        if isinstance(statement, cst.ImportFrom) and (statement.relative or statement.module is None):
            continue
        for alias in statement.names:
            bound = alias.evaluated_alias or (
                alias.evaluated_name.split(".")[0] if isinstance(statement, cst.Import) else alias.evaluated_name
            )
            if bound != name.value:
                continue
            if isinstance(statement, cst.Import):
                return ImportChange(alias.evaluated_name, None, alias.evaluated_alias)
            module = get_full_name_for_node(statement.module)
            return ImportChange(module, alias.evaluated_name, alias.evaluated_alias)
    return None


def imported_as(module: cst.Module, package: str, objects: Collection[str], *, top_level: bool = False) -> dict[str, str]:
    """The name each of ``objects`` has in ``module`` through ``from <package> import obj [as name]``
    (``package`` or a submodule of it); a star import gives each its own name. ``top_level``: only
    the module's own imports, not one inside a function or a block (which binds the name there only)."""
    found: dict[str, str] = {}
    statements = ([small for line in module.body if isinstance(line, cst.SimpleStatementLine) for small in line.body]
                  if top_level else descendants(module))
    for node in statements:
        if type(node) is not cst.ImportFrom or node.module is None or node.relative:
            continue
        name = get_full_name_for_node(node.module) or ""
        if name != package and not name.startswith(package + "."):
            continue
        if isinstance(node.names, cst.ImportStar):
            found.update((obj, obj) for obj in objects)
            continue
        for alias in node.names:
            if alias.evaluated_name in objects:
                found[alias.evaluated_name] = alias.evaluated_alias or alias.evaluated_name
    return found

