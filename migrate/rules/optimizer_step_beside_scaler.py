"""AMP102: ``optimizer.step()`` on an optimizer whose loss a GradScaler scales."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._framework_loops import (ACCELERATE, CORRECT, DEEPSPEED, FABRIC, FACTORY, GRAD_SCALER, LIGHTNING,
                                              TIMM)
from migrate.rules._training_step import CORRECT_LOOP, CORRECT_TRAINER, TrainingStepRule
from migrate.step_model import Backward, Event, Kind, Steps
from migrate.types import FixSafety, Safety


class OptimizerStepBesideScaler(TrainingStepRule):
    """What it does:
    Reports ``optimizer.step()`` where the step's backward pass was ``scaler.scale(loss).backward()``
    (in the same iteration, on a path that can run with it: ``if scaler: ... else: optimizer.step()``
    is left alone, as is a plain step where the scaler was never made, ``else:`` of
    ``if getattr(self, "scaler", None) is not None:``).

    Why is this bad?
    The gradients are still multiplied by the scale, so the update is 65,536 times too large,
    and the inf/NaN check that ``scaler.step`` makes is skipped: an overflowing step corrupts the
    weights instead of being skipped.

    Fix safety:
    Unsafe: ``optimizer.step()`` becomes ``scaler.step(optimizer)`` where ``scaler.update()``
    follows in the same iteration. Where every update after it runs only with a later step of
    its own (``if <holds gradients>: scaler.step(d_opt); scaler.update()``), ``scaler.update()``
    follows the new step too: a second ``scaler.step`` before an update raises. It changes the
    training (that is its point): updates are unscaled, and steps with inf/NaN gradients are skipped.
    """

    CODE = "AMP102"
    FIX = 'optimizer.step() -> scaler.step(optimizer)'
    FIX_SAFETY = FixSafety.NEVER
    MESSAGE = "`optimizer.step()` after a scaled backward: use `scaler.step(optimizer)`"
    TRIGGERS = ("scaler", "GradScaler")
    NEEDS_A_STEP = True

    FRAMEWORKS = {
        GRAD_SCALER: (
            "Reported: `optimizer.step()` after `scaler.scale(loss).backward()`; the unsafe fix is "
            "`scaler.step(optimizer)`."
        ),
        FACTORY: "Reported and fixed as torch's.",
        TIMM: (
            "Not reported: `loss_scaler(...)` steps through its scaler. A further `optimizer.step()` after it "
            "steps twice, a different mistake this rule does not look for."
        ),
        ACCELERATE: "Not reported: the prepared optimizer's `step()` goes through the accelerator's scaler.",
        LIGHTNING: "Not reported: `opt.step()` of `self.optimizers()` goes through the precision plugin's scaler.",
        FABRIC: "Not reported: the optimizer `fabric.setup` returns steps through Fabric's scaler.",
        DEEPSPEED: "Not reported: `model_engine.step()` is the engine's own step.",
    }

    VALID = [
        Valid(CORRECT_LOOP),
        Valid(CORRECT_TRAINER),
        # the plain step runs where the scaled backward did not: `not (not own and amp)`
        Valid(
            "def train_step(model, optimizer, batch, scaler, own_scaler=None, amp=False):\n"
            "    loss = model(batch)\n"
            "    if own_scaler:\n"
            "        own_scaler.scale(loss).backward()\n"
            "    elif amp:\n"
            "        scaler.scale(loss).backward()\n"
            "    else:\n"
            "        loss.backward()\n"
            "    if own_scaler:\n"
            "        own_scaler.step(optimizer)\n"
            "    elif not own_scaler and amp:\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "    else:\n"
            "        optimizer.step()\n"
        ),
        Valid(
            "def train(model, optimizer, loader, scaler=None):\n"
            "    for x in loader:\n"
            "        loss = model(x)\n"
            "        if scaler is not None:\n"
            "            scaler.scale(loss).backward()\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n"
            "        else:\n"
            "            loss.backward()\n"
            "            optimizer.step()\n"
            "        lr_scheduler.step()\n"
        ),
        Valid(
            "def train(model, optimizer, loader, scaler):\n"
            "    for x in loader:\n"
            "        if scaler:\n"
            "            scaler.scale(model(x)).backward()\n"
            "        else:\n"
            "            model(x).backward()\n"
            "        if not scaler:\n"
            "            optimizer.step()\n"
            "        else:\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n"
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
            "    for i, (x, y) in enumerate(loader):\n"
            "        scaler.scale(model(x, y)).backward()\n"
            "        optimizer.step()\n"
            "        scaler.update()\n",
            "def train(model, optimizer, loader, scaler):\n"
            "    for i, (x, y) in enumerate(loader):\n"
            "        scaler.scale(model(x, y)).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            unsafe_fixes=True,
        ),
        # the only update after it runs with a later step of its own: the fixed step gets its update
        Invalid(
            "def train(g, d, opt_g, opt_d, loader, scaler):\n"
            "    for x in loader:\n"
            "        scaler.scale(g(x).mean()).backward()\n"
            "        opt_g.step()\n"
            "        if x.sum() > 0:\n"
            "            scaler.scale(d(x).mean()).backward()\n"
            "            scaler.step(opt_d)\n"
            "            scaler.update()\n",
            "def train(g, d, opt_g, opt_d, loader, scaler):\n"
            "    for x in loader:\n"
            "        scaler.scale(g(x).mean()).backward()\n"
            "        scaler.step(opt_g)\n"
            "        scaler.update()\n"
            "        if x.sum() > 0:\n"
            "            scaler.scale(d(x).mean()).backward()\n"
            "            scaler.step(opt_d)\n"
            "            scaler.update()\n",
            unsafe_fixes=True,
        ),
        Invalid(
            "def train(model, opt, data, scaler):\n"
            "    while True:\n"
            "        loss = model(next(data))\n"
            "        scaler.scale(loss).backward()\n"
            "        opt.step()\n"
            "        opt.zero_grad()\n"
        ),
        Invalid(
            "class Trainer:\n"
            "    def fit(self, loader):\n"
            "        for batch in loader:\n"
            "            self.backward(self.model(batch))\n"
            "            self.optimizer_step()\n"
            "\n"
            "    def backward(self, loss):\n"
            "        self.scaler.scale(loss).backward()\n"
            "\n"
            "    def optimizer_step(self):\n"
            "        self.optimizer.step()\n"
            "        self.scaler.update()\n"
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
            "        optimizer.step()\n"
            "        scaler.update()\n",
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
            "        optimizer.step()\n",
            framework=FACTORY,
        ),
    ]

    def findings(self, model):
        for steps, event in model.each(Kind.STEP):
            scalers = {b.scaler for b in steps.before(event, (Kind.BACKWARD,))
                       if b.how is Backward.SCALED and not steps.scaled_apart(event, b) and not _cleared_between(steps, b, event)}
            if not scalers:
                continue
            fix = {}
            scaler = next(iter(scalers))
            updates = [u for u in steps.after(event, (Kind.UPDATE,)) if u.scaler == scaler]
            found = event.node
            if len(scalers) == 1 and updates and not event.node.args and not event.inlined():
                replacement = nodes.parse_expression(f"{scaler}.step({event.subject})", model.module)
                if not any(steps.runs_whenever(update, event) for update in updates):
                    # the update after it runs only with a later step of its own (`if <holds
                    # gradients>: scaler.step(d_opt); scaler.update()`): this step's update comes
                    # after it, as a second `scaler.step` before an update raises
                    found, replacement = _with_its_update(steps, event, updates, replacement, scaler, model.module)
                if replacement is not None:
                    fix = {
                        "replacement": replacement,
                        "safety": Safety.UNSAFE,
                        "fix_message": f"Use `{scaler}.step({event.subject})`",
                        "why_unsafe": "updates become unscaled, and steps with inf/NaN gradients are skipped",
                    }
            message = f"`{event.subject}.step()` after `{scaler}.scale(loss).backward()`: use `{scaler}.step({event.subject})`"
            yield found, message, fix


def _with_its_update(steps: Steps, event: Event, updates: list[Event], call: cst.Call, scaler: str, module: cst.Module):
    """The line of ``event`` (a step alone on its line) as ``scaler.step(opt)`` then ``scaler.update()``,
    where every later update has a scaler step of its own before it that runs whenever it does;
    else no fix (the event's node, None)."""
    line = event.statements[-1] if event.statements else None
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Expr)
            and line.body[0].value is event.node):
        return event.node, None
    own_steps = [e for e in steps.after(event, (Kind.SCALER_STEP,)) if e.scaler == scaler]
    if not all(any(steps.index(e) < steps.index(update) and steps.runs_whenever(e, update) for e in own_steps) for update in updates):
        return event.node, None
    update = nodes.parse_statements(f"{scaler}.update()\n", module)[0]
    return line, cst.FlattenSentinel([line.with_changes(body=[line.body[0].with_changes(value=call)]), update])


def _cleared_between(steps: Steps, backward: Event, step: Event) -> bool:
    """Whether the optimizer's gradients are cleared between ``backward`` and ``step`` on every
    pass that runs both (``scaler.step(d_opt); ...; d_opt.zero_grad(); r1.backward(); d_opt.step()``):
    the scaled gradients never reach this step."""
    between = steps.events[steps.index(backward) + 1:steps.index(step)]
    return any(e.kind is Kind.ZERO_GRAD and e.subject == step.subject and steps.runs_whenever(e, step, backward)
               for e in between)
