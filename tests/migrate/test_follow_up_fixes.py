"""The fixes a later round applies are listed with the first round's.

Removing ``from apex.normalization import FusedLayerNorm`` leaves the ``try`` around it guarding
nothing; the next round replaces that ``try`` by its body, dropping the ``except`` branch (a
fallback class, a flag, a message), and folds a flag the rewrite made constant. Those changes were
in the written file but in no list of fixes (``--show-fixes``, the report, the API's diagnostics),
so their messages, which say what a run without apex now does, reached nobody (thunlp/ERICA's
``modeling.py``, sail-sg/poolformer's ``validate.py``, fresh79). Each is listed once, at the line of
the original text it came from.
"""
from __future__ import annotations

import itertools

import libcst as cst
import pytest
from click.testing import CliRunner
from libcst.metadata import CodePosition, CodeRange

from migrate.api import migrate_source
from migrate.cli import main
from migrate.follow_ups import Applied, follow_up_diagnostics
from migrate.rule import Report
from migrate.types import Diagnostic, Fix, Position, Safety

SCRIPT = """\
import torch
from torch import nn
{prefix}
{indent}try:
{indent}    {apex_import}
{indent}except {caught}:
{fallback}
{after}

class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = {name}(width, eps=1e-12)
"""
IMPORTS = {  # the apex import, and the name it binds
    "fused": ("from apex.normalization import FusedLayerNorm", "FusedLayerNorm"),
    "aliased": ("from apex.normalization.fused_layer_norm import FusedLayerNorm as BertLayerNorm", "BertLayerNorm"),
}
CAUGHT = ["ImportError", "ModuleNotFoundError", "(ImportError, AttributeError)"]
FALLBACKS = {  # what the `except` branch did without apex
    "class": "class {name}(nn.LayerNorm):\n    pass",
    "alias": "{name} = nn.LayerNorm",
    "message": "print('apex is not installed: slower layer norm')\n{name} = torch.nn.LayerNorm",
}
PLACES = {  # where the `try` is: its indent, and what opens and follows it
    "module": ("", "", ""),
    "if": ("    ", "if True:", ""),  # the `if` around nothing but the `try` goes with it: listed at the `if`
    "if_with_more": ("    ", "if True:", "    width = 4"),
}
VARIANTS = list(itertools.product(IMPORTS, CAUGHT, FALLBACKS, PLACES))


def _script(imported: str, caught: str, fallback: str, place: str) -> tuple[str, int]:
    """The script, and the row of the statement the later round removes (its ``try``, or the ``if``
    around nothing else)."""
    apex_import, name = IMPORTS[imported]
    indent, prefix, after = PLACES[place]
    handler = "\n".join(indent + "    " + line for line in FALLBACKS[fallback].format(name=name).splitlines())
    source = SCRIPT.format(prefix=prefix, indent=indent, apex_import=apex_import, caught=caught, fallback=handler,
                           after=after, name=name)
    removed = "if True:" if place == "if" else "try:"
    row = next(number for number, line in enumerate(source.splitlines(), 1) if line.strip() == removed)
    return source, row


@pytest.mark.parametrize(("imported", "caught", "fallback", "place"), VARIANTS)
def test_the_try_removed_by_a_later_round_is_listed_once_at_its_line(imported, caught, fallback, place):
    source, row = _script(imported, caught, fallback, place)
    result = migrate_source(source, "model.py")
    assert result.error is None
    assert "try:" not in result.new_source and "apex" not in result.new_source
    removals = [d for d in result.diagnostics if d.code == "AMP001" and d.applied]
    assert [d.fix.message for d in removals] == ["Replace the `try` statement by its body"]
    assert removals[0].location.row == row
    assert "can no longer run" in removals[0].message
    # the first round's fix of the use is listed as before, once
    uses = [d for d in result.diagnostics if d.code == "AMP014" and d.applied]
    assert len(uses) == 1 and uses[0].location.row == source.splitlines().index(f"        self.norm = {IMPORTS[imported][1]}(width, eps=1e-12)") + 1


def test_show_fixes_lists_the_later_round(tmp_path):
    source, _ = _script("aliased", "ImportError", "class", "module")
    path = tmp_path / "model.py"
    path.write_text(source)
    result = CliRunner().invoke(main, [str(path), "--show-fixes"])
    assert "1 × AMP001 (Replace the `try` statement by its body)" in result.output
    assert "1 × AMP014" in result.output
    assert "Found 2 findings (2 fixed, 0 remaining)" in result.output


def test_a_file_the_first_round_settles_lists_nothing_more():
    source = "import torch\nfrom apex.normalization import FusedLayerNorm\nnorm = FusedLayerNorm(4)\n"
    result = migrate_source(source, "model.py")
    assert [(d.code, d.location.row) for d in result.diagnostics if d.applied] == [("AMP014", 3)]


def _report(code: str, fix: str) -> Report:
    return Report(code, cst.Name("x"), f"{code} finding", replacement=cst.Name("y"), fix_message=fix)


def _applied(report: Report, text: str, row: int) -> Applied:
    return Applied(report, text, {report.node: CodeRange(CodePosition(row, 0), CodePosition(row, 1))})


def _listed(code: str, fix: str, row: int) -> Diagnostic:
    return Diagnostic(code, f"{code} finding", "f.py", Position(row, 1), Position(row, 1),
                      fix=Fix(applicability=Safety.SAFE, message=fix), applied=True)


def _diagnostic_of(report, positions):
    where = positions[report.node]
    at = Position(where.start.line, where.start.column + 1)
    return Diagnostic(report.code, report.message, "f.py", at, at, fix=Fix(Safety.SAFE, report.fix_message))


def test_a_fix_nested_in_another_is_not_listed_twice():
    """The first round lists both; it applies the outer one, the next round the inner one."""
    source = "a\nb\nc\n"
    outer = _report("AMP002", "outer")
    later_text = "a\nB\nc\n"
    rounds = [[_applied(outer, source, 2)], [_applied(_report("AMP003", "inner"), later_text, 2)]]
    found = follow_up_diagnostics(source, [_listed("AMP002", "outer", 2), _listed("AMP003", "inner", 2)], rounds,
                                  _diagnostic_of)
    assert found == ()


def test_a_new_fix_of_a_code_already_listed_is_listed():
    source = "a\nb\nc\n"
    rounds = [[_applied(_report("AMP003", "inner"), source, 2)], [_applied(_report("AMP003", "inner"), "a\nb\nc\n", 3)]]
    found = follow_up_diagnostics(source, [_listed("AMP003", "inner", 2)], rounds, _diagnostic_of)
    assert [(d.code, d.location.row, d.applied) for d in found] == [("AMP003", 3, True)]


@pytest.mark.parametrize(("later_text", "row", "expected"), [
    ("a\nb\nc\nd\n", 4, Position(4, 5)),  # an unchanged line keeps its row and column
    ("x\ny\nz\na\nb\nc\nd\n", 7, Position(4, 5)),  # lines written above it shift it back
    ("a\nNEW\nNEWER\nd\n", 3, Position(2, 1)),  # a written line goes to the first line it replaced
    ("a\nd\n", 2, Position(4, 5)),  # lines removed above it
])
def test_a_later_line_is_placed_in_the_original_text(later_text, row, expected):
    source = "a\nb\nc\nd\n"
    report = _report("AMP001", "remove")
    applied = Applied(report, later_text, {report.node: CodeRange(CodePosition(row, 4), CodePosition(row, 5))})
    found = follow_up_diagnostics(source, [], [[], [applied]], _diagnostic_of)
    assert found[0].location == expected
