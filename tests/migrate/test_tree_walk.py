"""``tree_walk`` reads a tree as libcst's own visits do: the same nodes, in the same order."""
from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from pathlib import Path

import libcst as cst
import libcst._nodes.op as operators
import libcst._nodes.whitespace as whitespace
import pytest

from migrate.tree_walk import _fields, children, children_kept, descendants, is_node_type, kept_per_tree, walk, walk_batched

REPO = Path(__file__).resolve().parents[2]

# Every kind of statement and expression, so that each node type's children are met.
EVERY_SHAPE = '''
from __future__ import annotations
import os.path as p, sys
from .. import a as b, c
from x import (y, z)

@decorator(arg=1)
class Trainer(Base, metaclass=Meta):
    """Doc."""
    scale: float = 2.0 ** -1

    @property
    async def step(self, a, /, b: int = 1, *args, c, d=2, **kwargs) -> dict[str, int]:
        global counter
        async with ctx() as (x, y), other:
            async for i in aiter():
                await x
                yield i
        lambda q, *r, s=1: q if r else s
        [v for v in range(3) if v if not v]
        {k: v for k, v in items()}
        {e for e in s}
        (g for g in h)
        f"{self.scale!r:>{width}} and {x=}"
        del x[1:2:3], y[::2]
        x @= y
        assert x, "message"
        raise ValueError("no") from None


try:
    pass
except (ImportError, OSError) as error:
    pass
else:
    pass
finally:
    pass

try:
    pass
except* TypeError:
    pass

while (n := next(it)) is not None and not done or -n > +1:
    continue
else:
    break_out = ~n << 2

match command.split():
    case [name, *rest] if rest:
        pass
    case {"key": value, **others}:
        pass
    case Point(x=0, y=_) | None:
        pass
    case str() as text:
        pass

type Vector[T] = list[T]
print(*args, sep="", **kwargs); x = y = 1
'''


def _sources() -> list[str]:
    files = [*sorted((REPO / "migrate").rglob("*.py")), *sorted((REPO / "fixtures").rglob("*.py"))]
    return [EVERY_SHAPE, *(path.read_text(encoding="utf-8") for path in files)]


def _token(node: cst.CSTNode) -> bool:
    """Punctuation and whitespace: libcst's order among a node's tokens is not kept, and no reader asks for it."""
    return type(node).__module__ in (operators.__name__, whitespace.__name__) or isinstance(
        node, (cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket,
               cst.LeftCurlyBrace, cst.RightCurlyBrace, cst.Asynchronous))


class _Record(cst.CSTVisitor):
    def __init__(self, skip: type | None = None) -> None:
        super().__init__()
        self.seen: list[tuple[str, int]] = []
        self.skip = skip

    def on_visit(self, node: cst.CSTNode) -> bool:
        if not _token(node):
            self.seen.append(("visit", id(node)))
        return not (self.skip and isinstance(node, self.skip))

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if not _token(original_node):
            self.seen.append(("leave", id(original_node)))


@pytest.mark.slow
@pytest.mark.parametrize("skip", [None, cst.Call, cst.FunctionDef])
def test_walk_meets_the_nodes_libcst_visits_in_its_order(skip):
    for source in _sources():
        module = cst.parse_module(source)
        theirs, ours = _Record(skip), _Record(skip)
        module.visit(theirs)
        walk(module, ours)
        assert ours.seen == theirs.seen


@pytest.mark.parametrize("skip", [None, cst.Call, cst.FunctionDef])
def test_descendants_are_the_nodes_libcst_visits_in_its_order(skip):
    for source in _sources()[:20]:
        module = cst.parse_module(source)
        theirs = _Record(skip)
        module.visit(theirs)
        visited = [node_id for event, node_id in theirs.seen if event == "visit"]
        enter = None if skip is None else (lambda node: not isinstance(node, skip))
        assert [id(node) for node in descendants(module, enter)] == visited


