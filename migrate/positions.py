"""``PositionProvider``'s metadata, computed in a fraction of the time.

libcst finds every node's position by generating the module's code while tracking line and column.
Most of that time is spent recording: for every node (punctuation and whitespace included) it makes
a ``CodePosition`` where the node starts and a ``CodeRange`` where it ends, through a generator-based
context manager, in a dict keyed by the node (whose ``__hash__`` is Python code). Here the same
walk records plain tuples under the node's ``id``, enters a plain context manager, and counts
``\\n`` with string methods (the regex only for tokens holding a ``\\r``); a node's ``CodeRange`` is
made when it is asked for. The result is the same mapping, node for node:
``tests/migrate/test_engine.py`` compares the two on every fixture.

A file's findings need the positions of a few nodes, not all of them: ``positions_by_statement``
generates only the code of the innermost statement around each node asked for, from the line
where that statement starts, read from ``ast`` (a tenth of libcst's parse): the statement's first
line, less the comment and blank lines libcst counts as its own. It is the same mapping for the
nodes asked for (the tests compare every node of every fixture), and falls back to ``positions``
where ``ast`` and libcst do not see the same statements.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence

import libcst as cst
from libcst.metadata import CodePosition, CodeRange
from libcst.metadata.position_provider import PositionProvidingCodegenState

from migrate import quiet
from migrate.tree_walk import children, children_kept
from migrate.unread import Unparsed

__all__ = ["positions", "positions_by_statement"]


def positions(module: cst.Module) -> Mapping[cst.CSTNode, CodeRange]:
    """Every node's syntactic range, as ``MetadataWrapper(module).resolve(PositionProvider)`` gives it."""
    state = _counting_state(module, {})
    module._codegen(state)
    return _Positions(state.found)


def _counting_state(module: cst.Module, found: dict[int, tuple]) -> _CountingState:
    """A code generation state for ``module`` recording positions into ``found``."""
    state = _CountingState(default_indent=module.default_indent, default_newline=module.default_newline, provider=None)
    state.found = found
    return state


def positions_by_statement(module: cst.Module, text: str, kept: dict | None = None) -> Mapping[cst.CSTNode, CodeRange]:
    """``positions(module)`` for the nodes asked for, ``module`` being ``text`` parsed; ``kept``:
    ``tree_walk.children_kept``'s lists for this tree, if any."""
    return _ByStatement(module, text, kept)


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


class _ByStatement(_Positions):
    """The positions of the nodes asked for, recorded statement by statement (see the module's doc)."""

    def __init__(self, module: cst.Module, text: str, kept: dict | None) -> None:
        super().__init__({})
        self._module = module
        self._text = text
        self._kept = kept
        self._owners: dict[int, cst.CSTNode] | None = None  # id(node) -> the innermost statement around it
        self._starts: dict[int, tuple[int, tuple[str, ...]]] = {}  # id(statement) -> (first line, indents)
        self._whole = False

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        if id(node) not in self._found:
            self._record_around(node)
        return super().__getitem__(node)

    def __iter__(self) -> Iterator[cst.CSTNode]:
        self._record_all()
        return super().__iter__()

    def __len__(self) -> int:
        self._record_all()
        return super().__len__()

    def _record_around(self, node: cst.CSTNode) -> None:
        if self._whole:
            return
        if self._owners is None:
            starts = _statement_starts(self._module, self._text)
            if starts is None:
                self._record_all()
                return
            self._starts = starts
            self._owners = _owners(self._module, starts, self._kept)
        statement = self._owners.get(id(node))
        if statement is None:  # punctuation, whitespace, the module itself: asked for seldom
            self._record_all()
            return
        line, indents = self._starts[id(statement)]
        state = _counting_state(self._module, self._found)
        state.line = line
        state.indent_tokens = list(indents)
        statement._codegen(state)

    def _record_all(self) -> None:
        if not self._whole:
            self._module._codegen(_counting_state(self._module, self._found))
            self._whole = True


