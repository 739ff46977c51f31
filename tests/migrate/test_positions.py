"""``positions_by_statement`` gives the nodes asked for the positions libcst's provider gives them."""
from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from migrate.positions import positions_by_statement
from migrate.tree_walk import _KINDS, _SYNTAX

REPO = Path(__file__).resolve().parents[2]

# Each way a statement's first line is found: comments and blank lines before it, decorators with
# their own comments, elif chains, every block of a try, one-line bodies, semicolons, a statement
# opened by a bracket or continued by a backslash, tabs, async, match, comments closing a block.
SHAPES = '''#!/usr/bin/env python
# a header comment

"""The module's docstring."""
import torch; import os


# two comments
# above a decorated class
@decorator
# between the decorators
@other(
    arg=1,
)
class Trainer:
    scale = 2.0  # trailing

    def step(self, loss):
        if loss is None: return
        elif loss > 1:
            loss = loss / 2
        elif loss < 0:

            # a comment before the block's statement
            raise ValueError(
                "negative"
            )
        else:
            pass
        for i in range(3):
            with torch.autocast("cuda"):
                x = (
                    loss
                    * i
                )
        else:
            y = \\
                1
        # a comment closing the block


async def run():
\tasync for batch in loader():
\t\tasync with lock:
\t\t\tawait step(batch)
\twhile True:
\t\tbreak
\telse:
\t\tpass


try:
    import apex
except ImportError:  # a comment
    apex = None
except (OSError, ValueError) as error:
    raise
else:
    pass
finally:
    done = True

match command:
    case [name, *rest] if rest:
        pass
    case _:
        other = 1
x = 1; y = 2
'''


def _sources() -> list[tuple[str, str]]:
    fixtures = sorted(REPO.glob("fixtures/*/*.py"))
    return [("shapes", SHAPES), *((f"{p.parent.name}/{p.name}", p.read_text(encoding="utf-8")) for p in fixtures)]


def _syntax_nodes(expected) -> list[cst.CSTNode]:
    return [node for node in expected if _KINDS[type(node)] & _SYNTAX and not isinstance(node, cst.Module)]


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_every_node_asked_for_is_where_libcst_puts_it(newline):
    for name, text in _sources():
        text = text.replace("\n", newline)
        module = cst.parse_module(text)
        expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        ours = positions_by_statement(module, text)
        for node in _syntax_nodes(expected):
            assert ours[node] == expected[node], (name, type(node).__name__, expected[node])
        assert not ours._whole, f"{name}: ast and libcst should agree on its statements"


def test_one_statement_asked_for_generates_that_statement_alone():
    module = cst.parse_module(SHAPES)
    ours = positions_by_statement(module, SHAPES)
    target = module.body[-1]  # `x = 1; y = 2`
    assert ours[target].start.line == SHAPES.count("\n")
    assert len(ours) and ours._whole  # asking for all of them generates the whole module
    unread = positions_by_statement(module, SHAPES)
    unread[target]
    below, pending = set(), [target]
    while pending:
        node = pending.pop()
        below.add(id(node))
        pending.extend(node.children)
    assert set(unread._found) == below, "only the last line's nodes are recorded"


def test_punctuation_and_the_module_are_found_too():
    module = cst.parse_module(SHAPES)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    ours = positions_by_statement(module, SHAPES)
    comma = next(node for node in expected if isinstance(node, cst.Comma))
    assert ours[comma] == expected[comma]
    assert ours[module] == expected[module]


@pytest.mark.parametrize("text", [
    "x = 1\ny = 2\n",  # a statement more than the module holds
    "x = (\n",  # not Python
    "def f():\n    pass\n",  # another statement in its place
])
def test_a_text_ast_reads_otherwise_falls_back_to_the_whole_module(text):
    module = cst.parse_module("x = 1\n")
    ours = positions_by_statement(module, text)
    assert ours[module.body[0]] == MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)[module.body[0]]
    assert ours._whole


def test_syntax_the_running_python_may_not_read_keeps_libcsts_positions():
    text = "type Vector = list[float]\n\n\nscale = 2\n"  # no `type` statement before Python 3.12
    module = cst.parse_module(text)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    ours = positions_by_statement(module, text)
    assert [ours[node] for node in _syntax_nodes(expected)] == [expected[node] for node in _syntax_nodes(expected)]