@pytest.mark.parametrize("skip", [None, cst.Call])
def test_walks_with_children_kept_meet_the_same_nodes(skip):
    for source in _sources()[:8]:
        module = cst.parse_module(source)
        theirs = _Record(skip)
        module.visit(theirs)
        with children_kept() as kept:
            for _ in range(2):  # listing the children, then reading them back
                ours = _Record(skip)
                walk(module, ours)
                assert ours.seen == theirs.seen
        assert kept, "the walks kept the lists"
        with children_kept(kept):  # handed back: the same lists
            assert children(module, tokens=False) is kept[id(module)][1]
        assert children(module, tokens=False) is not kept[id(module)][1]  # none kept outside


def test_kept_per_tree_works_a_node_out_once_per_analysis_and_then_forgets_it():
    calls = []

    @kept_per_tree
    def text(node):
        calls.append(node)
        return cst.Module(body=[]).code_for_node(node)

    module = cst.parse_module("x = a.b\n")
    with children_kept():
        with children_kept():  # an inner span is part of the outer one
            assert text(module) == text(module) == "x = a.b\n"
        assert text(module) == "x = a.b\n"
        assert calls == [module]
    text(module)  # once the analysis is over nothing is kept, and the node is not held
    text(module)
    assert calls == [module, module, module]
    with children_kept():
        text(module)
    assert len(calls) == 4, "a new analysis works it out again"


def test_children_are_libcsts_children():
    module = cst.parse_module(EVERY_SHAPE)
    pending = [module]
    while pending:
        node = pending.pop()
        assert {id(child) for child in children(node)} == {id(child) for child in node.children}, type(node).__name__
        pending.extend(node.children)


def test_walk_batched_calls_every_visitor_as_visit_batched_does():
    class Calls(cst.BatchableCSTVisitor):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[str, int]] = []

        def visit_Call(self, node: cst.Call) -> bool:
            self.seen.append(("call", id(node)))
            return False  # ignored in a batched visit: the arguments' calls are still met

        def visit_Name(self, node: cst.Name) -> None:
            self.seen.append(("name", id(node)))

        def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
            self.seen.append(("left", id(original_node)))

    module = cst.parse_module(EVERY_SHAPE + "\nf(g(h))\n")
    theirs, ours = [Calls(), Calls()], [Calls(), Calls()]
    cst.visit_batched(module, theirs)
    walk_batched(module, ours)
    assert [v.seen for v in ours] == [v.seen for v in theirs]
    assert sum(kind == "call" for kind, _ in ours[0].seen) >= 3


def test_a_deeply_nested_expression_does_not_overflow():
    depth = 3000
    module = cst.Module(body=[cst.SimpleStatementLine([cst.Expr(_nested(depth))])])
    names = _Record()
    walk(module, names)
    assert sum(kind == "visit" for kind, _ in names.seen) > depth


def _nested(depth: int) -> cst.BaseExpression:
    expression: cst.BaseExpression = cst.Name("x")
    for _ in range(depth):
        expression = cst.UnaryOperation(cst.Minus(), expression)
    return expression


def _libcst_order(node_type: type) -> list[str]:
    """The fields in the order libcst's own visit passes them: the keywords of the constructor call
    in ``_visit_and_replace_children``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(node_type._visit_and_replace_children)))
    constructors = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name) and node.func.id == node_type.__name__]
    return [keyword.arg for call in constructors[:1] for keyword in call.keywords]


def _node_types() -> list[type]:
    return sorted((value for value in vars(cst).values() if isinstance(value, type) and issubclass(value, cst.CSTNode)
                   and not inspect.isabstract(value) and "_visit_and_replace_children" in vars(value)),
                  key=lambda value: value.__name__)


@pytest.mark.parametrize("node_type", _node_types(), ids=lambda t: t.__name__)
def test_every_node_types_children_come_in_libcsts_order(node_type):
    """For node types the samples above may not hold: a field that can hold more than punctuation
    comes where libcst's own visit puts it."""
    names = {field.name for field in dataclasses.fields(node_type)}
    theirs = [name for name in _libcst_order(node_type) if name in names and not _punctuation(node_type, name)]
    ours = [name for name in _fields(node_type) if name in theirs]
    assert ours == theirs


