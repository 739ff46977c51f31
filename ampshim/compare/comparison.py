"""``compare()``: run an original apex script and its migration, and judge the two runs."""
from __future__ import annotations

from dataclasses import dataclass, field

from ampshim.compare.runner import SideRun, Target, run_sides
from ampshim.compare.verdict import Difference, Tolerance, first_difference, tolerance_for

__all__ = ["Comparison", "compare", "apex_imports", "SAME", "DIFFERS", "COULD_NOT_RUN"]

SAME, DIFFERS, COULD_NOT_RUN = "same", "differs", "could not run"
_EXIT_CODES = {SAME: 0, DIFFERS: 1, COULD_NOT_RUN: 2}

_NO_STEPS = ("neither script took an optimizer step, so there is nothing to compare: compare "
             "follows training through optimizer.step() / scaler.step(optimizer)")

# torch's words when autocast("cuda") meets a machine without CUDA: it then runs in float32.
_CUDA_AUTOCAST_DISABLED = "CUDA is not available"


@dataclass
class Comparison:
    """The verdict on two runs, with everything that led to it."""

    verdict: str
    original: SideRun
    migrated: SideRun
    tolerance: Tolerance
    steps: int
    difference: Difference | None = None
    failed_side: str | None = None  # "original" or "migrated" when it could not run
    problem: str | None = None  # why they could not be compared, when neither failed
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return _EXIT_CODES[self.verdict]


def compare(original: Target, migrated: Target, args: list[str] = (), *, steps: int = 20,
            seed: int = 0, device: str | None = None, rtol: float | None = None,
            allow_apex: bool = False, nproc_per_node: int = 1, parallel: bool = False,
            record_dir: str | None = None, timeout: float | None = None,
            fork: bool = False) -> Comparison:
    """Run ``original`` on ampshim and ``migrated`` on native torch.amp, and compare them.

    Example::

        result = compare(Target("train.py"), Target("migrated/train.py"), ["--epochs", "1"],
                         device="cpu")
        if result.verdict != "same":
            print(result.difference.step, result.difference.message)

    Args:
        original, migrated (Target): the two scripts (or modules).
        args (list of str): the command-line arguments both get.
        steps (int, optional, default=20): optimizer steps after which both are stopped.
        seed (int, optional, default=0): seed of torch, ``random`` and numpy in both.
        device (str, optional, default=None): ``"cpu"`` runs CUDA scripts on the CPU.
        rtol (float, optional, default=None): tolerance on losses; by default by precision.
        allow_apex (bool, optional, default=False): serve apex to the migrated script too.
        nproc_per_node (int, optional, default=1): ranks, launched by ``torchrun``.
        parallel (bool, optional, default=False): run the two sides at the same time.
        record_dir (str, optional, default=None): keep the records and outputs there.
        timeout (float, optional, default=None): seconds each side may run.
        fork (bool, optional, default=False): run each side in a fork of this process, which
            imports torch once for all of them: for many small scripts. One rank, script paths.
    """
    before, after = run_sides(original, migrated, list(args), steps=steps, seed=seed,
                              device=device, allow_apex=allow_apex,
                              nproc_per_node=nproc_per_node, parallel=parallel,
                              record_dir=record_dir, timeout=timeout, fork=fork)
    half_dtype = next((t.half_dtype for t in before.ranks.values() if t.half_dtype), None)
    tolerance = tolerance_for(half_dtype, rtol)
    result = Comparison(SAME, before, after, tolerance, steps)
    result.notes = _notes(after, device)
    if before.failed:
        result.verdict, result.failed_side = COULD_NOT_RUN, "original"
    elif after.failed_before_training:
        result.verdict, result.failed_side = COULD_NOT_RUN, "migrated"
    elif not any(t.steps for run in (before, after) for t in run.ranks.values()):
        result.verdict = COULD_NOT_RUN
        result.problem = _NO_STEPS
    else:
        result.difference = _first_difference(before, after, tolerance)
        if result.difference is not None:
            result.verdict = DIFFERS
    return result


def _first_difference(before: SideRun, after: SideRun, tolerance: Tolerance):
    if set(before.ranks) != set(after.ranks):
        return Difference("ranks", f"the original recorded ranks {sorted(before.ranks)}, the "
                          f"migrated script {sorted(after.ranks)}")
    found = [first_difference(before.ranks[rank], after.ranks[rank], tolerance, rank=rank)
             for rank in before.ranks]
    found = [difference for difference in found if difference is not None]
    if not found:
        return None
    return min(found, key=lambda d: (d.step if d.step is not None else float("inf"), d.rank))


def apex_imports(run: SideRun) -> list[str]:
    """The apex modules the side tried to import while apex was refused to it."""
    return sorted({name for trajectory in run.ranks.values() for name in trajectory.apex_imports})


def _notes(migrated: SideRun, device: str | None) -> list[str]:
    notes = []
    imports = apex_imports(migrated)
    if imports and not migrated.failed:
        notes.append(f"the migrated script tried to import {', '.join(imports)} and went on "
                     "without it")
    if device is None and _CUDA_AUTOCAST_DISABLED in migrated.stderr:
        notes.append("this machine has no CUDA, so the migrated script's CUDA autocast was "
                     "disabled (float32): pass --device cpu to run CUDA scripts on the CPU")
    return notes
