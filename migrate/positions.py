"""``PositionProvider``'s metadata, computed in a fraction of the time.

libcst finds every node's position by generating the module's code while tracking line and column.
Most of that time is spent recording: for every node (punctuation and whitespace included) it makes
a ``CodePosition`` where the node starts and a ``CodeRange`` where it ends, through a generator-based
context manager, in a dict keyed by the node (whose ``__hash__`` is Python code). Here the same
walk records plain tuples under the node's ``id``, enters a plain context manager, and counts
``\\n`` with string methods (the regex only for tokens holding a ``\\r``); a node's ``CodeRange`` is
made when it is asked for. The result is the same mapping, node for node:
``tests/migrate/test_engine.py`` compares the two on every fixture.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import libcst as cst
from libcst.metadata import CodePosition, CodeRange
from libcst.metadata.position_provider import PositionProvidingCodegenState

__all__ = ["positions"]


def positions(module: cst.Module) -> Mapping[cst.CSTNode, CodeRange]:
    """Every node's syntactic range, as ``MetadataWrapper(module).resolve(PositionProvider)`` gives it."""
    state = _CountingState(default_indent=module.default_indent, default_newline=module.default_newline, provider=None)
    state.found = {}
    module._codegen(state)
    return _Positions(state.found)


class _Positions(Mapping):
    """The recorded ``(node, start line, start column, end line, end column)`` by the node's
    ``id``, read as ``CodeRange``s by node."""

    def __init__(self, found: dict[int, tuple]) -> None:
        self._found = found  # its tuples hold the nodes: their ids stay theirs while it lives

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        found = self._found.get(id(node))
        if found is None:
            raise KeyError(node)
        _, start_line, start_column, end_line, end_column = found
        return CodeRange(CodePosition(start_line, start_column), CodePosition(end_line, end_column))

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return (found[0] for found in self._found.values())

    def __len__(self) -> int:
        return len(self._found)


class _CountingState(PositionProvidingCodegenState):
    found: dict[int, tuple]  # id(node) -> (node, start line, start column, end line, end column)

    def _update_position(self, value: str) -> None:
        if "\r" in value:
            super()._update_position(value)
            return
        newlines = value.count("\n")
        if newlines:
            self.line += newlines
            self.column = len(value) - value.rfind("\n") - 1
        else:
            self.column += len(value)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._stack.append((self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        line, column = self._stack.pop()
        if id(node) not in self.found:  # a syntactic position, recorded inside, is kept
            self.found[id(node)] = (node, line, column, self.line, self.column)

    def record_syntactic_position(self, node, *, start_node=None, end_node=None) -> "_Recording":
        return _Recording(self, node, start_node, end_node)


class _Recording:
    """What ``PositionProvidingCodegenState.record_syntactic_position`` does, without a generator."""

    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(self, state: _CountingState, node, start_node, end_node) -> None:
        self.state = state
        self.node = node
        self.start_node = start_node
        self.end_node = end_node

    def __enter__(self) -> None:
        self.start = (self.state.line, self.state.column)

    def __exit__(self, *_exc) -> bool:
        state = self.state
        found = state.found
        start = found[id(self.start_node)][1:3] if self.start_node is not None else self.start
        end = found[id(self.end_node)][3:] if self.end_node is not None else (state.line, state.column)
        found[id(self.node)] = (self.node, *start, *end)
        return False
