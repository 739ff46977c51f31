"""A recorded run, read back: the steps one process took (see :mod:`.recorder` for the events)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Backward", "Clip", "Step", "End", "Trajectory", "read_trajectory", "read_ranks"]


@dataclass(frozen=True)
class Backward:
    """One backward pass and the forward before it."""

    loss: float | None
    dtype: str | None  # of the loss
    scale: float
    growth: tuple | None  # (interval, factor) of a growing loss scale; None when it never grows
    via: str  # amp.scale_loss, GradScaler, FP16_Optimizer.backward or plain
    matmul: int  # matmul-class ops of the forward, with gradients on
    half: int  # of which in half precision
    half_dtype: str | None

    @property
    def half_share(self) -> float | None:
        return self.half / self.matmul if self.matmul else None


@dataclass(frozen=True)
class Clip:
    max_norm: float | None
    norm: float | None


@dataclass(frozen=True)
class Step:
    """One optimizer step the script asked for, with the passes that led to it."""

    number: int
    optimizer: int  # which optimizer, in the order they first stepped
    name: str
    taken: bool  # False: skipped on overflow
    grad_norm: float | None
    backwards: tuple[Backward, ...]
    clips: tuple[Clip, ...]
    detached: tuple[int, int] = (0, 0)  # matmul-class layers run without gradients since the step before, in half

    @property
    def detached_share(self) -> float | None:
        return self.detached[1] / self.detached[0] if self.detached[0] else None


@dataclass(frozen=True)
class End:
    reason: str  # steps (stopped after --steps), exit, error
    error: str | None
    checksum: dict | None


@dataclass(frozen=True)
class Trajectory:
    steps: tuple[Step, ...] = ()
    end: End | None = None  # None: the process died without a word (killed, a crash in C++)
    apex_imports: tuple[str, ...] = ()
    backwards_after: tuple[Backward, ...] = ()  # passes after the last step

    @property
    def trained(self) -> bool:
        """Did it get as far as a backward pass?"""
        return bool(self.steps or self.backwards_after)

    @property
    def failed(self) -> bool:
        return self.end is None or self.end.reason == "error"

    @property
    def half_dtype(self) -> str | None:
        for backward in self.all_backwards():
            if backward.half_dtype:
                return backward.half_dtype
        return None

    def all_backwards(self):
        for step in self.steps:
            yield from step.backwards
        yield from self.backwards_after


def read_trajectory(path: Path) -> Trajectory:
    """Read one process's JSON lines (a line cut short by a crash is ignored)."""
    steps, backwards, clips, apex_imports = [], [], [], []
    end = None
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        kind = event.get("e")
        if kind == "backward":
            growth = event.get("growth")
            backwards.append(Backward(
                loss=event["loss"], dtype=event["dtype"], scale=event["scale"],
                growth=tuple(growth) if growth else None, via=event["via"],
                matmul=event["matmul"], half=event["half"], half_dtype=event.get("half_dtype")))
        elif kind == "clip":
            clips.append(Clip(event["max_norm"], event["norm"]))
        elif kind == "step":
            steps.append(Step(number=event["n"], optimizer=event["optimizer"], name=event["name"],
                              taken=event["taken"], grad_norm=event["grad_norm"],
                              backwards=tuple(backwards), clips=tuple(clips),
                              detached=tuple(event.get("detached") or (0, 0))))
            backwards, clips = [], []
        elif kind == "apex_import":
            apex_imports.append(event["name"])
        elif kind == "end":
            end = End(event["reason"], event.get("error"), event.get("checksum"))
    return Trajectory(tuple(steps), end, tuple(apex_imports), tuple(backwards))


def read_ranks(folder: Path) -> dict[int, Trajectory]:
    """Every rank's trajectory in ``folder`` (``rank<N>.jsonl``), by rank."""
    ranks = {}
    for path in Path(folder).glob("rank*.jsonl"):
        match = re.fullmatch(r"rank(\d+)\.jsonl", path.name)
        if match:
            ranks[int(match.group(1))] = read_trajectory(path)
    return dict(sorted(ranks.items()))
