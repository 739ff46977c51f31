"""The model of a file's training steps, and the questions rules ask it.

``StepModel.roots`` holds one ``Steps`` per function (and one for the module's top level) that
makes or calls a step's calls, each with its events in execution order. The queries answer in
terms of those events: which loop is the training loop around an event, whether two events run in
one iteration or never together, whether an event runs only now and then (a logging guard), which
values are the step's tensors.
"""
from __future__ import annotations

import re

from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.flow.control import Graph
from migrate.step_model.build import Assignment, FileFacts
from migrate.step_model.events import Arm, Backward, Event, Kind, Loop, Via
from migrate.step_model import vocabulary as words
from migrate.step_model.values import StepValues, return_target, scope_of
from migrate.tree_walk import descendants

_STEPS = (Kind.STEP, Kind.SCALER_STEP)


def _grouped(items: list, keys) -> dict:
    """Each of ``items`` under each of its ``keys(item)``, once, in order."""
    found: dict = {}
    for item in items:
        for key in dict.fromkeys(keys(item)):
            found.setdefault(key, []).append(item)
    return found


@dataclass
class Steps:
    """The events of one function (``root``), with the file's helpers it calls entered."""

    root: cst.CSTNode
    events: list[Event]
    assignments: list[Assignment]
    entered: bool = False  # another function of the file calls it, and its walk enters it
    entered_by: dict = field(default_factory=dict)  # the call through which the walk entered a helper -> it
    # Answers kept: the rules ask of every event, and a module's top level may hold thousands.
    _memo: dict = field(default_factory=dict, repr=False)

    def _once(self, key, compute):
        """``compute()``, worked out once per ``key``."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def of(self, *kinds: Kind) -> list[Event]:
        """The events of ``kinds``, in order (the same list each time: read it, do not change it)."""
        return self._once(kinds, lambda: [event for event in self.events if event.kind in kinds])

    def index(self, event: Event) -> int:
        return self._once("index", lambda: {id(other): i for i, other in enumerate(self.events)})[id(event)]

    def assigned(self, target: str) -> list[Assignment]:
        """The assignment statements to ``target`` (``state``, ``self.best``), in order: not the
        bindings of loop targets, parameters and returns, which only the step's values follow."""
        written = lambda: _grouped([a for a in self.assignments if a.written], lambda a: a.targets)  # noqa: E731
        return self._once("assigned", written).get(target, [])

    def items_assigned(self, container: str) -> list[tuple[Assignment, str]]:
        """``(assignment, target)`` for each target ``container[...]`` assigned (``state["scaler"]``), in order."""
        def by_container() -> dict:
            found: dict = {}
            for assignment in self.assignments:
                for target in assignment.targets if assignment.written else ():
                    at = target.find("[")
                    while at > 0:  # each prefix a subscript follows: `a[0].b["k"]` is an item of `a` and of `a[0].b`
                        found.setdefault(target[:at], []).append((assignment, target))
                        at = target.find("[", at + 1)
            return found

        return self._once("items", by_container).get(container, [])

    def _within(self, frame) -> list[Event]:
        """The events inside ``frame`` (a loop, an arm, ...)."""
        return self._once("within", lambda: _grouped(self.events, lambda event: event.frames)).get(frame, [])

    def backwards(self) -> list[Event]:
        return self.of(Kind.BACKWARD)

    # where an event runs

    def training_loop(self, event: Event) -> Loop | None:
        """The innermost loop around ``event`` that is a training loop: the innermost loop around a
        backward pass, or around an optimizer step and a backward pass (``for opt in optimizers:
        opt.step()`` is part of the step, not its loop), or else around the step (an epoch loop
        around it is not one: what runs there runs once per epoch)."""
        def loops() -> set:
            found = {e.loops()[-1] for e in self.backwards() if e.loops() and not self._discards_gradients(e.loops()[-1])}
            for step in self.of(*_STEPS):
                around = [loop for loop in step.loops() if self._within(loop) and any(
                    e.kind is Kind.BACKWARD for e in self._within(loop))]
                if around or step.loops():
                    found.add(around[-1] if around else step.loops()[-1])
            return found

        training = self._once("training", loops)
        for loop in reversed(event.loops()):
            if loop in training:
                return loop
        return None

    def _discards_gradients(self, loop: Loop | None) -> bool:
        """Whether ``loop`` (None: the whole function) runs backward passes only to clear their
        gradients, stepping no optimizer (a scan of the largest batches for out-of-memory errors,
        the gradients of an input for a saliency map): no training."""
        inside = self._within(loop) if loop is not None else self.events
        return any(e.kind is Kind.ZERO_GRAD for e in inside) and not any(e.kind in _STEPS for e in inside)

    def backward_loop(self, event: Event) -> Loop | None:
        """The innermost loop around ``event`` that also holds a backward pass (a loop over the
        optimizers inside the step is not one)."""
        for loop in reversed(event.loops()):
            if any(loop in backward.frames for backward in self.backwards()):
                return loop
        return None

    def each_step(self, event: Event) -> tuple[bool, Loop | None]:
        """Whether ``event`` runs in every training step, and the training loop it runs in.

        A function with a backward pass outside any loop is one step (a ``train_step`` method,
        called by a framework or from another file): what runs in it outside loops runs each step.
        """
        if any(isinstance(frame, Via) and frame.evaluates for frame in event.frames):
            return False, None  # in an evaluation helper the loop calls: not the training step
        loop = self.training_loop(event)
        if loop is not None:
            # `for phase in ("train", "val")`: the validation arm runs no backward pass
            trains = any(loop in b.frames and not self.exclusive(b, event) for b in self.of(Kind.BACKWARD, *_STEPS))
            return trains and not self._in_evaluation(event, loop), loop
        # a backward pass at a script's top level outside any loop runs once (a debugging pass)
        if not event.loops() and not isinstance(self.root, cst.Module) and not self.entered and (
                any(not b.loops() for b in self.backwards()) and not self._discards_gradients(None)
                or _is_lightning_step(self.root)):
            return True, None
        return False, None

    def _in_evaluation(self, event: Event, loop: Loop) -> bool:
        """Whether ``event`` is in a loop of its own inside the training loop that runs the model
        and no backward pass: a validation pass, which is not the training step."""
        inner = event.loops()[-1]
        if inner is loop:
            return False

        def evaluates() -> bool:  # asked of each event in the loop: worked out once per loop
            around = self._within(inner)
            return any(e.kind is Kind.FORWARD for e in around) and not any(e.kind is Kind.BACKWARD for e in around)

        return self._once(("evaluation", inner), evaluates)

    def guarded(self, event: Event, loop: Loop | None) -> bool:
        """Whether an ``if`` within the step runs ``event`` only every so often: a test with a ``%``
        (``if step % log_every == 0``, ``if rank == 0 and i % 100 == 0``) or on the time elapsed
        (``if time.time() - last_log > 30``) unless every
        step of the optimizer is in its arm (that is an accumulation boundary: every optimizer step).
        A training loop of its own under such an ``if`` of an outer training loop (a regulariser's
        accumulation loop every 16 iterations) runs now and then too."""
        loops = event.loops()
        outer = loops[loops.index(loop) - 1] if loop in loops and loops.index(loop) > 0 else None
        if outer is not None and self._guarded_in(event.frames[event.frames.index(outer) + 1:event.frames.index(loop)], outer):
            return True
        return self._guarded_in(event.frames_inside(loop), loop)

    def _guarded_in(self, frames, loop: Loop | None) -> bool:
        stepping = [step for step in self.of(*_STEPS) if loop is None or loop in step.frames]
        for frame in frames:
            if not (isinstance(frame, Arm) and frame.interval and (frame.body or frame.leaves)):
                continue
            if self._alternates(frame):
                continue  # `if (step // accum) % 2 == 0:` training one model, `else:` the other
            inside = [step for step in stepping if frame in step.frames]
            # All the steps in the arm: an accumulation boundary, which is every optimizer step.
            # Some outside it too: an extra step now and then (a regulariser every 16 iterations).
            if not inside or len(inside) < len(stepping):
                return True
        return False

    def _alternates(self, arm: Arm) -> bool:
        """Whether ``arm`` takes turns at training with the rest of its ``if``: it runs a whole step
        (a backward pass and an optimizer step), and so does another arm of it, or its test
        is every other pass (``% 2``). A logging guard holds no step of its own."""
        def whole_step(node: cst.If, body: bool | None) -> bool:
            frames = [frame for frame in self._arms_of(node) if body is None or frame.body == body]
            return any(frame in e.frames for frame in frames for e in self.backwards()) and \
                any(frame in e.frames for frame in frames for e in self.of(*_STEPS))

        if not whole_step(arm.node, arm.body):
            return False
        return whole_step(arm.node, not arm.body) or "% 2" in nodes.code(arm.node.test).replace("%2", "% 2")

    def _arms_of(self, node: cst.If) -> list[Arm]:
        return self._once(("arms", id(node)), lambda: list(dict.fromkeys(
            frame for event in self.events for frame in event.frames if isinstance(frame, Arm) and frame.node is node)))

    @staticmethod
    def scaled_apart(step: Event, backward: Event) -> bool:
        """Whether ``step`` never runs where ``backward``'s loss was scaled: it sits in the other arm
        of a test that decided the scaling (``if scaler is None: optimizer.step()``), or where the
        scaler is not there (``else:`` of ``if getattr(self, "scaler", None) is not None:``): a
        backward scaled by it would have raised."""
        scaler = re.sub(r"^self\.", "", backward.scaler) if backward.scaler else None
        return any(a.test == b.test and a.polarity != b.polarity and not a.modulo
                   for a in step.arms() for b in backward.detail.get("scaled_under", ())) or any(
            a.test == scaler and not a.polarity for a in step.arms())

    @staticmethod
    def exclusive(first: Event, second: Event) -> bool:
        """Whether the two never run in one pass: they sit in different arms of one ``if``, or in
        opposite arms of two ``if`` statements on the same flag (``if scaler:`` ... ``if scaler is None:``),
        or one sits where a conjunction fails (``else:`` of ``if not loss_scaler and use_apex:``)
        and every part of it holds around the other (``elif use_apex:`` of ``if loss_scaler:``)."""
        for a in first.arms():
            for b in second.arms():
                if a.node is b.node and a.body != b.body:
                    return True
                if a.node is not b.node and a.test == b.test and a.polarity != b.polarity and not a.modulo:
                    return True
        return _conjunction_fails(first, second) or _conjunction_fails(second, first) or _contradicted(first, second)

    @staticmethod
    def runs_whenever(event: Event, *given: Event) -> bool:
        """Whether ``event`` runs in every pass that runs all of ``given``: each ``if`` arm around it
        is around one of them, or tests the same flag the same way (``if args.fp16:`` twice). A
        backward pass whose loss was scaled under an ``if`` (``if scaler is not None: loss =
        scaler.scale(loss)``) counts, as a scaled one, as running under that arm too."""
        known = [arm for other in given for arm in (*other.arms(), *other.detail.get("scaled_under", ()))]
        return all(arm in known or any(a.test == arm.test and a.polarity == arm.polarity and not a.modulo for a in known)
                   or (arm.body and any(a.body and a.test in words.joined_by(arm.node.test, cst.Or) for a in known))
                   for arm in event.arms())

    def same_iteration(self, first: Event, second: Event) -> bool:
        """Whether ``second`` runs in the pass of the training loop (or step function) that runs ``first``."""
        running, loop = self.each_step(first)
        if not running:
            return False
        return loop is None or loop in second.frames

    def before(self, event: Event, kinds: tuple[Kind, ...]) -> list[Event]:
        """The events of ``kinds`` earlier in the same pass that can run with ``event``."""
        return self._in_pass(event, kinds, self.events[:self.index(event)])

    def after(self, event: Event, kinds: tuple[Kind, ...]) -> list[Event]:
        return self._in_pass(event, kinds, self.events[self.index(event) + 1:])

    def _in_pass(self, event: Event, kinds: tuple[Kind, ...], others: list[Event]) -> list[Event]:
        """Those of ``others`` of ``kinds`` that run in ``event``'s pass (``same_iteration``) and can run with it."""
        running, loop = self.each_step(event)
        if not running:
            return []
        return [other for other in others if other.kind in kinds and (loop is None or loop in other.frames)
                and not self.exclusive(event, other) and not self._ended_apart(event, other)]

    def _ended_apart(self, event: Event, other: Event) -> bool:
        """Whether the function's control flow never runs the two in one iteration of the loop
        around both (or one call): an arm that ends the iteration first (``if warmup:
        loss.backward(); opt.step(); continue``) and what follows it. Events in helpers are not judged."""
        if event.inlined() or other.inlined() or not event.statements or not other.statements:
            return False
        graph = self._once(("graph", True), lambda: Graph(self.root, exceptions=True))
        a, b = event.statements[-1], other.statements[-1]
        if a is b or not (graph.holds(a) and graph.holds(b)):
            return False
        within = graph.shared_loop(a, b)
        return not graph.can_reach(a, b, within) and not graph.can_reach(b, a, within)

    def straight_path(self, event: Event, later: Event) -> list[cst.BaseStatement] | None:
        """The statements of one block from the one holding ``event`` up to the one holding
        ``later`` (not included), where ``later`` sits in that block after it; both walked from
        this function, not reached through a helper. None otherwise. Whether every way through
        them reaches ``later`` is ``always_follows``'s question."""
        if event.inlined() or later.inlined() or not later.statements:
            return None
        depth = len(later.statements) - 1
        if len(event.statements) <= depth or event.statements[:depth] != later.statements[:depth]:
            return None
        block = self._block(later.statements[:depth])
        first, target = event.statements[depth], later.statements[depth]
        if block is None or first not in block or target not in block or block.index(first) >= block.index(target):
            return None
        return block[block.index(first):block.index(target)]

    def always_follows(self, event: Event, later: Event, *, or_else: tuple[Event, ...] = (), exceptions: bool = True) -> bool:
        """Whether every pass that runs ``event`` goes on to run ``later`` (or one of ``or_else``)
        in the same iteration of the training loop (or call of a step function): a straight
        path leads from the one to the block of the other (``straight_path``), and every way on
        from there, through the function's control flow (``flow.control``), reaches one of them
        before the iteration ends. With ``exceptions``, a statement in a ``try`` body may raise
        to a handler within the iteration, which lets the loop go on without them."""
        path = self.straight_path(event, later)
        if path is None:
            return False
        graph = self._once(("graph", exceptions), lambda: Graph(self.root, exceptions=exceptions))
        loop = self.training_loop(later)
        targets = [e.statements[-1] for e in (later, *or_else) if e.statements and not e.inlined() and graph.holds(e.statements[-1])]
        if not (graph.holds(path[0]) and targets and targets[0] is later.statements[-1]):
            return False
        return graph.always_reaches(path[0], targets, loop.node if loop is not None else None)

    def _block(self, outer: tuple) -> list | None:
        owner = outer[-1] if outer else self.root
        body = getattr(owner, "body", None)
        if isinstance(body, cst.IndentedBlock):
            return list(body.body)
        if isinstance(owner, cst.Module):
            return list(owner.body)
        return None

    def function_of(self, frames: tuple) -> cst.CSTNode:
        """The function a walk's record with ``frames`` stands in: the helper the last call among
        them entered, else the root."""
        calls = [frame.node for frame in frames if type(frame) is Via]
        return self.entered_by.get(id(calls[-1]), self.root) if calls else self.root

    def graph_of(self, frames: tuple) -> Graph:
        """The control-flow graph of ``function_of(frames)``, built once."""
        function = self.function_of(frames)
        return self._once(("graph of", id(function)), lambda: Graph(function))

    # values

    def values(self, models: set[str], *, through_calls: bool = True) -> StepValues:
        """Which values are the step's tensors (``StepValues``), given the file's models."""
        seeds = [(backward.detail["loss"], scope_of(backward.frames)) for backward in self.backwards()
                 if backward.detail.get("loss") is not None]
        if _is_lightning_step(self.root):  # what it returns is the loss Lightning runs backward on
            returned = [node.value for node in descendants(self.root.body, nodes.not_a_definition)
                        if type(node) is cst.Return and node.value is not None]
            seeds += [(value, None) for value in returned]
            # `return self.common_step(batch)`: what that helper returns, in its own scope
            targets = {return_target(value) for value in returned if type(value) is cst.Call}
            seeds += [(a.value, scope_of(a.frames)) for a in self.assignments if a.targets[0] in targets]
        return self._once(("values", through_calls),
                          lambda: StepValues(self.assignments, seeds, models, through_calls=through_calls,
                                             graph_of=self.graph_of))


