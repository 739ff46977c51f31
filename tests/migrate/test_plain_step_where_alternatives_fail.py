"""AMP102 on a plain ``optimizer.step()`` in the ``else`` arm of an ``if`` joining alternatives
(``if (a and use_amp) or (b and use_amp): scaler.step(optimizer) else: optimizer.step()``, as the
rewrite writes for passes scaled under tests of their own). The ``else`` runs only where every
alternative fails: where one of them holds wholly around the scaled backward (``if a:`` /
``if use_amp:``), the two never run in one pass and the plain step is no step after a scaled
backward. Where none does, it may be, and is reported."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

LOOP = """\
import torch


def train(model, optimizer, scaler, batches, a, b, c, use_amp):
    for x, y in batches:
        loss = model(x).sum()
        if a:
            if use_amp:
                scaler.scale(loss).backward()
            else:
                loss.backward()
        if {test}:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
"""
HOLDS = {"a", "use_amp"}  # around the scaled backward
SIDES = ["a and use_amp", "use_amp and a", "a", "use_amp", "b and use_amp", "use_amp and c", "b", "a and c"]


def _alternatives():
    for count in (2, 3):
        for sides in itertools.permutations(SIDES, count):
            for parenthesized in (False, True):
                yield [f"({side})" if parenthesized and " " in side else side for side in sides]


@pytest.mark.parametrize("sides", list(_alternatives()), ids=" or ".join)
def test_the_plain_arm_is_reported_only_where_no_alternative_holds_around_the_scaled_pass(sides):
    exclusive = any(set(side.strip("()").split(" and ")) <= HOLDS for side in sides)
    result = migrate_source(LOOP.format(test=" or ".join(sides)), filename="train.py", fix=False)
    assert ("AMP102" in {d.code for d in result.diagnostics}) != exclusive, result.diagnostics
