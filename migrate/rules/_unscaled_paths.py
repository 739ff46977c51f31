"""Whether gradients a read sees were unscaled on every way from the scaled backward to it."""
from __future__ import annotations

import libcst as cst

from migrate.step_model import Event, Kind, Steps


def unscaled_on_every_path(steps: Steps, unscaling: list[Event], read: Event, backward: Event) -> bool:
    """Whether one of ``unscaling`` (``unscale_`` or ``scaler.step`` calls) runs on every path from
    ``backward`` to ``read``: one runs whenever both do, or the two arms of an ``if``/``else``
    each hold one (``if clip: scaler.unscale_(opt); clip(...); scaler.step(opt) / else: scaler.step(opt)``)."""
    if any(steps.runs_whenever(e, read, backward) or _unscaled_on_the_last_pass(steps, e, read, backward) for e in unscaling):
        return True
    known = {*read.arms(), *backward.arms()}
    sides: dict[int, set[bool]] = {}
    for e in unscaling:
        extra = [arm for arm in e.arms() if arm not in known]
        if len(extra) == 1 and isinstance(extra[0].node.orelse, cst.Else):
            sides.setdefault(id(extra[0].node), set()).add(extra[0].body)
    return any(len(taken) == 2 for taken in sides.values())


def _unscaled_on_the_last_pass(steps: Steps, unscale: Event, read: Event, backward: Event) -> bool:
    """Whether ``unscale`` runs after ``backward`` in a loop of micro-batches that ``read`` follows,
    under tests of the loop's pass only (``if is_last_batch:``), in a loop that neither steps nor
    updates that scaler. Only an ``unscale_`` on the last pass leaves gradients the step after the
    loop can take: on an earlier one the next backward adds scaled gradients to unscaled ones, and a
    second one before ``update()`` raises. So the read after the loop sees them unscaled."""
    outside = [loop for loop in backward.loops() if loop not in read.frames]
    if unscale.kind is not Kind.UNSCALE or not outside or outside[0] not in unscale.frames:
        return False
    loop = outside[0]
    inside = unscale.frames_inside(loop)
    known = {*read.arms(), *backward.arms()}
    if any(arm not in known for arm in unscale.arms() if arm not in inside):
        return False  # a test outside the loop that the read does not share
    return not any(e.scaler == unscale.scaler and e.kind in (Kind.SCALER_STEP, Kind.UPDATE) and loop in e.frames
                   for e in steps.events)
