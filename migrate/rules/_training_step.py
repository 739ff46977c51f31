"""The base of the lint rules on training steps (AMP100-AMP109): they query the step model."""
from __future__ import annotations

import re
from typing import Iterator

import libcst as cst
from libcst.metadata import PositionProvider, QualifiedNameProvider, ScopeProvider

from migrate import apex_nodes as nodes
from migrate.rule import Rule
from migrate.flow.reaching import reaching
from migrate.step_model import Arm, Event, Loop, StepModel, StepModelProvider, Steps, Via, model_of
from migrate.step_model import vocabulary as words
from migrate.tree_walk import descendants


class TrainingStepRule(Rule):
    """Subclass this and define ``findings(model)``, yielding ``(node, message or None, fix kwargs)``.

    One node is reported once, however many functions' walks reach it (a helper entered from
    two loops), in the order the walks first meet it.
    """

    TRIGGERS = ("GradScaler", "autocast", "scaler")
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ScopeProvider, StepModelProvider)

    def visit_Module(self, node: cst.Module) -> bool:
        seen: set[int] = set()
        for found, message, fix in self.findings(model_of(self, node)):
            if id(found) not in seen:
                seen.add(id(found))
                self.report(found, message, **fix)
        return False

    def findings(self, model: StepModel) -> Iterator[tuple[cst.CSTNode, str | None, dict]]:
        raise NotImplementedError


def made_each_iteration(steps: Steps, created: Event) -> bool:
    """Whether the GradScaler made at ``created`` is made again in a loop that runs backward
    passes (AMP105): in the training loop, an epoch loop around it, or a helper called there. A
    function that runs a whole training (its own loop over epochs) may make its own."""
    if made_only_when_a_call_says_not(steps, created):
        return False
    loops = set(created.loops())
    trained = [backward for backward in steps.backwards() if loops & set(backward.loops())]
    return bool(trained) and not any(_whole_run(steps, created, backward) for backward in trained) \
        and not _rebuilds_the_trainer(steps, created)


def made_only_when_a_call_says_not(steps: Steps, created: Event) -> bool:
    """Whether the walk reaches ``created`` through a call whose literal argument turns the test
    of an ``if`` around it false: ``self._wrap_model(model, training=False)`` from evaluation,
    where the helper makes its scaler under ``if self.use_apex and training:``. The parameter must
    hold what the call gave it where the test reads it (``flow.reaching``: no binding of its own)."""
    frames = created.frames
    for index, arm in enumerate(frames):
        if type(arm) is not Arm or not arm.body:
            continue
        calls = [frame for frame in frames[:index] if type(frame) is Via]
        if not calls or nodes.has_star(calls[-1].node):
            continue
        function = steps.function_of(frames[:index])
        if not isinstance(function, cst.FunctionDef):
            continue
        params = [param for param in function.params.params]
        skip = 1 if params and params[0].name.value in ("self", "cls") and isinstance(calls[-1].node.func, cst.Attribute) else 0
        for conjunct in _conjuncts(arm.node.test):
            negated = isinstance(conjunct, cst.UnaryOperation) and isinstance(conjunct.operator, cst.Not)
            name = conjunct.expression if negated else conjunct
            if not isinstance(name, cst.Name) or name.value not in [param.name.value for param in params]:
                continue
            position = [param.name.value for param in params].index(name.value)
            given = nodes.argument(calls[-1].node, position - skip, name.value)
            value = given.value if given is not None else params[position].default
            truth = _literal_truth(value)
            if truth is None or truth != negated:
                continue
            graph = steps.graph_of(frames[:index])
            if not graph.holds(arm.node):
                continue
            reached = reaching(graph, name.value, arm.node)
            if reached.from_outside and not reached.bindings:
                return True
    return False


