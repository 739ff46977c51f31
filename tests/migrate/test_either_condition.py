"""``vocabulary.either``: the test under which a step that either of two scaled backward passes
leads to goes through the scaler. Whatever it simplifies (shared parts, two arms of one test), it
must be the same test as ``(first) or (second)``, checked on every assignment of the flags, also
where one side is itself an ``either`` (an ``or`` that then sits inside an ``and``: written bare,
``even and (a) or (b)`` read as ``(even and a) or b``, and the scaler stepped where nothing was
scaled)."""
from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from migrate.apex_plan.vocabulary import either

ATOMS = ("even", "TRAIN_MAIN", "TRAIN_AUX", "self.amp is not None")
FLAGS = ("even", "TRAIN_MAIN", "TRAIN_AUX", "amp")


def _test(depth: int):
    leaf = st.sampled_from(ATOMS).flatmap(lambda atom: st.sampled_from([atom, f"not ({atom})"]))
    if depth == 0:
        return leaf
    smaller = _test(depth - 1)
    return st.one_of(leaf, st.tuples(smaller, smaller).map(lambda pair: f"{pair[0]} and {pair[1]}"),
                     st.tuples(smaller, smaller).map(lambda pair: f"({pair[0]}) or ({pair[1]})"))


def _value(test: str | None, assignment: dict[str, bool]) -> bool:
    if test is None:  # always
        return True
    names = {"even": assignment["even"], "TRAIN_MAIN": assignment["TRAIN_MAIN"], "TRAIN_AUX": assignment["TRAIN_AUX"],
             "self": type("Self", (), {"amp": object() if assignment["amp"] else None})()}
    return bool(eval(test, {}, names))


def _same(found: str | None, expected: str) -> None:
    for values in itertools.product([False, True], repeat=len(FLAGS)):
        assignment = dict(zip(FLAGS, values))
        assert _value(found, assignment) == _value(expected, assignment), (found, expected, assignment)


@settings(max_examples=300, deadline=None)
@given(first=_test(2), second=_test(2), third=_test(1))
def test_either_is_the_or_of_its_two_tests(first, second, third):
    _same(either(first, second), f"({first}) or ({second})")
    inner = either(second, third)
    if inner is not None:  # a side that is itself an `either`, joined again with a shared part
        _same(either(f"even and {inner if ' ' not in inner else f'({inner})'}", f"not (even) and {first}"),
              f"(even and (({second}) or ({third}))) or (not (even) and {first})")


def test_an_or_inside_an_alternative_keeps_its_parentheses():
    found = either("even and ((TRAIN_MAIN) or (TRAIN_AUX))", "not (even) and TRAIN_MAIN")
    _same(found, "(even and (TRAIN_MAIN or TRAIN_AUX)) or (not (even) and TRAIN_MAIN)")
