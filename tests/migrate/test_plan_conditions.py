"""The condition texts the apex plan compares and merges: read as Python reads them."""
from __future__ import annotations

import pytest

from migrate.apex_plan.vocabulary import conjuncts, either, normal


@pytest.mark.parametrize(("first", "second"), [
    ("args.fp16", "(args.fp16)"),
    ("(a) or (b)", "a or b"),
    ("cfg.amp and not cfg.bf16", "(cfg.amp) and (not cfg.bf16)"),
    ("amp.initialize(model,\n    optimizer, opt_level='O1')", "amp.initialize(model, optimizer, opt_level='O1')"),
])
def test_the_same_code_compares_equal_whatever_its_spacing_and_parentheses(first, second):
    assert normal(first) == normal(second)


@pytest.mark.parametrize(("first", "second"), [
    ("(a) or (b)", "a) or (b"),  # stripping the outer characters of the first would make them equal
    ("not x", "notx"),
    ("a and (b or c)", "(a and b) or c"),
])
def test_different_code_compares_different(first, second):
    assert normal(first) != normal(second)


def test_conjuncts_split_only_a_top_level_and_outside_strings():
    assert conjuncts("args.amp and (args.mode == 'fp16 and more' or x) and not args.cpu") == [
        "args.amp", "args.mode == 'fp16 and more' or x", "not args.cpu"]
    assert conjuncts("(a and b)") == ["a", "b"]
    assert conjuncts("f(x and y)") == ["f(x and y)"]


@pytest.mark.parametrize(("first", "second", "merged"), [
    ("args.amp and even", "args.amp and not even", "args.amp"),  # the two arms of one test
    ("(args.amp) and (even)", "args.amp and not (even)", "args.amp"),
    ("args.amp", None, None),
    ("cfg.fp16", "cfg.apex", "(cfg.fp16) or (cfg.apex)"),
])
def test_either_merges_the_tests_of_two_scaled_backward_passes(first, second, merged):
    assert either(first, second) == merged
