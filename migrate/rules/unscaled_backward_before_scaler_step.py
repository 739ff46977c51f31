"""AMP109: a plain ``loss.backward()`` followed by ``scaler.step(optimizer)``."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._training_step import CORRECT_LOOP, CORRECT_TRAINER, TrainingStepRule
from migrate.step_model import Backward, Kind
from migrate.types import FixSafety, Safety


class UnscaledBackwardBeforeScalerStep(TrainingStepRule):
    """What it does:
    Reports ``loss.backward()`` when the step that follows it is ``scaler.step(optimizer)`` and no
    backward pass on a path to that step scales its loss (``if amp: scaler.scale(loss).backward()
    else: loss.backward()`` before an unconditional ``scaler.step`` is left alone: a disabled
    scaler's ``step`` is a plain step). A loss that is the function's own parameter
    (``def _backward(self, loss)``) may come scaled from its callers and is left alone; one handed
    in scaled by a caller in the file (``self._backward(self.scaler.scale(loss))``) is scaled.

    Why is this bad?
    ``scaler.step`` divides the gradients by the scale before stepping. Gradients that were never
    multiplied by it come out 65,536 times too small at the start, and the inf/NaN checks guard
    values that were never at risk.

    Fix safety:
    Unsafe: ``loss.backward()`` becomes ``scaler.scale(loss).backward()``, which changes every
    update (that is its point).
    """

    CODE = "AMP109"
    FIX = 'loss.backward() -> scaler.scale(loss).backward()'
    FIX_SAFETY = FixSafety.NEVER
    MESSAGE = "a backward pass on an unscaled loss is followed by `scaler.step()`; use `scaler.scale(loss).backward()`"
    TRIGGERS = ("scaler",)
    NEEDS_A_STEP = True

    VALID = [
        Valid(CORRECT_LOOP),
        Valid(CORRECT_TRAINER),
        Valid(
            "class BaseTrainer:\n"
            "    def _backward(self, loss):\n"
            "        self.optimizer.zero_grad()\n"
            "        loss.backward()\n"
            "        self.scaler.step(self.optimizer)\n"
            "        self.scaler.update()\n"
        ),
        Valid(
            "class Trainer:\n"
            "    def train(self, loader):\n"
            "        for x in loader:\n"
            "            with torch.autocast('cuda'):\n"
            "                loss = self.model(x)\n"
            "            self._backward(self.scaler.scale(loss))\n"
            "\n"
            "    def _backward(self, loss):\n"
            "        loss.backward()\n"
            "        self.scaler.step(self.optimizer)\n"
            "        self.scaler.update()\n"
        ),
        Valid(
            "def train(model, optimizer, loader, use_amp):\n"
            "    scaler = torch.amp.GradScaler('cuda', enabled=use_amp)\n"
            "    for x in loader:\n"
            "        loss = model(x)\n"
            "        if use_amp:\n"
            "            scaler.scale(loss).backward()\n"
            "        else:\n"
            "            loss.backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
        ),
    ]
    INVALID = [
        Invalid(
            "def train(model, optimizer, loader, scaler):\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        loss = model(x, y)\n"
            "        loss.backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            "def train(model, optimizer, loader, scaler):\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        loss = model(x, y)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            unsafe_fixes=True,
        ),
        Invalid(
            "class Trainer:\n"
            "    def fit(self, data):\n"
            "        while self.step < self.max_steps:\n"
            "            loss = self.model(next(data))\n"
            "            self.backward(loss)\n"
            "            self.scaler.step(self.optimizer)\n"
            "            self.scaler.update()\n"
            "\n"
            "    def backward(self, loss):\n"
            "        loss.backward()\n"
        ),
        Invalid(
            "def train_step(model, optimizer, batch, scaler):\n"
            "    with torch.autocast('cuda'):\n"
            "        losses = model(batch)\n"
            "    losses['total'].backward()\n"
            "    scaler.step(optimizer)\n"
            "    scaler.update()\n"
        ),
    ]

    def findings(self, model):
        for steps, event in model.each(Kind.SCALER_STEP):
            backwards = steps.before(event, (Kind.BACKWARD,))
            if not backwards or any(b.how is not Backward.PLAIN for b in backwards):
                continue
            if any(not b.inlined() and b.subject in _parameters(steps.root) for b in backwards):
                continue  # `def _backward(self, loss)`: its callers (elsewhere) may hand it a scaled loss
            for backward in backwards:
                fix = {}
                loss = nodes.code(backward.node.func.value)
                if not backward.inlined():
                    replacement = backward.node.with_changes(
                        func=backward.node.func.with_changes(value=nodes.parse_expression(f"{event.scaler}.scale({loss})", model.module)))
                    fix = {"replacement": replacement, "safety": Safety.UNSAFE,
                           "fix_message": f"Use `{event.scaler}.scale({loss}).backward()`",
                           "why_unsafe": "every update changes: the gradients were never scaled, and scaler.step divides them by the scale"}
                yield backward.node, None, fix


def _parameters(root) -> set[str]:
    if not isinstance(root, cst.FunctionDef):
        return set()
    params = root.params
    return {param.name.value for param in (*params.posonly_params, *params.params, *params.kwonly_params)}
