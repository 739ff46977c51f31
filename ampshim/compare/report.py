"""What ``python -m ampshim compare`` prints: one screen of text, or JSON for CI."""
from __future__ import annotations

import dataclasses
import json
import math

from ampshim.compare.comparison import COULD_NOT_RUN, SAME, Comparison, apex_imports
from ampshim.compare.trajectory import Step, Trajectory
from ampshim.compare.verdict import largest_loss_gap

__all__ = ["as_text", "as_json"]

_ROWS_BEFORE = 4  # steps shown before the one where the runs part


def as_text(result: Comparison) -> str:
    lines = [_header(result)]
    if result.verdict == COULD_NOT_RUN and result.problem:
        lines.append(f"COULD NOT COMPARE: {result.problem}.")
    elif result.verdict == COULD_NOT_RUN:
        side = result.original if result.failed_side == "original" else result.migrated
        name = "original" if result.failed_side == "original" else "migrated script"
        code = "timed out" if side.returncode is None else f"exit code {side.returncode}"
        imports = apex_imports(side) if side is result.migrated else []
        if imports:
            lines.append(f"COULD NOT RUN: the migrated script imports {', '.join(imports)}, "
                         "which it cannot have: the migration is incomplete. Finish it "
                         "(ampmigrate, then the manual steps it lists), or pass --allow-apex to "
                         f"compare a partial migration. It failed ({code}) with:")
        else:
            lines.append(f"COULD NOT RUN: the {name} failed ({code}) before it could be "
                         "compared. Its error:")
        lines.extend("  " + line for line in (side.error_tail or "(nothing on stderr)").splitlines())
    elif result.verdict == SAME:
        lines.append("SAME: " + _same_summary(result))
    else:
        difference = result.difference
        where = f"at step {difference.step}" if difference.step else "over the whole run"
        rank = f" (rank {difference.rank})" if len(result.original.ranks) > 1 else ""
        lines.append(f"DIFFERS {where}{rank}: {difference.message}")
        original = result.original.ranks.get(difference.rank)
        migrated = result.migrated.ranks.get(difference.rank)
        if original and migrated and (original.steps or migrated.steps):
            lines.append("")
            lines.extend(_table(original, migrated, difference.step))
        if difference.cause == "crash":
            lines.append("")
            lines.append("The migrated script's error:")
            lines.extend("  " + line for line in result.migrated.error_tail.splitlines())
    lines.extend(f"note: {note}" for note in result.notes)
    return "\n".join(lines)


def as_json(result: Comparison) -> str:
    def side(run):
        return {
            "target": run.target.label,
            "command": run.command,
            "returncode": run.returncode,
            "seconds": round(run.seconds, 3),
            "error": run.error_tail if run.failed else None,
            "ranks": {str(rank): _trajectory(t) for rank, t in run.ranks.items()},
        }

    document = {
        "verdict": result.verdict,
        "exit_code": result.exit_code,
        "steps_requested": result.steps,
        "tolerance": dataclasses.asdict(result.tolerance),
        "difference": dataclasses.asdict(result.difference) if result.difference else None,
        "failed_side": result.failed_side,
        "problem": result.problem,
        "notes": result.notes,
        "original": side(result.original),
        "migrated": side(result.migrated),
    }
    return json.dumps(_finite(document), indent=2, allow_nan=False)


def _finite(value):
    """Strict JSON for CI's parsers: a NaN or infinite loss becomes "NaN", "Infinity", "-Infinity"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _trajectory(trajectory: Trajectory) -> dict:
    return {
        "steps": [dataclasses.asdict(step) for step in trajectory.steps],
        "end": dataclasses.asdict(trajectory.end) if trajectory.end else None,
        "apex_imports": list(trajectory.apex_imports),
    }


def _header(result: Comparison) -> str:
    def timing(run):
        return "not run" if run.not_run and not run.seconds else f"{run.seconds:.1f} s"

    original, migrated = result.original, result.migrated
    judged = "" if result.verdict == COULD_NOT_RUN else f", rtol {result.tolerance.rtol:g}"
    return (f"ampshim compare: {original.target.label} (apex, on ampshim, {timing(original)}) "
            f"against {migrated.target.label} (native torch.amp, {timing(migrated)}); "
            f"{result.steps} steps{judged}")


def _same_summary(result: Comparison) -> str:
    rank0 = min(result.original.ranks)
    original, migrated = result.original.ranks[rank0], result.migrated.ranks[rank0]
    steps = original.steps
    skipped = sum(not step.taken for step in steps)
    parts = [f"{len(steps)} optimizer steps"
             + (f" ({len(result.original.ranks)} ranks)" if len(result.original.ranks) > 1 else "")
             + (f", where the scripts ended (of the {result.steps} asked for)"
                if len(steps) < result.steps else ""),
             "every step taken" if not skipped else f"{skipped} skipped on overflow in both"]
    gap, where = largest_loss_gap(original, migrated)
    parts.append(f"losses agree (largest relative difference {gap:.2g}"
                 + (f", step {where})" if where and gap else ")"))
    backwards = list(original.all_backwards())
    if backwards:
        scales = sorted({b.scale for b in backwards})
        scale = f"{scales[0]:g}" if len(scales) == 1 else f"{scales[0]:g} to {scales[-1]:g}"
        parts.append(f"loss scale {scale}")
        matmul = sum(b.matmul for b in backwards)
        half = sum(b.half for b in backwards)
        if matmul:
            dtype = original.half_dtype or "half precision"
            parts.append(f"forward {100 * half / matmul:.0f}% of matmul-class ops in {dtype} in both")
    detached = [sum(step.detached[i] for step in steps) for i in (0, 1)]
    if detached[0]:
        parts.append(f"layers run without gradients {100 * detached[1] / detached[0]:.0f}% in half "
                     "precision in both")
    parts.append("parameters agree at the end")
    return "; ".join(parts) + "."


def _table(original: Trajectory, migrated: Trajectory, step: int | None) -> list[str]:
    last = max(len(original.steps), len(migrated.steps))
    stop = min(step or last, last)
    start = max(1, stop - _ROWS_BEFORE)
    header = (f"{'step':>5}  {'loss (original)':>16}  {'loss (migrated)':>16}  "
              f"{'scale':>17}  {'stepped':>13}  {'grad norm':>21}")
    rows = [header]
    for number in range(start, stop + 1):
        a = original.steps[number - 1] if number <= len(original.steps) else None
        b = migrated.steps[number - 1] if number <= len(migrated.steps) else None
        marker = "  <-" if number == step else ""
        rows.append(f"{number:>5}  {_loss(a):>16}  {_loss(b):>16}  "
                    f"{_pair(a, b, _scale):>17}  {_pair(a, b, _taken):>13}  "
                    f"{_pair(a, b, _norm):>21}{marker}")
    return rows


def _loss(step: Step | None) -> str:
    if step is None:
        return "-"
    losses = [b.loss for b in step.backwards if b.loss is not None]
    return f"{losses[-1]:.6g}" if losses else "-"


def _scale(step: Step) -> str:
    return f"{step.backwards[-1].scale:g}" if step.backwards else "-"


def _taken(step: Step) -> str:
    return "yes" if step.taken else "SKIP"


def _norm(step: Step) -> str:
    return "-" if step.grad_norm is None else f"{step.grad_norm:.4g}"


def _pair(a, b, show) -> str:
    return f"{show(a) if a else '-'} / {show(b) if b else '-'}"
