"""The indentation of the blocks a rewrite writes: that of the block around the statement it replaces.

libcst indents a new block by the file's default, which it takes from the file's first block. A
file whose first helper is indented by three spaces and whose training function by four would get
three-space autocast bodies and step arms inside a four-space function. A block the rewrite makes
takes the indentation of the block it is written in instead; the file's own blocks keep theirs.
"""
from __future__ import annotations

import libcst as cst

from migrate.rule import Replacement
from migrate.tree_walk import descendants

__all__ = ["by_default", "indented_as_around"]


def by_default(module: cst.Module) -> frozenset[int]:
    """The statements of the file's blocks indented by its default: a block holding one is the file's own."""
    return frozenset(id(statement) for block in descendants(module)
                     if type(block) is cst.IndentedBlock and block.indent is None for statement in block.body)


def indented_as_around(replacement: Replacement, unit: str, own: frozenset[int]) -> Replacement:
    """``replacement`` with the new blocks in it indented by ``unit``, the indentation of the block
    it is written in (where that differs from the file's default)."""
    if isinstance(replacement, cst.RemovalSentinel):
        return replacement
    indenting = _NewBlocks(unit, own)
    if isinstance(replacement, cst.FlattenSentinel):
        return cst.FlattenSentinel([node.visit(indenting) for node in replacement.nodes])
    return replacement.visit(indenting)


class _NewBlocks(cst.CSTTransformer):
    def __init__(self, unit: str, own: frozenset[int]) -> None:
        super().__init__()
        self.unit, self.own = unit, own

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        if updated_node.indent is not None or any(id(statement) in self.own for statement in original_node.body):
            return updated_node
        return updated_node.with_changes(indent=self.unit)
