"""The folding AMP001 and AMP018 share (``migrate.rules._known_tests``), checked against Python
itself: every spelling of a test around a name whose value is known (``bool(x)``, a comparison
with ``None``/``True``/``False``, any ``not``s, an ``and`` on either side), in an ``if`` or a
conditional expression, must be decided the way evaluating it decides it, for ``x`` the literal
``True`` (AMP018's flag) and for ``x`` a module (AMP001's ``amp``)."""
from __future__ import annotations

import itertools
import types

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from migrate.rules._known_tests import A_MODULE, decided_by

WRAPS = ["{x}", "bool({x})"]
COMPARISONS = ["", " is None", " is not None", " == None", " != None", " is True", " is False", " == True", " != False"]
NOTS = ["", "not ", "not not "]
# the test's place: an `if`, an `and` operand on either side (with `other` standing for the rest), a conditional expression
PLACES = ["if {test}:\n    a()\nelse:\n    b()\n", "if {test} and other:\n    a()\nelse:\n    b()\n",
          "if other and {test}:\n    a()\nelse:\n    b()\n", "y = 1 if {test} else 2\n"]
VALUES = {"true": (True, True), "module": (A_MODULE, types.ModuleType("amp"))}


def _tests():
    for wrap, comparison, nots in itertools.product(WRAPS, COMPARISONS, NOTS):
        inner = wrap.format(x="x") + comparison
        yield nots + (f"({inner})" if comparison and nots else inner)


def _decide(source: str, value: object):
    wrapper = MetadataWrapper(cst.parse_module(source))
    parents = wrapper.resolve(ParentNodeProvider)
    read = next(n for n in parents if isinstance(n, cst.Name) and n.value == "x")
    return decided_by(read, parents.get, value), wrapper.module


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("place", range(len(PLACES)))
@pytest.mark.parametrize("test", list(_tests()))
def test_a_known_test_is_decided_as_python_decides_it(test, place, value):
    known, actual = VALUES[value]
    truth = bool(eval(test, {"x": actual}))
    decided, module = _decide(PLACES[place].format(test=test), known)
    assert decided is not None, test
    node, outcome = decided
    if place == 0:
        assert isinstance(node, cst.If) and outcome is truth
    elif place in (1, 2):
        if truth:  # `<true> and other` is `other`
            assert isinstance(node, cst.BooleanOperation) and module.code_for_node(outcome) == "other"
        else:  # `<false> and other` is False: the `if` takes its else
            assert isinstance(node, cst.If) and outcome is False
    else:
        assert isinstance(node, cst.IfExp) and module.code_for_node(outcome) == ("1" if truth else "2")


# a known test in an `or` (either side) and in an `assert`; `{{fp16}}` a name whose value is not known
ALWAYS_TRUE_PLACES = ["if {test} or other:\n    a()\n", "if other or {test}:\n    a()\n", "assert {test}, 'needs apex'\n",
                      "assert not fp16 or {test}, 'needs apex'\n", "assert not fp16 or fp16 and {test}, 'needs apex'\n",
                      "assert not fp16 or {test} and fp16\n", "assert (not fp16) or (fp16 and {test})\n"]


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("place", range(len(ALWAYS_TRUE_PLACES)))
@pytest.mark.parametrize("test", list(_tests()))
def test_an_or_or_an_assert_a_known_test_makes_true_is_decided(test, place, value):
    known, actual = VALUES[value]
    source = ALWAYS_TRUE_PLACES[place].format(test=test)
    truth = bool(eval(test, {"x": actual}))
    decided, module = _decide(source, known)
    if not truth:  # `False or other` is `other`, which nothing here knows; so is the assert's outcome
        assert decided is None or not isinstance(decided[0], (cst.Assert, cst.SimpleStatementLine)), source
        return
    assert decided is not None, source
    node, outcome = decided
    if source.startswith("if"):
        assert isinstance(node, cst.If) and outcome is True, source
    else:  # the assert always passes: its line goes
        assert isinstance(node, cst.SimpleStatementLine) and isinstance(outcome, cst.RemoveFromParent().__class__), source


@pytest.mark.parametrize("source", [
    "print(x)\n", "f(x)\n", "y = x\n", "if x is other:\n    a()\n", "assert x is other\n",
    "if x > 0:\n    a()\n", "while x:\n    a()\n", "z = [x]\n", "if (not x) is None:\n    a()\n",
])
def test_a_read_that_is_not_a_known_test_decides_nothing(source):
    assert _decide(source, True)[0] is None, source
