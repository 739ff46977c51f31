"""The scaler's update around a test of the gradients read after the backward.

``norm = clip_grad_norm_(...); if math.isfinite(norm): opt.step()``: apex lowered the scale as
``amp.scale_loss`` exited, whether the test then stepped or not. Natively ``update()`` must follow
either way: after the ``if`` (``StepPlanning._gradient_guards`` found it exact), before the exit of
each arm that ends the iteration (``else: return False``), or not after it where every way ends
so. A guard the plan could not make exact gets a marker asking for that update by hand.
"""
from __future__ import annotations

from typing import Callable

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.draft import Draft
from migrate.apex_plan.syntax import before_each, ends_every_way, final_exits
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import HOLDS_GRADIENTS, SCALE_LOSS
from migrate.tree_walk import descendants

__all__ = ["plan_gradient_guards"]


def plan_gradient_guards(draft: Draft, tree: FileTree, updates: Callable[[str, str | None], list[cst.BaseStatement]]) -> None:
    """``update()`` after each exact gradient guard of ``draft`` (``updates(scaler, condition)``
    gives its lines), a marker at each inexact one."""
    for guard, scaler, condition in draft.gradient_guards.values():
        before: list[cst.BaseStatement] = []
        if condition is not None and HOLDS_GRADIENTS.partition(" for group")[0] in condition and any(
                type(node) is cst.Call and nodes.call_name(node) == "zero_grad" for node in descendants(guard)):
            # a `zero_grad()` under the guard clears what the test reads: asked after it, the
            # update would be skipped where the step was taken (and the next `unscale_` raise)
            name = next(n for n in ("scaled_this_step", *(f"scaled_this_step_{i}" for i in range(2, 99)), "scaled_this_step_")
                        if n not in tree.names)
            before, condition = nodes.parse_statements(f"{name} = {condition}\n", tree.module), name
        # an arm that ends the iteration (`else: return False`) updates before it leaves
        exits = final_exits(guard)
        updated = before_each(guard, exits, lambda: updates(scaler, condition)) if exits else guard
        after = [] if ends_every_way(guard) else updates(scaler, condition)
        draft.replace(guard, cst.FlattenSentinel([*before, updated, *after]))
        draft.kind(guard, SCALE_LOSS, "the step is skipped on a test of the gradients read after `amp.scale_loss`",
                   f"Call `{scaler}.update()` after the test, whichever way it goes, as apex lowered the scale")
        # apex armed a skip of the next `step()` on an overflow; where this test skipped the
        # call, the skip waited for the next iteration's step: natively only this one is skipped
        reason = ("on an overflow apex also skipped the next iteration's step (its skip waited for a `step()` "
                  "this test did not call); natively only this iteration's step is skipped")
        draft.unsafe.append(reason)
        draft.marked_reasons.append(reason)
        draft.leave_marker(guard, reason)
    for guard in draft.inexact_gradient_guards.values():
        if any(guard is exact for exact, _, _ in draft.gradient_guards.values()):
            continue
        reason = (f"the step is skipped on a test of the gradients read after the backward (`if {nodes.code(guard.test)}:`), "
                  "on a path the scaler's `update()` does not follow: after an overflow the scale is not lowered there, "
                  "as apex did; call `update()` on that path too")
        draft.unsafe.append(reason)
        draft.marked_reasons.append(reason)
        if id(guard) not in draft.replacements:
            draft.replace(guard, guard)
            draft.kind(guard, SCALE_LOSS, "the step is skipped on a test of the gradients read after `amp.scale_loss`",
                       "Call the scaler's `update()` on every path after the test, as apex lowered the scale")
        draft.leave_marker(guard, reason)

