"""AMP103: ``scaler.step(...)`` with no ``scaler.update()`` in the same iteration."""
from __future__ import annotations

from libcst.metadata import PositionProvider

from migrate.rule import Invalid, Valid
from migrate.rules._framework_loops import (ACCELERATE, CORRECT, DEEPSPEED, FABRIC, FACTORY, GRAD_SCALER, LIGHTNING,
                                              TIMM)
from migrate.rules._training_step import CORRECT_LOOP, CORRECT_TRAINER, TrainingStepRule
from migrate.step_model import Kind


class ScalerStepWithoutUpdate(TrainingStepRule):
    """What it does:
    Reports ``scaler.step(optimizer)`` in a training loop whose iteration never calls
    ``scaler.update()`` on the same scaler, directly or through the file's own helpers (an
    update after the loop, once per epoch, is reported). Where the step is in a function with no
    loop, it is reported only when the file creates the scaler and calls ``update()`` on none.

    Why is this bad?
    ``update()`` is what moves the scale: it halves it after an overflow and grows it after a run
    of clean steps. Without it the scale never leaves its first value, so an overflow skips every
    following step, and ``unscale_`` refuses to run twice before an update.

    Fix safety:
    No fix: where the update belongs (after each step, or each optimizer's last step) is the
    author's choice.
    """

    CODE = "AMP103"
    MESSAGE = "`scaler.step()` with no `scaler.update()` in the same iteration"
    TRIGGERS = ("scaler", "GradScaler")
    NEEDS_A_STEP = True

    FRAMEWORKS = {
        GRAD_SCALER: 'Reported: `scaler.step(optimizer)` with no `scaler.update()` in the iteration.',
        FACTORY: "Reported as torch's.",
        TIMM: 'Not reported: `loss_scaler(...)` updates its scaler itself.',
        ACCELERATE: "Not reported: the accelerator updates its scale in the prepared optimizer's step.",
        LIGHTNING: 'Not reported: the precision plugin updates its scale in the optimizer step.',
        FABRIC: 'Not reported: Fabric updates its scale in the optimizer step.',
        DEEPSPEED: 'Not reported: the engine updates its loss scale in `model_engine.step()`.',
    }

    VALID = [
        Valid(CORRECT_LOOP),
        Valid(CORRECT_TRAINER),
        Valid(
            "def step(scaler, optimizers):\n"
            "    for optimizer in optimizers:\n"
            "        scaler.step(optimizer)\n"
            "    scaler.update()\n"
        ),
        Valid(CORRECT[GRAD_SCALER], framework=GRAD_SCALER),
        Valid(CORRECT[FACTORY], framework=FACTORY),
        Valid(CORRECT[TIMM], framework=TIMM),
        Valid(CORRECT[ACCELERATE], framework=ACCELERATE),
        Valid(CORRECT[LIGHTNING], framework=LIGHTNING),
        Valid(CORRECT[FABRIC], framework=FABRIC),
        Valid(CORRECT[DEEPSPEED], framework=DEEPSPEED),
    ]
    INVALID = [
        Invalid(
            "def train(model, optimizer, loader, scaler):\n"
            "    for epoch in range(10):\n"
            "        for step, x in enumerate(loader):\n"
            "            scaler.scale(model(x)).backward()\n"
            "            scaler.step(optimizer)\n"
            "            optimizer.zero_grad()\n"
            "        scaler.update()\n"
        ),
        Invalid(
            "class Trainer:\n"
            "    def fit(self, data):\n"
            "        while self.step < self.max_steps:\n"
            "            self.scaler.scale(self.model(next(data))).backward()\n"
            "            self.optimizer_step()\n"
            "\n"
            "    def optimizer_step(self):\n"
            "        self.scaler.step(self.optimizer)\n"
            "        self.optimizer.zero_grad()\n"
        ),
        Invalid(
            "scaler = torch.amp.GradScaler('cuda')\n"
            "\n"
            "def train_step(model, optimizer, batch):\n"
            "    scaler.scale(model(batch)).backward()\n"
            "    scaler.step(optimizer)\n"
        ),
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = model(x, y)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n",
            framework=GRAD_SCALER,
        ),
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            "    scaler = build_grad_scaler(cfg)\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = model(x, y)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n",
            framework=FACTORY,
        ),
    ]

    def findings(self, model):
        for steps, event in model.each(Kind.SCALER_STEP):
            loop = steps.backward_loop(event)
            same = lambda update: update.scaler == event.scaler  # noqa: E731
            if loop is not None:
                updated = any(same(u) and loop in u.frames and not steps.exclusive(u, event) for u in steps.of(Kind.UPDATE))
            else:
                # No training loop to hold both: any update in the file may follow it (through a
                # local alias such as `scaler = self._scaler`, or a caller in another method).
                # A scaler made in another file is updated there too, as far as this file shows.
                updated = bool(model.all_events(Kind.UPDATE)) or not model.all_events(Kind.SCALER_NEW)
            if not updated:
                where = f" of the loop at line {self.get_metadata(PositionProvider, loop.node).start.line}" if loop else ""
                yield event.node, (f"`{event.scaler}.step(...)` with no `{event.scaler}.update()` in the same iteration{where}: "
                                   "the scale never moves; call it after the step"), {}
