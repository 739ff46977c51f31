"""Two trajectories side by side: the same, or the first step where they part and why.

Each step is compared in the order things happen in it: the precision of the layers run without
gradients since the step before (a memory bank filled after it), the forward's precision, the loss's
precision and value, the loss scale and how it grows, the gradient clip, whether the optimizer
stepped, and the gradients it stepped with. The first thing that differs names the cause, so a
forward left in float32 is reported as that, not as the loss it then changes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ampshim.compare.trajectory import Backward, Step, Trajectory

__all__ = ["Tolerance", "Difference", "tolerance_for", "first_difference", "largest_loss_gap"]

# Relative tolerance on losses, by the half precision the forward ran in. Both sides run the same
# ops from the same seed, so on one device they usually agree to the last bit; the margin covers
# casts placed differently (apex O2's half model against autocast) compounding over the steps.
_RTOL = {"bfloat16": 2e-2, "float16": 5e-3, None: 1e-4}
_SHARE_TOLERANCE = 0.01  # of matmul-class ops in half precision
# Gradient norms and parameters aggregate many values: they get this many times the loss's.
_AGGREGATE_FACTOR = 5


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float

    def close(self, a: float | None, b: float | None, factor: float = 1.0) -> bool:
        if a is None or b is None:
            return a is b
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return abs(a - b) <= factor * (self.atol + self.rtol * abs(a))


def tolerance_for(half_dtype: str | None, rtol: float | None = None) -> Tolerance:
    """The tolerance for a run whose forward used ``half_dtype`` (None: float32); ``rtol`` wins."""
    chosen = rtol if rtol is not None else _RTOL.get(half_dtype, _RTOL["bfloat16"])
    return Tolerance(rtol=chosen, atol=chosen / 10)


@dataclass(frozen=True)
class Difference:
    """Where two runs part: ``step`` (1-based, None for the whole run) and a ``cause`` code."""

    cause: str
    message: str
    step: int | None = None
    rank: int = 0


def first_difference(original: Trajectory, migrated: Trajectory, tolerance: Tolerance,
                     *, rank: int = 0) -> Difference | None:
    """The first difference between the two runs of one rank, or None when they train the same."""
    for before, after in zip(original.steps, migrated.steps):
        found = _step_difference(before, after, tolerance)
        if found is not None:
            cause, message = found
            return Difference(cause, message, before.number, rank)
    if len(original.steps) != len(migrated.steps):
        return _ended_early(original, migrated, rank)
    if migrated.failed:
        return Difference("crash", f"the migrated script crashed after its last step: "
                          f"{_error_of(migrated)}", None, rank)
    return _parameter_difference(original, migrated, tolerance, rank)


def largest_loss_gap(original: Trajectory, migrated: Trajectory) -> tuple[float, int | None]:
    """The largest relative difference of two losses, and its step (for the summary)."""
    gap, where = 0.0, None
    for before, after in zip(original.steps, migrated.steps):
        for a, b in zip(before.backwards, after.backwards):
            if a.loss is None or b.loss is None or not (math.isfinite(a.loss) and math.isfinite(b.loss)):
                continue
            relative = abs(a.loss - b.loss) / max(abs(a.loss), 1e-12)
            if relative > gap:
                gap, where = relative, before.number
    return gap, where


# --- one step --------------------------------------------------------------------------------------

def _step_difference(before: Step, after: Step, tolerance: Tolerance):
    found = _detached_difference(before, after)
    if found is not None:
        return found
    for index, (a, b) in enumerate(zip(before.backwards, after.backwards)):
        found = _backward_difference(a, b, tolerance)
        if found is not None:
            cause, message = found
            which = f" (backward pass {index + 1} of the step)" if len(before.backwards) > 1 else ""
            return cause, message + which
    if len(before.backwards) != len(after.backwards):
        return "backward-count", (f"{_passes(len(before.backwards))} before this step in the "
                                  f"original, {_passes(len(after.backwards))} in the migrated script")
    found = _clip_difference(before, after, tolerance)
    if found is not None:
        return found
    if before.taken != after.taken:
        skipped, stepped = ("migrated", "original") if before.taken else ("original", "migrated")
        return "skipped-step", (f"the optimizer step was skipped (gradient overflow) in the "
                                f"{skipped} script and taken in the {stepped}")
    if before.optimizer != after.optimizer:
        return "optimizer-order", (f"the original stepped optimizer #{before.optimizer} "
                                   f"({before.name}) here, the migrated script #{after.optimizer} "
                                   f"({after.name})")
    if before.taken and not tolerance.close(before.grad_norm, after.grad_norm, _AGGREGATE_FACTOR):
        return "gradients", (f"the optimizer stepped with gradients of norm "
                             f"{_fmt(before.grad_norm)} in the original, {_fmt(after.grad_norm)} "
                             "in the migrated script")
    return None


def _detached_difference(before: Step, after: Step):
    """Layers run with gradients off (``torch.no_grad``) in half precision on one side only: apex
    cast every forward pass, a region around the training forward leaves the others in float32."""
    share_a, share_b = before.detached_share, after.detached_share
    if share_a is None or share_b is None or abs(share_a - share_b) <= _SHARE_TOLERANCE:
        return None
    (total_a, half_a), (total_b, half_b) = before.detached, after.detached
    counts = (f"{half_b} of {total_b} matmul-class layers run without gradients were in half precision "
              f"in the migrated script, {half_a} of {total_a} in the original")
    where = "left in float32" if share_b < share_a else "in half precision where the original's is not"
    return "no-grad-precision", f"a forward pass without gradients (torch.no_grad) {where}: {counts}"


def _backward_difference(a: Backward, b: Backward, tolerance: Tolerance):
    share_a, share_b = a.half_share, b.half_share
    if share_a is not None and share_b is not None and abs(share_a - share_b) > _SHARE_TOLERANCE:
        counts = (f"{b.half} of {b.matmul} matmul-class ops in half precision in the migrated "
                  f"script, {a.half} of {a.matmul} in the original")
        if share_b < share_a:
            return "forward-precision", f"forward left in float32: {counts}"
        return "forward-precision", f"forward in half precision where the original's is not: {counts}"
    if _is_half(a.dtype) != _is_half(b.dtype):
        if _is_half(b.dtype):
            return "loss-precision", (f"loss computed in {b.dtype} in the migrated script, in "
                                      f"{a.dtype} in the original (is it outside autocast?)")
        return "loss-precision", (f"loss computed in {b.dtype} in the migrated script, in "
                                  f"{a.dtype} in the original")
    if a.growth != b.growth:
        return "scale-schedule", (f"the loss scale {_growth(a.growth)} in the original, "
                                  f"{_growth(b.growth)} in the migrated script")
    if not math.isclose(a.scale, b.scale, rel_tol=1e-6):
        return "loss-scale", (f"loss scale {_fmt(a.scale)} in the original, {_fmt(b.scale)} in "
                              "the migrated script")
    if not tolerance.close(a.loss, b.loss):
        return "loss", (f"loss {_fmt(a.loss)} in the original, {_fmt(b.loss)} in the migrated "
                        f"script (beyond rtol {tolerance.rtol:g})")
    return None


def _clip_difference(before: Step, after: Step, tolerance: Tolerance):
    """Clips are the same when they shrink the gradients by the same factor: a clip of scaled
    gradients at ``max_norm`` times the scale is the original's clip."""
    if len(before.clips) != len(after.clips):
        return "clip", (f"gradients clipped {_times(len(before.clips))} before this step in the "
                        f"original, {_times(len(after.clips))} in the migrated script")
    scale = after.backwards[-1].scale if after.backwards else 1.0
    for a, b in zip(before.clips, after.clips):
        if tolerance.close(_shrink(a), _shrink(b), _AGGREGATE_FACTOR):
            continue
        if (a.norm and b.norm and scale > 1.0 and math.isfinite(b.norm)
                and math.isclose(b.norm / a.norm, scale, rel_tol=0.05)):
            return "clip-scaled", (f"gradients clipped while scaled: clip_grad_norm_ saw a norm "
                                   f"of {_fmt(b.norm)} in the migrated script, {_fmt(a.norm)} in "
                                   f"the original ({_fmt(scale)}x: the loss scale); unscale_ the "
                                   "optimizer before clipping")
        return "clip", (f"clip_grad_norm_(max_norm={_fmt(b.max_norm)}) saw a norm of "
                        f"{_fmt(b.norm)} in the migrated script, max_norm={_fmt(a.max_norm)} and "
                        f"{_fmt(a.norm)} in the original")
    return None


