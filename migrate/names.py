"""Resolve what a name or call refers to through the file's imports, never by its spelling."""
from __future__ import annotations

import libcst as cst
from libcst.metadata import QualifiedNameProvider, QualifiedNameSource

_RESOLVED = (QualifiedNameSource.IMPORT, QualifiedNameSource.BUILTIN)


def qualified_names(visitor: cst.MetadataDependent, node: cst.CSTNode) -> set[str]:
    """Every fully qualified name ``node`` may refer to, resolved through imports.

    ``from apex import amp as A; A.initialize`` and ``import apex.amp; apex.amp.initialize``
    both give ``{"apex.amp.initialize"}``; a local ``initialize`` gives nothing.
    """
    found = visitor.get_metadata(QualifiedNameProvider, node, set())
    return {q.name for q in found if q.source in _RESOLVED}


def resolves_to(visitor: cst.MetadataDependent, node: cst.CSTNode, *names: str) -> str | None:
    """The first of ``names`` that ``node`` resolves to, or None."""
    found = qualified_names(visitor, node)
    return next((name for name in names if name in found), None)