def _statement_starts(module: cst.Module, text: str) -> dict[int, tuple[int, tuple[str, ...]]] | None:
    """Each statement's first line in libcst's count (its leading comment and blank lines included)
    and the indentation of the blocks around it, by the statement's ``id``; statements in a one-line
    body (``if x: y``) are left out. None where ``ast`` cannot read ``text`` or sees other statements."""
    try:
        tree = quiet.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    starts: dict[int, tuple[int, tuple[str, ...]]] = {}
    pending: list[tuple[Sequence[cst.BaseStatement], list[ast.stmt], tuple[str, ...]]] = [(module.body, tree.body, ())]
    while pending:
        statements, nodes, indents = pending.pop()
        at = 0
        for statement in statements:
            if type(statement) is Unparsed:  # ast's statements, kept as text: nothing in them is asked for
                at += statement.statements
                continue
            if isinstance(statement, cst.SimpleStatementLine):  # `a = 1; b = 2` is two statements to ast
                first, at = (nodes[at] if at < len(nodes) else None), at + len(statement.body)
                if first is None or isinstance(first, _AST_COMPOUND):
                    return None
                starts[id(statement)] = (first.lineno - len(statement.leading_lines), indents)
                continue
            node, at = (nodes[at] if at < len(nodes) else None), at + 1
            blocks = _blocks(statement, node)
            if blocks is None:
                return None
            decorators = getattr(statement, "decorators", ())
            if len(decorators) != len(getattr(node, "decorator_list", ())):
                return None
            if decorators:  # its comments, then the first decorator's, then its line
                line = node.decorator_list[0].lineno - len(decorators[0].leading_lines)
            else:
                line = node.lineno
            starts[id(statement)] = (line - len(statement.leading_lines), indents)
            for block, body in blocks:
                if isinstance(block, cst.IndentedBlock):
                    indent = module.default_indent if block.indent is None else block.indent
                    pending.append((block.body, body, (*indents, indent)))
        if at != len(nodes):
            return None
    return starts


_AST_TRY = (ast.Try, *((ast.TryStar,) if hasattr(ast, "TryStar") else ()))  # except*: Python 3.11+
_AST_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.AsyncFor, ast.While,
                 ast.With, ast.AsyncWith, ast.Match, *_AST_TRY)


def _blocks(statement: cst.BaseStatement, node: ast.stmt | None) -> list[tuple[cst.BaseSuite, list[ast.stmt]]] | None:
    """The bodies of a compound statement, each beside ast's list of its statements; None where
    ``node`` is not the same statement."""
    if isinstance(statement, cst.FunctionDef) and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [(statement.body, node.body)]
    if isinstance(statement, cst.ClassDef) and isinstance(node, ast.ClassDef):
        return [(statement.body, node.body)]
    if isinstance(statement, cst.With) and isinstance(node, (ast.With, ast.AsyncWith)):
        return [(statement.body, node.body)]
    if isinstance(statement, cst.If) and isinstance(node, ast.If):
        orelse = statement.orelse
        if isinstance(orelse, cst.If):  # elif: ast's else holds that if alone
            rest = _blocks(orelse, node.orelse[0]) if len(node.orelse) == 1 else None
            return None if rest is None else [(statement.body, node.body), *rest]
        return _with_else(statement, node)
    if isinstance(statement, (cst.For, cst.While)) and isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
        if isinstance(statement, cst.While) != isinstance(node, ast.While):
            return None
        return _with_else(statement, node)
    if isinstance(statement, (cst.Try, cst.TryStar)) and isinstance(node, _AST_TRY):
        if len(statement.handlers) != len(node.handlers) or (statement.finalbody is None) != (not node.finalbody):
            return None
        found = _with_else(statement, node)
        if found is None:
            return None
        found += [(handler.body, ast_handler.body) for handler, ast_handler in zip(statement.handlers, node.handlers)]
        return found + ([(statement.finalbody.body, node.finalbody)] if statement.finalbody is not None else [])
    if isinstance(statement, cst.Match) and isinstance(node, ast.Match) and len(statement.cases) == len(node.cases):
        return [(case.body, ast_case.body) for case, ast_case in zip(statement.cases, node.cases)]
    return None


def _with_else(statement: cst.BaseCompoundStatement, node: ast.stmt) -> list[tuple[cst.BaseSuite, list[ast.stmt]]] | None:
    """``statement``'s body, then its ``else:`` body if it has one."""
    orelse = statement.orelse
    if (orelse is None) != (not node.orelse):
        return None
    return [(statement.body, node.body), *([(orelse.body, node.orelse)] if orelse is not None else [])]


def _owners(module: cst.Module, starts: Mapping[int, tuple], kept: dict | None) -> dict[int, cst.CSTNode]:
    """The innermost statement of ``starts`` around each node below one (the statement itself included)."""
    owners: dict[int, cst.CSTNode] = {}
    pending: list[tuple[cst.CSTNode, cst.CSTNode | None]] = [(module, None)]
    with children_kept(kept):
        while pending:
            node, statement = pending.pop()
            if id(node) in starts:
                statement = node
            if statement is not None:
                owners[id(node)] = statement
            pending += [(child, statement) for child in children(node, tokens=False)]
    return owners
