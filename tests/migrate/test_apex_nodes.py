"""``apex_nodes``: a node's own text (dotted names without codegen), and a file's apex imports wherever they are."""
from pathlib import Path

import libcst as cst
import pytest

from migrate.apex_nodes import apex_imports, bound_texts, code
from migrate.types import ImportChange
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


_IMPORTS_EVERYWHERE = """\
import apex
if fp16: import apex.amp as A
try:
    from apex import amp
except ImportError:
    from apex.optimizers import FusedAdam as Adam
else:
    from apex import parallel
finally:
    from apex.normalization import FusedLayerNorm
class Trainer:
    def setup(self):
        with ctx():
            for _ in range(1):
                while True:
                    from apex import fp16_utils; break
match mode:
    case "amp":
        from apex import amp
x = lambda: __import__("apex")  # not an import statement
from . import apex
from apex.amp import *
"""


def test_apex_imports_are_found_in_every_kind_of_block_in_source_order():
    found = apex_imports(cst.parse_module(_IMPORTS_EVERYWHERE))
    assert found == {
        "apex": [ImportChange("apex")],
        "A": [ImportChange("apex.amp", None, "A")],
        "amp": [ImportChange("apex", "amp"), ImportChange("apex", "amp")],
        "Adam": [ImportChange("apex.optimizers", "FusedAdam", "Adam")],
        "parallel": [ImportChange("apex", "parallel")],
        "FusedLayerNorm": [ImportChange("apex.normalization", "FusedLayerNorm")],
        "fp16_utils": [ImportChange("apex", "fp16_utils")],
    }


@pytest.mark.parametrize(("statement", "bound"), [
    ("loss = f()", ["loss"]),
    ("loss, (aux, self.total) = f()", ["loss", "aux", "self.total"]),
    ("[first, *rest] = f()", ["first", "rest"]),
    ("state['scaler'] = s", ["state['scaler']"]),
])
def test_bound_texts_unpacks_every_target_an_assignment_binds(statement, bound):
    assign = cst.parse_statement(statement + "\n").body[0]

    assert bound_texts(assign.targets[0].target) == bound
