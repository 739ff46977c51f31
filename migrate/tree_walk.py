"""Reading a libcst tree without rebuilding it.

``node.visit(visitor)`` rebuilds every node it passes, even for a visitor that only reads: libcst
visits by replacing each node's children and constructing the node again. In a run on a real
training script that was most of the time. ``walk`` calls the same ``on_visit``/``on_leave``
(so ``visit_Call``, ``leave_Call``, and ``return False`` to skip the children) on the same nodes,
in the same order, reading the children from the nodes' fields. ``walk_batched`` does the same for
``cst.visit_batched``. Neither recurses, so a deeply nested expression cannot overflow the stack.

Punctuation and whitespace (commas, parentheses, operators' tokens, blank lines, comments) are
two thirds of a tree's nodes, and no reader of ours looks at them: ``walk`` leaves them out, and
``walk_batched`` meets them only when one of its visitors has a method for one (``visit_Comment``).

Use them for ``CSTVisitor``s only; a transformer still needs ``node.visit``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import typing
import weakref
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

import libcst as cst

__all__ = [
    "analysing", "children", "children_kept", "descendants", "is_node_type", "kept_per_tree", "memo_per_tree", "walk",
    "walk_batched",
]

# Where libcst's source order of a node's children is not the order of its fields (tokens and
# whitespace aside, which every field order puts right for what a visitor reads).
_SOURCE_ORDER: dict[str, tuple[str, ...]] = {
    "FunctionDef": ("leading_lines", "decorators", "lines_after_decorators", "asynchronous", "whitespace_after_def",
                    "name", "whitespace_after_name", "type_parameters", "whitespace_after_type_parameters",
                    "whitespace_before_params", "params", "returns", "whitespace_before_colon", "body"),
    "ClassDef": ("leading_lines", "decorators", "lines_after_decorators", "whitespace_after_class", "name",
                 "whitespace_after_name", "type_parameters", "whitespace_after_type_parameters", "lpar", "bases",
                 "keywords", "rpar", "whitespace_before_colon", "body"),
    "IfExp": ("lpar", "body", "whitespace_before_if", "whitespace_after_if", "test", "whitespace_before_else",
              "whitespace_after_else", "orelse", "rpar"),
    "ExceptHandler": ("leading_lines", "whitespace_after_except", "type", "name", "whitespace_before_colon", "body"),
    "ExceptStarHandler": ("leading_lines", "whitespace_after_except", "whitespace_after_star", "type", "name",
                          "whitespace_before_colon", "body"),
    "ImportFrom": ("whitespace_after_from", "relative", "module", "whitespace_before_import", "whitespace_after_import",
                   "lpar", "names", "rpar", "semicolon"),
    "Arg": ("star", "whitespace_after_star", "keyword", "equal", "value", "comma", "whitespace_after_arg"),
    "Parameters": ("posonly_params", "posonly_ind", "params", "star_arg", "kwonly_params", "star_kwarg"),
    "MatchCase": ("leading_lines", "whitespace_after_case", "pattern", "whitespace_before_if", "whitespace_after_if",
                  "guard", "whitespace_before_colon", "body"),
    "TypeAlias": ("whitespace_after_type", "name", "whitespace_after_name", "type_parameters",
                  "whitespace_after_type_parameters", "whitespace_after_equals", "value", "semicolon"),
}
_SOURCE_ORDER["LazyImportFrom"] = _SOURCE_ORDER["ImportFrom"]
T = TypeVar("T")


def children(node: cst.CSTNode, *, tokens: bool = True) -> list[cst.CSTNode]:
    """``node.children`` without rebuilding ``node``: its child nodes in source order (without
    punctuation and whitespace when not ``tokens``). The list is not to be changed: inside
    ``children_kept`` it is the one every caller gets."""
    if not tokens and _kept is not None:
        kept = _kept.get(id(node))
        if kept is not None:
            return kept[1]
    found: list[cst.CSTNode] = []
    wanted, fields = (_NODE, _FIELDS) if tokens else (_SYNTAX, _SYNTAX_FIELDS)
    kinds = _KINDS
    for name in fields[type(node)]:
        value = getattr(node, name)
        value_type = type(value)
        if value_type is list or value_type is tuple:
            found += [item for item in value if kinds[type(item)] & wanted]
        elif kinds[value_type] & wanted:
            found.append(value)
    if not tokens and _kept is not None:
        _kept[id(node)] = (node, found)  # the node held: its id cannot pass to another while kept
    return found


_kept: dict[int, tuple[cst.CSTNode, list[cst.CSTNode]]] | None = None


@contextlib.contextmanager
def children_kept(kept: dict | None = None) -> Iterator[dict]:
    """Within it, ``children(node, tokens=False)`` lists each node's children once: the analysis
    of a file walks its tree a dozen times (the metadata, the step model, the apex plan, the rules),
    and listing children was a tenth of that. It gives the lists kept; hand them back as ``kept``
    to go on with them in a later walk of the same tree. It is the span of one analysis: the
    ``memo_per_tree`` dicts are emptied when the outermost one ends."""
    global _kept
    outer = _kept
    _kept = kept if kept is not None else {} if outer is None else outer
    try:
        yield _kept
    finally:
        _kept = outer
        if outer is None:
            for memo in _MEMOS:
                memo.clear()


_MEMOS: list[dict] = []  # those of ``memo_per_tree``, emptied when the outermost ``children_kept`` ends


def memo_per_tree() -> dict:
    """A dict for answers about a tree's nodes, by ``id``, to fill only within ``children_kept``
    (``analysing()``), which empties it when it ends. Each entry must hold its node, so that the
    id cannot pass to another. A cache kept across files would hold their nodes alive, and each
    file's cycle collection would scan them again."""
    memo: dict = {}
    _MEMOS.append(memo)
    return memo