def _conjuncts(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """``a and b and c`` as its parts (parentheses dropped); any other test as itself."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _conjuncts(test.left) + _conjuncts(test.right)
    return [test]


def _literal_truth(value: cst.BaseExpression | None) -> bool | None:
    """The truth of a literal (``False``, ``None``, ``0``, ``True``, ``1``); None for anything else."""
    if isinstance(value, cst.Name) and value.value in ("True", "False", "None"):
        return value.value == "True"
    if isinstance(value, cst.Integer):
        return value.value != "0"
    return None


def _rebuilds_the_trainer(steps: Steps, created: Event) -> bool:
    """Whether the scaler is made by a helper that rebuilds the training state with it: its call
    binds an optimizer too (``model, optimizer, loss_scaler, loader = build_trainer(cfg)`` when
    a schedule changes the model): a new optimizer rightly starts a new scaler."""
    calls = {id(frame.node) for frame in created.frames if isinstance(frame, Via)}
    return any(a.written and id(a.value) in calls and any(words.optimizer_like(t) for t in a.targets)
               for a in steps.assignments)


def _whole_run(steps: Steps, created: Event, backward: Event) -> bool:
    """Whether the scaler is made for a whole training (its own loop over epochs) run once per
    trial of a search: in a function the search calls, or in the search's loop before the epoch
    loop (``for trial in range(n): model = ...; scaler = GradScaler(); for epoch in ...``). Each
    run rightly starts a new scaler."""
    calls = [frame for frame in created.frames if isinstance(frame, Via)]
    if calls and calls[-1] in backward.frames:
        start = backward.frames.index(calls[-1]) + 1
    elif not calls and created.loops() and created.loops()[-1] in backward.frames:
        start = backward.frames.index(created.loops()[-1]) + 1
    else:
        return False
    return any(isinstance(frame, Loop) and _over_epochs(frame.node, steps.function_of(backward.frames[:index]))
               for index, frame in enumerate(backward.frames[start:], start))


# A count within one epoch: `range(total_it_each_epoch)`, `iters_per_epoch`, `epoch_length`.
_WITHIN_AN_EPOCH = re.compile(r"(each|per)_?epoch|epoch_?(len|length|size|iters?|steps?)", re.IGNORECASE)


def _over_epochs(loop: cst.For | cst.While, function: cst.CSTNode) -> bool:
    """A loop over epochs: its head says so, or the name it iterates is bound to what does
    (``train_iterator = trange(start, args.num_train_epochs)``, then ``for _ in train_iterator:``)."""
    head = [loop.target, loop.iter] if isinstance(loop, cst.For) else [loop.test]
    if isinstance(loop, cst.For) and type(loop.iter) is cst.Name:
        head += [node.value for node in descendants(function) if type(node) is cst.Assign and len(node.targets) == 1
                 and type(node.targets[0].target) is cst.Name and node.targets[0].target.value == loop.iter.value]
    return any("epoch" in nodes.code(part).lower() and not _WITHIN_AN_EPOCH.search(nodes.code(part)) for part in head)


# A complete, correct native loop: periodic logging, clipping after unscale_, a full checkpoint.
# Every rule of the family lists it as VALID: none may report on it.
CORRECT_LOOP = '''\
import torch
from torch.amp import GradScaler, autocast


def train(model, optimizer, loader, epochs, log_every=100, device="cuda"):
    scaler = GradScaler(device)
    for epoch in range(epochs):
        running = torch.zeros((), device=device)
        for step, (inputs, targets) in enumerate(loader):
            inputs, targets = inputs.to(device), targets.to(device)
            with autocast(device):
                outputs = model(inputs)
                loss = torch.nn.functional.cross_entropy(outputs, targets)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            running += loss.detach()
            if step % log_every == 0:
                print(f"epoch {epoch} step {step} loss {running.item() / (step + 1):.4f} grad {grad_norm.item():.2f}")
        print(f"epoch {epoch} mean loss {running.item() / len(loader):.4f}")
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()},
            f"checkpoint-{epoch}.pt",
        )
'''

# The same, as a trainer class with its step in helper methods and logging on rank 0 every n steps.
CORRECT_TRAINER = '''\
import torch


class Trainer:
    def __init__(self, model, optimizer, rank=0, log_every=50):
        self.model = model
        self.optimizer = optimizer
        self.rank = rank
        self.log_every = log_every
        self.scaler = torch.amp.GradScaler("cuda")
        self.global_step = 0

    def fit(self, loader, max_steps):
        iterator = iter(loader)
        while self.global_step < max_steps:
            batch = next(iterator)
            loss = self.training_step(batch)
            self.optimizer_step()
            self.global_step += 1
            if self.rank == 0 and self.global_step % self.log_every == 0:
                print(f"step {self.global_step}: loss {loss.item():.4f}")
        self.save("last.pt")

    def training_step(self, batch):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = self.model(**batch).loss
        self.scaler.scale(loss).backward()
        return loss.detach()

    def optimizer_step(self):
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()

    def save(self, path):
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        state["scaler"] = self.scaler.state_dict()
        torch.save(state, path)
'''
