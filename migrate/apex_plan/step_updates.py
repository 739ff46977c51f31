"""Where the scaler's ``update()`` goes among the optimizer steps the scaled backward passes feed.

The scale is updated once per scaled backward, after the last of its optimizers' steps (in each
branch, when the steps sit in different branches); with apex's per-loss scalers merged into one
GradScaler (``merged``), after the last step of all the losses' optimizers in each block. A step
under a test (``if <holds gradients>: scaler.step(opt_D) else: opt_D.step()``) carries the update
in its test, unless a step before it in the block always goes through the scaler: the update
then follows the test whichever way it goes, as ``step()`` again before an ``update()`` raises.
"""
from __future__ import annotations

from typing import NamedTuple

import libcst as cst

from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import either

__all__ = ["PlacedStep", "placed_steps"]


class PlacedStep(NamedTuple):
    line: cst.SimpleStatementLine
    updates: dict[int, bool]  # each step's index in the line: whether the update follows it
    condition: str | None  # the test the step goes through the scaler under
    update_after: bool  # the update follows the step's test rather than sitting in it


def placed_steps(tree: FileTree, found_by_scale: list[list[tuple[cst.SimpleStatementLine, int, str | None]]],
                 under_guard, merged: bool) -> list[PlacedStep]:
    """Each stepping line once, with where its updates go. ``under_guard(line)``: whether the
    step sits under a test of the gradients, whose own update follows that test."""
    if merged:
        found_by_scale = [[hit for found in found_by_scale for hit in found]]
    stepped: dict[int, PlacedStep] = {}
    for found in found_by_scale:
        found = sorted(found, key=lambda hit: (tree.order[id(hit[0])], hit[1]))
        last_in_block = {id(tree.parent[id(line)]): (id(line), index) for line, index, _ in found}
        for line, index, condition in found:
            entry = stepped.setdefault(id(line), PlacedStep(line, {}, condition, False))
            if entry.condition != condition:  # two scaled backward passes in different arms step it
                entry = stepped[id(line)] = entry._replace(condition=either(entry.condition, condition))
            last = last_in_block[id(tree.parent[id(line)])] == (id(line), index) and not under_guard(line)
            entry.updates[index] = entry.updates.get(index, False) or last
            if last and entry.condition is not None and any(
                    other is not line and always is None and tree.parent[id(other)] is tree.parent[id(line)]
                    and tree.order[id(other)] < tree.order[id(line)] for other, _, always in found):
                stepped[id(line)] = entry._replace(update_after=True)
    return list(stepped.values())
