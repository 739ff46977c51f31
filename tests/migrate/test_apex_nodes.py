"""``apex_nodes.code``: a node's own text, as libcst generates it, dotted names without codegen."""
from pathlib import Path

import libcst as cst
import pytest

from migrate.apex_nodes import code
from migrate.metadata import parents

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("source", ["a", "a.b.c", "self.scaler", "(a).b", "(a.b)", "a . b", "a.\\\n    b",
                                    "a.b()", "x[1].y", "a.b.c.d.e"])
def test_code_is_libcsts_text(source):
    expression = cst.parse_expression(source)
    assert code(expression) == cst.Module([]).code_for_node(expression) == source


def test_code_is_libcsts_text_for_every_name_and_attribute_of_the_fixtures():
    generated = cst.Module([])
    for path in sorted((REPO / "fixtures" / "legacy").rglob("*.py")):
        module = cst.parse_module(path.read_text(encoding="utf-8"))
        for node in parents(module):
            if isinstance(node, (cst.Name, cst.Attribute)):
                assert code(node) == generated.code_for_node(node), path.name
