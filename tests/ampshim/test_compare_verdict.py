"""``ampshim.compare.verdict`` on trajectories built by hand: each cause, and what is the same."""
import math
from dataclasses import replace

import pytest

from ampshim.compare.trajectory import Backward, Clip, End, Step, Trajectory
from ampshim.compare.verdict import first_difference, tolerance_for

TOLERANCE = tolerance_for("bfloat16")


def backward(loss=1.0, scale=65536.0, dtype="float32", growth=(2000, 2.0), matmul=4, half=4):
    return Backward(loss=loss, dtype=dtype, scale=scale, growth=growth, via="GradScaler",
                    matmul=matmul, half=half, half_dtype="bfloat16" if half else None)


def step(number, *, backwards=None, clips=(), taken=True, grad_norm=0.5, optimizer=0):
    return Step(number=number, optimizer=optimizer, name="SGD", taken=taken,
                grad_norm=grad_norm if taken else None,
                backwards=tuple(backwards or [backward(loss=2.0 / number)]), clips=tuple(clips))


def run(steps, checksum=None, end="steps", error=None):
    return Trajectory(steps=tuple(steps), end=End(end, error, checksum or {"sum": 1.0, "abs": 9.0,
                                                                             "numel": 10}))


BASE = [step(n) for n in range(1, 6)]


def changed(index, **fields):
    steps = list(BASE)
    steps[index] = replace(steps[index], **fields)
    return steps


def with_backward(index, **fields):
    return changed(index, backwards=(replace(BASE[index].backwards[0], **fields),))


CASES = {
    "forward-precision": (with_backward(0, half=0), 1),
    "loss-precision": (with_backward(1, dtype="bfloat16"), 2),
    "scale-schedule": (with_backward(0, growth=None), 1),
    "loss-scale": (with_backward(2, scale=1024.0), 3),
    "loss": (with_backward(3, loss=0.9), 4),
    "backward-count": (changed(1, backwards=BASE[1].backwards * 2), 2),
    "clip": (changed(0, clips=(Clip(1.0, 3.0),)), 1),
    "skipped-step": (changed(2, taken=False), 3),
    "optimizer-order": (changed(4, optimizer=1), 5),
    "gradients": (changed(1, grad_norm=0.05), 2),
    "fewer-steps": (BASE[:3], 4),
}


@pytest.mark.parametrize("cause", sorted(CASES))
def test_each_cause_at_its_step(cause):
    migrated, where = CASES[cause]
    difference = first_difference(run(BASE), run(migrated), TOLERANCE)
    assert (difference.cause, difference.step) == (cause, where), difference


def test_the_same_run_is_the_same():
    assert first_difference(run(BASE), run(BASE), TOLERANCE) is None


def test_a_loss_within_the_tolerance_is_the_same():
    migrated = with_backward(0, loss=2.0 * (1 + TOLERANCE.rtol / 2))
    assert first_difference(run(BASE), run(migrated), TOLERANCE) is None


def test_a_scale_aware_clip_is_the_original_clip_and_a_scaled_one_is_named():
    original = changed(0, clips=(Clip(1.0, 4.0),))
    scale_aware = changed(0, clips=(Clip(65536.0, 4.0 * 65536),))
    assert first_difference(run(original), run(scale_aware), TOLERANCE) is None
    scaled = changed(0, clips=(Clip(1.0, 4.0 * 65536),))
    assert first_difference(run(original), run(scaled), TOLERANCE).cause == "clip-scaled"


def test_non_finite_losses_agree_with_each_other_only():
    nan = with_backward(0, loss=math.nan)
    assert first_difference(run(nan), run(nan), TOLERANCE) is None
    assert first_difference(run(BASE), run(nan), TOLERANCE).cause == "loss"


def test_a_crash_and_a_script_that_never_steps():
    crashed = first_difference(run(BASE), run(BASE[:2], end="error", error="RuntimeError: boom"),
                               TOLERANCE)
    assert (crashed.cause, crashed.step) == ("crash", 3) and "RuntimeError: boom" in crashed.message
    idle = first_difference(run(BASE), run([], end="exit"), TOLERANCE)
    assert idle.cause == "never-steps" and "took 5" in idle.message


def test_parameters_that_end_apart():
    moved = run(BASE, checksum={"sum": 1.0, "abs": 12.0, "numel": 10})
    assert first_difference(run(BASE), moved, TOLERANCE).cause == "parameters"


def test_the_tolerance_follows_the_precision_unless_given():
    assert tolerance_for("bfloat16").rtol > tolerance_for("float16").rtol > tolerance_for(None).rtol
    assert tolerance_for("bfloat16", 0.5).rtol == 0.5


def test_json_output_is_strict_with_non_finite_losses():
    import json

    from ampshim.compare.report import _finite

    document = json.dumps(_finite({"losses": [1.0, math.nan, math.inf, -math.inf]}),
                          allow_nan=False)
    assert json.loads(document)["losses"] == [1.0, "NaN", "Infinity", "-Infinity"]


def test_layers_run_without_gradients_in_float32_where_the_original_ran_them_in_half():
    """A memory bank filled under ``torch.no_grad()`` after the step: the step whose window held
    it is named, before the loss it then changes."""
    original = [replace(s, detached=(2, 2)) for s in BASE]
    migrated = list(original)
    migrated[2] = replace(migrated[2], detached=(2, 0), backwards=(replace(BASE[2].backwards[0], loss=0.1),))
    difference = first_difference(run(original), run(migrated), TOLERANCE)
    assert (difference.cause, difference.step) == ("no-grad-precision", 3), difference
    assert "left in float32" in difference.message and "0 of 2" in difference.message


def test_layers_without_gradients_on_one_side_only_are_not_compared():
    """Nothing to compare where a side ran none in that step's window."""
    original = [replace(s, detached=(2, 2)) for s in BASE]
    assert first_difference(run(original), run(BASE), TOLERANCE) is None