def _shrink(clip) -> float | None:
    """The factor ``clip_grad_norm_`` multiplied the gradients by (1.0: left as they were)."""
    if clip.norm is None or clip.max_norm is None:
        return None
    if not math.isfinite(clip.norm):
        return math.nan
    return min(1.0, clip.max_norm / (clip.norm + 1e-6))


# --- the whole run ---------------------------------------------------------------------------------

def _ended_early(original: Trajectory, migrated: Trajectory, rank: int) -> Difference:
    shorter, longer = (migrated, original) if len(migrated.steps) < len(original.steps) \
        else (original, migrated)
    name = "migrated script" if shorter is migrated else "original"
    other = "original" if shorter is migrated else "migrated script"
    step = len(shorter.steps) + 1
    if shorter.failed:
        return Difference("crash", f"the {name} crashed before this step: {_error_of(shorter)}",
                          step, rank)
    if not shorter.steps:
        return Difference("never-steps", f"the {name} never took an optimizer step (the {other} "
                          f"took {len(longer.steps)})", None, rank)
    return Difference("fewer-steps", f"the {name} ended after {len(shorter.steps)} optimizer "
                      f"steps, the {other} took {len(longer.steps)}", step, rank)


def _parameter_difference(original, migrated, tolerance, rank):
    a = original.end.checksum if original.end else None
    b = migrated.end.checksum if migrated.end else None
    if not a or not b:
        return None
    if a["numel"] != b["numel"]:
        return Difference("parameters", f"the optimizers step {a['numel']} parameter values in "
                          f"the original, {b['numel']} in the migrated script", None, rank)
    if not (tolerance.close(a["sum"], b["sum"], _AGGREGATE_FACTOR * 10)
            and tolerance.close(a["abs"], b["abs"], _AGGREGATE_FACTOR)):
        return Difference("parameters", f"the parameters at the end differ: sum {_fmt(a['sum'])} "
                          f"and |sum| {_fmt(a['abs'])} in the original, {_fmt(b['sum'])} and "
                          f"{_fmt(b['abs'])} in the migrated script", None, rank)
    return None


def _error_of(trajectory: Trajectory) -> str:
    if trajectory.end is None:
        return "the process died without a Python error (killed, or a crash in native code)"
    return trajectory.end.error or "it exited with an error"


def _is_half(dtype: str | None) -> bool:
    return dtype in ("float16", "bfloat16")


def _growth(growth) -> str:
    if growth is None:
        return "is static (never grows)"
    interval, factor = growth
    return f"grows x{factor:g} every {interval} clean steps"


def _passes(count: int) -> str:
    return f"{count} backward pass" + ("" if count == 1 else "es")


def _times(count: int) -> str:
    return {0: "never", 1: "once", 2: "twice"}.get(count, f"{count} times")


def _fmt(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, float) and (value == 0 or 1e-3 <= abs(value) < 1e5):
        return f"{value:.6g}"
    return f"{value:.4g}"