def _conjunction_fails(one: Event, other: Event) -> bool:
    """Whether ``one`` sits in the ``else`` arm of an ``if a and b:`` whose every part holds where
    ``other`` runs (``_holds_where``); of an ``if a and b or c and d:``, every part of one side."""
    holds = _holds_where(other)
    for arm in one.arms():
        if arm.body or arm.modulo:
            continue
        sides = [words.conjuncts(side) for side in _alternatives(arm.node.test)]
        if any(all(part in holds for part in parts) for parts in sides if len(sides) > 1 or len(parts) > 1):
            return True
    return False


def _alternatives(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The conditions ``test`` joins with ``or``: ``[a and b, c]`` for ``(a and b) or c``."""
    inner = test.with_changes(lpar=(), rpar=()) if getattr(test, "lpar", None) else test
    if isinstance(inner, cst.BooleanOperation) and isinstance(inner.operator, cst.Or):
        return _alternatives(inner.left) + _alternatives(inner.right)
    return [test]


def scaler_off_where(module: cst.Module, scaler: str, event: Event) -> bool:
    """Whether ``scaler`` is disabled wherever ``event`` runs: each assignment of it in the file
    makes a GradScaler whose ``enabled=`` is a flag, or a conjunction holding one, that fails
    there (``else:`` of ``if args.fp16:`` beside ``enabled=args.fp16 and level != "O0"``). A
    disabled scaler's ``scale(loss)`` is the loss itself: the gradients there are true ones."""
    made = [node.value for node in descendants(module) if type(node) is cst.Assign and type(node.value) is cst.Call
            and any(nodes.code(target.target) == scaler for target in node.targets)]
    holds = _holds_where(event)
    return bool(made) and all(_disabled_where(call, holds) for call in made)


def _disabled_where(made: cst.Call, holds: set[tuple[str, bool]]) -> bool:
    enabled = nodes.argument(made, None, "enabled") if nodes.code(made.func).endswith("GradScaler") else None
    return enabled is not None and any((test, not polarity) in holds for test, polarity in _flags_needed(enabled.value))


def _flags_needed(value: cst.BaseExpression) -> list[tuple[str, bool]]:
    """``words.conjuncts`` of ``value``, each part taken out of ``bool(...)`` (``enabled=bool(args.fp16)
    and args.level != "O0"``)."""
    inner = value.with_changes(lpar=(), rpar=()) if getattr(value, "lpar", None) else value
    if type(inner) is cst.Call and nodes.code(inner.func) == "bool" and len(inner.args) == 1:
        return _flags_needed(inner.args[0].value)
    if isinstance(inner, cst.BooleanOperation) and isinstance(inner.operator, cst.And):
        return _flags_needed(inner.left) + _flags_needed(inner.right)
    return [words.normalised_test(value)]


def _holds_where(event: Event) -> set[tuple[str, bool]]:
    """The tests, with their polarity, that hold wherever ``event`` runs: its arms, and each part
    of the conjunctions whose body it is in (``if scaler is not None and use_amp:``)."""
    holds = {(arm.test, arm.polarity) for arm in event.arms() if not arm.modulo}
    return holds | {part for arm in event.arms() if arm.body and not arm.modulo for part in words.conjuncts(arm.node.test)}


def _contradicted(one: Event, other: Event) -> bool:
    """Whether a test holds where ``one`` runs and fails where ``other`` runs (``else:`` of ``if
    use_amp:`` against the body of ``if scaler is not None and use_amp:``)."""
    return any((test, not polarity) in _holds_where(other) for test, polarity in _holds_where(one))


def _is_lightning_step(root: cst.CSTNode) -> bool:
    """A LightningModule's ``training_step`` (automatic optimisation): Lightning runs the backward
    pass and the step after it returns, once per batch."""
    return type(root) is cst.FunctionDef and root.name.value == "training_step"


class StepModel(NamedTuple):
    module: cst.Module
    facts: FileFacts
    roots: list[Steps]

    def each(self, *kinds: Kind) -> Iterator[tuple[Steps, Event]]:
        for steps in self.roots:
            for event in steps.of(*kinds):
                yield steps, event

    def all_events(self, *kinds: Kind) -> list[Event]:
        return [event for _, event in self.each(*kinds)]

    def scaled(self) -> bool:
        return any(e.how is Backward.SCALED for e in self.all_events(Kind.BACKWARD))