def analysing() -> bool:
    """Whether a ``children_kept`` is in force: the ``memo_per_tree`` dicts may be filled."""
    return _kept is not None


def kept_per_tree(function: Callable[[cst.CSTNode], T]) -> Callable[[cst.CSTNode], T]:
    """``function(node)`` worked out once per node within ``children_kept`` (nodes never change)."""
    memo = memo_per_tree()

    @functools.wraps(function)
    def remembered(node: cst.CSTNode) -> T:
        if _kept is None:
            return function(node)
        found = memo.get(id(node))
        if found is None:
            found = memo[id(node)] = (node, function(node))
        return found[1]

    return remembered


class _ByType(dict):
    """``compute(type)``, worked out on first use: asked of every node, a dict lookup is a
    fraction of the cost of a ``functools.lru_cache`` call."""

    def __init__(self, compute: Callable[[type], object]) -> None:
        super().__init__()
        self._compute = compute

    def __missing__(self, key: type) -> object:
        value = self[key] = self._compute(key)
        return value


def walk(root: cst.CSTNode, visitor: cst.CSTVisitor, leaving: Callable[[cst.CSTNode], None] | None = None) -> None:
    """``root.visit(visitor)`` for a visitor that only reads, punctuation and whitespace left out.

    ``leaving``: called on each node as it is left, before the visitor's ``leave_<type>``, in
    place of the visitor's own ``on_leave`` (which the caller knows to do no more than that).
    """
    kind = type(visitor)
    if kind.on_visit is not cst.CSTVisitor.on_visit or (leaving is None and kind.on_leave is not cst.CSTVisitor.on_leave):
        _walk_generic(root, visitor)
        return
    # libcst's own on_visit looks up `visit_<type>` on every node and calls one of its ~1,600
    # empty stubs for most: here each node type's methods are looked up once per visitor class.
    handlers = _HANDLERS.get(kind)
    if handlers is None:
        handlers = _HANDLERS[kind] = {}
    pending: list = [root]
    while pending:
        node = pending.pop()
        if node is _LEAVE:
            node = pending.pop()
            if leaving is not None:
                leaving(node)
            leave = handlers[type(node)][1]
            if leave is not None:
                leave(visitor, node)
            continue
        found = handlers.get(type(node))
        if found is None:
            found = handlers[type(node)] = _handlers(kind, type(node).__name__)
        visit, leave = found
        if visit is None or visit(visitor, node) is not False:
            pending += (node, _LEAVE)
            pending += reversed(children(node, tokens=False))
        else:
            if leaving is not None:
                leaving(node)
            if leave is not None:
                leave(visitor, node)


def descendants(root: cst.CSTNode, enter: Callable[[cst.CSTNode], bool] | None = None) -> Iterator[cst.CSTNode]:
    """``root`` and the nodes under it, in the order ``walk`` meets them (punctuation and
    whitespace left out); nothing under a node for which ``enter(node)`` is false. For a question
    asked of a subtree, in place of a visitor class made for it: a class made in a function is a
    cycle, with what its closure holds, left to the cycle collector."""
    pending = [root]
    while pending:
        node = pending.pop()
        yield node
        if enter is None or enter(node):
            pending += reversed(children(node, tokens=False))


