"""Lines a backslash continues, kept beside the statement they continue.

libcst indents a bracket's lines with their block but writes a backslash's as they were: a
statement the rewrite moves under ``with torch.autocast(...):`` would leave the line after ``loss
= a + \\`` at its old depth, left of its own statement. The whitespace holding the backslash keeps
its identity through the rewrite, so each one's statement depth before and after is compared.
"""
from __future__ import annotations

import re

import libcst as cst

from migrate.rule import Replacement

__all__ = ["continued_lines", "moved_with_their_statements", "statement_depths"]

_CONTINUED = re.compile(r"\\\r?\n( *)")


def continued_lines(replacement: Replacement) -> bool:
    """Whether statements of ``replacement`` hold a line a backslash continues."""
    return any(statement_depths(part, 0, "    ") for part in _statements(replacement))


def statement_depths(root: cst.CSTNode, base: int, default: str) -> dict[int, tuple[cst.SimpleWhitespace, int]]:
    """Each whitespace in ``root`` that a backslash ends a line in, and the column its statement
    starts at (``root`` at ``base``; a block without its own indentation takes ``default``)."""
    found: dict[int, tuple[cst.SimpleWhitespace, int]] = {}
    pending: list[tuple[cst.CSTNode, int]] = [(root, base)]
    while pending:
        node, depth = pending.pop()
        if type(node) is cst.SimpleWhitespace:
            if "\\" in node.value:
                found[id(node)] = (node, depth)
            continue
        if type(node) is cst.IndentedBlock:
            depth += len(node.indent if node.indent is not None else default)
        pending.extend((child, depth) for child in node.children)
    return found


def moved_with_their_statements(replacement: Replacement, base: int, before: dict[int, tuple[cst.SimpleWhitespace, int]],
                                default: str) -> Replacement:
    """``replacement`` (its statements at column ``base``) with each continued line moved as far
    as its statement moved from where it stood in the file (``before``: ``statement_depths``)."""
    moves = {}
    for part in _statements(replacement):
        for key, (_, depth) in statement_depths(part, base, default).items():
            if key in before and depth != before[key][1]:
                moves[key] = depth - before[key][1]
    if not moves:
        return replacement
    moving = _Move(moves)
    if isinstance(replacement, cst.FlattenSentinel):
        return cst.FlattenSentinel([part.visit(moving) for part in replacement.nodes])
    return replacement.visit(moving)


def _statements(replacement: Replacement) -> list[cst.BaseStatement]:
    parts = replacement.nodes if isinstance(replacement, cst.FlattenSentinel) else (
        () if isinstance(replacement, cst.RemovalSentinel) else (replacement,))
    return [part for part in parts if isinstance(part, cst.BaseStatement)]


class _Move(cst.CSTTransformer):
    def __init__(self, moves: dict[int, int]) -> None:
        super().__init__()
        self.moves = moves

    def leave_SimpleWhitespace(self, original_node: cst.SimpleWhitespace, updated_node: cst.SimpleWhitespace):
        by = self.moves.get(id(original_node))
        if by is None:
            return updated_node
        moved = _CONTINUED.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)] + " " * max(0, len(m.group(1)) + by),
                               updated_node.value)
        return updated_node.with_changes(value=moved)