def _punctuation(node_type: type, name: str) -> bool:
    return name.startswith(("whitespace", "lpar", "rpar", "lbracket", "rbracket", "lbrace", "rbrace", "comma", "equal",
                            "colon", "dot", "semicolon", "star", "operator", "first_colon", "second_colon",
                            "asynchronous", "leading_lines", "lines_after_decorators", "header", "footer", "arrow",
                            "newline", "trailing_whitespace", "leading_whitespace", "indent", "empty_lines"))


def test_walk_leaves_punctuation_and_whitespace_out():
    seen: list[cst.CSTNode] = []

    class Everything(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            seen.append(node)
            return True

    walk(cst.parse_module("x = f(a, b)  # note\n\n# more\n"), Everything())
    assert seen and not any(_token(node) for node in seen)
    assert {type(node).__name__ for node in seen} >= {"Module", "Assign", "Call", "Arg", "Name"}


def test_walk_batched_meets_comments_for_a_visitor_that_asks():
    class Comments(cst.BatchableCSTVisitor):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def visit_Comment(self, node: cst.Comment) -> None:
            self.seen.append(node.value)

    visitor = Comments()
    walk_batched(cst.parse_module("# first\nx = 1  # second\n"), [visitor])
    assert visitor.seen == ["# first", "# second"]


@pytest.mark.slow
def test_walk_calls_visit_and_leave_methods_as_libcst_does():
    class Calls(cst.CSTVisitor):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[str, int]] = []

        def visit_Call(self, node: cst.Call) -> bool:
            self.seen.append(("call", id(node)))
            return not isinstance(node.func, cst.Name)  # `f(g(x))`: g is not met; `x.f(g(y))`: it is

        def leave_Call(self, original_node: cst.Call) -> None:
            self.seen.append(("left", id(original_node)))

        def visit_Name(self, node: cst.Name) -> None:
            self.seen.append(("name", id(node)))

    for source in _sources():
        module = cst.parse_module(source + "\nf(g(x))\nx.f(g(y))\n")
        theirs, ours = Calls(), Calls()
        module.visit(theirs)
        walk(module, ours)
        assert ours.seen == theirs.seen


@pytest.mark.slow
def test_leaving_is_called_where_libcsts_on_leave_is():
    class Leaves(cst.CSTVisitor):
        """Skips the children of calls; records each node it leaves, in ``on_leave`` or through ``leaving``."""

        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[str, int]] = []

        def visit_Call(self, node: cst.Call) -> bool:
            return False

        def leave_Call(self, original_node: cst.Call) -> None:
            self.seen.append(("leave_Call", id(original_node)))

        def on_leave(self, original_node: cst.CSTNode) -> None:
            self.record(original_node)
            super().on_leave(original_node)

        def record(self, node: cst.CSTNode) -> None:
            if not _token(node):
                self.seen.append(("left", id(node)))

    for source in _sources():
        module = cst.parse_module(source + "\nf(g(x))\n")
        theirs, ours = Leaves(), Leaves()
        module.visit(theirs)
        walk(module, ours, ours.record)
        assert ours.seen == theirs.seen
        assert ("leave_Call", id(module.body[-1].body[0].value)) in ours.seen


def test_node_types_are_told_as_issubclass_tells_them():
    classes = [value for value in vars(cst).values() if isinstance(value, type)]
    others = [str, int, tuple, type(None), cst.MaybeSentinel, cst.RemovalSentinel, dataclasses.Field]
    assert len(classes) > 200
    for base in (cst.CSTNode, cst.BaseCompoundStatement, cst.BaseExpression, cst.BaseSmallStatement):
        for value_type in classes + others:
            assert is_node_type(value_type, base) == issubclass(value_type, base), (value_type, base)