def _walk_generic(root: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """``walk`` for a visitor with its own ``on_visit``/``on_leave``."""
    on_visit, on_leave = visitor.on_visit, visitor.on_leave
    pending: list = [root]
    while pending:
        node = pending.pop()
        if node is _LEAVE:
            on_leave(pending.pop())
        elif on_visit(node):
            pending += (node, _LEAVE)
            pending += reversed(children(node, tokens=False))
        else:
            on_leave(node)


# Per visitor class, its (visit, leave) functions by node type. Weak: some visitor classes are
# made per call (a class inside a function), and must not be kept for ever.
_HANDLERS: weakref.WeakKeyDictionary[type, dict[type, tuple]] = weakref.WeakKeyDictionary()


def _handlers(visitor_type: type, type_name: str) -> tuple[Callable | None, Callable | None]:
    """``visitor_type``'s ``visit_<type_name>`` and ``leave_<type_name>`` functions, None for
    libcst's empty stubs."""
    return _own(visitor_type, "visit_" + type_name), _own(visitor_type, "leave_" + type_name)


def _own(visitor_type: type, name: str) -> Callable | None:
    method = getattr(visitor_type, name, None)
    return None if method is None or method is getattr(cst.CSTVisitor, name, None) else method


def walk_batched(root: cst.CSTNode, visitors: Sequence[cst.BatchableCSTVisitor], path: list | None = None) -> None:
    """``cst.visit_batched(root, visitors)``: every visitor's ``visit_X``/``leave_X`` on each node;
    as there, what a ``visit_X`` returns is ignored.

    ``path``: a list kept, while the walk lasts, as the nodes from ``root`` to the one being
    visited or left, that one last."""
    calls = _BatchedCalls(visitors)
    tokens = calls.want_tokens()
    path = [] if path is None else path
    pending: list = [root]
    while pending:
        node = pending.pop()
        if node is _LEAVE:
            node = pending.pop()
            for leave in calls[type(node)][1]:
                leave(node)
            path.pop()
            continue
        path.append(node)
        for visit in calls[type(node)][0]:
            visit(node)
        pending += (node, _LEAVE)
        pending += reversed(children(node, tokens=tokens))


_LEAVE = object()  # marks, on the walk's stack, that the node below it is to be left


class _BatchedCalls(dict):
    """The visitors' ``visit_X`` and ``leave_X`` methods, as their ``get_visitors()`` give them,
    by node type: ``calls[type] == (visits, leaves)``, worked out on first meeting the type."""

    def __init__(self, visitors: Iterable[cst.BatchableCSTVisitor]) -> None:
        super().__init__()
        self._tables = [visitor.get_visitors() for visitor in visitors]

    def __missing__(self, node_type: type) -> tuple[list[Callable], list[Callable]]:
        name = node_type.__name__
        found = self[node_type] = (self._methods("visit_" + name), self._methods("leave_" + name))
        return found

    def want_tokens(self) -> bool:
        """Whether a visitor has a method for a punctuation or whitespace node (``visit_Comment``)."""
        return any(name.split("_", 1)[1] in _TOKEN_NAMES for table in self._tables for name in table)

    def _methods(self, name: str) -> list[Callable]:
        return [table[name] for table in self._tables if name in table]


@functools.lru_cache(maxsize=None)
def _fields(node_type: type) -> tuple[str, ...]:
    names = tuple(field.name for field in dataclasses.fields(node_type))
    order = _SOURCE_ORDER.get(node_type.__name__)
    if order is not None:
        return tuple(name for name in order if name in names) + tuple(name for name in names if name not in order)
    # the lines and comments before a statement or block come first, those after it last
    first = tuple(name for name in names if name in ("leading_lines", "header"))
    last = tuple(name for name in names if name in ("trailing_whitespace", "footer"))
    return first + tuple(name for name in names if name not in first + last) + last


@functools.lru_cache(maxsize=None)
def _syntax_fields(node_type: type) -> tuple[str, ...]:
    """The fields that may hold something other than punctuation and whitespace, by their types."""
    hints = {field.name: field.type for field in dataclasses.fields(node_type)}
    return tuple(name for name in _fields(node_type) if _may_hold_syntax(hints[name]))


def _may_hold_syntax(annotation: object) -> bool:
    if isinstance(annotation, type):
        return is_node_type(annotation) and annotation.__name__ not in _TOKEN_NAMES
    if typing.get_origin(annotation) is typing.Literal:  # `Arg.star: Literal["", "*", "**"]`
        return False
    arguments = typing.get_args(annotation)
    return any(_may_hold_syntax(argument) for argument in arguments) if arguments else True  # unknown: keep it


_NODE, _SYNTAX = 1, 2  # what `_kind` says of a value: any node, and (both bits) a node that is not a token


def _kind(value_type: type) -> int:
    if not is_node_type(value_type):  # cached in _KINDS: isinstance on CSTNode, an ABC, is slow
        return 0
    return _NODE if value_type.__name__ in _TOKEN_NAMES else _NODE | _SYNTAX


def is_node_type(value_type: type, base: type = cst.CSTNode) -> bool:
    """``issubclass(value_type, base)`` for libcst's node classes, read from the class's bases:
    ``issubclass`` on libcst's abstract classes searches all their subclasses the first time it
    is asked of a class that is not one (a ``str``, a sentinel), a tenth of a small file's run."""
    return base in value_type.__mro__



def _token_names() -> frozenset[str]:
    """libcst's punctuation and whitespace node types: those of its operator and whitespace modules,
    and the brackets and ``async`` keyword its expression module defines."""
    import libcst._nodes.op as operators
    import libcst._nodes.whitespace as whitespace

    found = {"LeftParen", "RightParen", "LeftSquareBracket", "RightSquareBracket", "LeftCurlyBrace",
             "RightCurlyBrace", "Asynchronous"}
    for module in (operators, whitespace):
        found.update(name for name, value in vars(module).items()
                     if isinstance(value, type) and value.__module__ == module.__name__ and is_node_type(value))
    return frozenset(found)


_TOKEN_NAMES = _token_names()
_KINDS = _ByType(_kind)
_FIELDS = _ByType(_fields)
_SYNTAX_FIELDS = _ByType(_syntax_fields)
