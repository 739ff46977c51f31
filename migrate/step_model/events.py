"""What the model records: events of a training step, and where each one runs.

An event's ``frames`` are the constructs around it, outermost first: the loops, the arms of the
``if`` statements, the ``with`` blocks, the ``try`` bodies and the calls of the file's own helpers
through which the walk reached it. Two events share an iteration when they sit in one loop; an
event is guarded when an ``if`` inside that loop decides whether it runs.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

import libcst as cst

from migrate import apex_nodes as nodes


class Kind(str, enum.Enum):
    FORWARD = "model call"
    LOSS = "loss binding"
    BACKWARD = "backward"
    UNSCALE = "unscale_"
    GRAD_READ = "gradient reader"
    STEP = "optimizer step"
    SCALER_STEP = "scaler step"
    UPDATE = "scaler update"
    ZERO_GRAD = "zero_grad"
    SAVE = "checkpoint save"
    LOAD = "checkpoint load"
    AUTOCAST = "autocast"
    SCALER_NEW = "GradScaler created"
    HOST_PULL = "tensor pulled to the host"
    HALF = "cast to float16"
    BACKWARD_ELSEWHERE = "backward in a helper of another file"  # seen by AMP104 only: not a step of this file's


class Backward(str, enum.Enum):
    """How a backward pass treats the loss."""

    SCALED = "scaled"  # scaler.scale(loss).backward()
    PLAIN = "plain"  # loss.backward()
    MANAGED = "managed"  # accelerator.backward(loss), apex's scaled_loss: scaled elsewhere, or not ours to judge


class Loop(NamedTuple):
    node: cst.For | cst.While


class Arm(NamedTuple):
    """One arm of an ``if``; ``test`` is its condition normalised (``not x`` and ``x is None`` are
    ``x`` with the other ``polarity``), so two ``if`` statements on one flag pair up."""

    node: cst.If
    body: bool  # the ``if`` arm (True) or the ``else``/``elif`` arm (False)
    test: str
    polarity: bool
    modulo: bool  # the test holds a ``%``: ``if step % log_every == 0``
    timed: bool = False  # the test compares the time elapsed: ``if now - last_log >= 30``
    leaves: bool = False  # the arm ends the step (raise, exit, return): it runs once at most
    once: bool = False  # the test holds on one step of a count: ``if global_step == 0``

    @property
    def interval(self) -> bool:
        """Whether the arm runs now and then: every n steps, every n seconds, or once."""
        return self.modulo or self.timed or self.leaves or self.once


class Region(NamedTuple):
    """A ``with`` item that is an autocast region; ``dtype`` is ``"float16"``, ``"bfloat16"`` or None
    when not known; ``enabled`` is False for ``autocast(enabled=False)``, None when computed."""

    node: cst.With
    dtype: str | None
    enabled: bool | None


class Handler(NamedTuple):
    node: cst.CSTNode  # a Try (its body) or an except/finally arm


class Via(NamedTuple):
    """A call of one of the file's own functions or methods, whose body the walk entered;
    ``evaluates``: the function evaluates (``@torch.no_grad()``, or it puts a model in ``eval()``)."""

    node: cst.Call
    evaluates: bool = False


Frame = "Loop | Arm | Region | Handler | Via"


@dataclass(frozen=True)
class Event:
    """One event of a step: ``node`` is what a finding points at.

    ``subject`` is what the event acts on, as source text: the loss of a backward, the optimizer
    of a step, the tensor pulled to the host, the model cast. ``scaler`` is the GradScaler, for
    events that have one. ``statements`` holds the statements around the event, outermost first,
    up to the one that holds it, in the function the walk started from or in the helper entered.
    """

    kind: Kind
    node: cst.CSTNode
    frames: tuple = ()
    statements: tuple[cst.CSTNode, ...] = ()
    subject: str | None = None
    scaler: str | None = None
    how: Backward | None = None
    detail: dict = field(default_factory=dict, compare=False, hash=False)

    def loops(self) -> tuple[Loop, ...]:
        return tuple(frame for frame in self.frames if isinstance(frame, Loop))

    def regions(self) -> tuple[Region, ...]:
        return tuple(frame for frame in self.frames if isinstance(frame, Region))

    def arms(self) -> tuple[Arm, ...]:
        return tuple(frame for frame in self.frames if isinstance(frame, Arm))

    def inlined(self) -> bool:
        return any(isinstance(frame, Via) for frame in self.frames)

    def bound(self) -> set[str]:
        """What the statement holding the event binds (``self.model`` for ``self.model = model.half()``)."""
        statement = self.statements[-1] if self.statements else None
        if not isinstance(statement, cst.SimpleStatementLine):
            return set()
        return {text for small in statement.body if isinstance(small, (cst.Assign, cst.AnnAssign))
                for target in (small.targets if isinstance(small, cst.Assign) else [small])
                for text in nodes.bound_texts(target.target)}

    def frames_inside(self, loop: Loop | None) -> tuple:
        """The frames within ``loop`` (all of them when None)."""
        if loop is None:
            return self.frames
        return self.frames[self.frames.index(loop) + 1:]

