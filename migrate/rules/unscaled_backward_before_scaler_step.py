"""AMP109: a plain ``loss.backward()`` followed by ``scaler.step(optimizer)``."""
from __future__ import annotations

import functools

import libcst as cst
from libcst.metadata import ParentNodeProvider

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._apex_rename import line_holding, marked
from migrate.rules._framework_loops import (ACCELERATE, CORRECT, DEEPSPEED, FABRIC, FACTORY, GRAD_SCALER, LIGHTNING,
                                              TIMM)
from migrate.rules._training_step import CORRECT_LOOP, CORRECT_TRAINER, TrainingStepRule
from migrate.rules._frameworks import precision_without_scaler, prepared_optimizers, steps_by_hand
from migrate.step_model import Backward, Kind
from migrate.step_model import vocabulary as words
from migrate.step_model.shapes import parameters_of
from migrate.types import FixSafety, Safety


class UnscaledBackwardBeforeScalerStep(TrainingStepRule):
    """What it does:
    Reports ``loss.backward()`` when the step that follows it is ``scaler.step(optimizer)`` and no
    backward pass on a path to that step scales its loss (``if amp: scaler.scale(loss).backward()
    else: loss.backward()`` before an unconditional ``scaler.step`` is left alone: a disabled
    scaler's ``step`` is a plain step). A loss that is the function's own parameter
    (``def _backward(self, loss)``) may come scaled from its callers and is left alone; one handed
    in scaled by a caller in the file (``self._backward(self.scaler.scale(loss))``) is scaled.
    The same holds of an optimizer a framework prepared (``accelerator.prepare``, ``fabric.setup``)
    or a LightningModule that steps by hand: its step goes through the framework's scaler, so the
    backward pass must be the framework's (see "In each framework").

    Why is this bad?
    ``scaler.step`` divides the gradients by the scale before stepping. Gradients that were never
    multiplied by it come out 65,536 times too small at the start, and the inf/NaN checks guard
    values that were never at risk.

    Fix safety:
    Unsafe: ``loss.backward()`` becomes ``scaler.scale(loss).backward()`` (or the framework's
    ``accelerator.backward(loss)``, ``fabric.backward(loss)``, ``self.manual_backward(loss)``),
    which changes every update (that is its point). The rewritten line carries a
    ``TODO(ampmigrate)`` comment saying so: in code migrated from apex (a ``loss.backward()``
    inside ``amp.scale_loss``, whose gradients apex divided by the scale as well) the fix trains
    differently from the original. Where the scaler steps only under a test the backward pass is
    not under (``if fp16: scaler.step(optimizer) else: optimizer.step()``), the loss is scaled
    there only: ``(scaler.scale(loss) if fp16 else loss).backward()`` (a scaler that is ``None``
    where the flag is off, or gradients the plain step never divides, would break the other runs);
    the test is the one choosing the scaler's step over a plain one, not an accumulation boundary
    around both, whose every micro-batch feeds the scaler's step. Where that test cannot be said
    again (an ``elif``, a test that calls something), or no plain step is beside it, no fix. A
    backward pass in a helper the step model inlined, or on the line of an ``if``, is reported
    with no fix.
    """

    CODE = "AMP109"
    FIX = 'loss.backward() -> scaler.scale(loss).backward()'
    FIX_SAFETY = FixSafety.NEVER
    MESSAGE = "a backward pass on an unscaled loss is followed by `scaler.step()`; use `scaler.scale(loss).backward()`"
    TRIGGERS = ("scaler", "accelerator", "fabric", "automatic_optimization")
    NEEDS_A_STEP = True
    METADATA_DEPENDENCIES = (*TrainingStepRule.METADATA_DEPENDENCIES, ParentNodeProvider)  # the line a fix marks

    FRAMEWORKS = {
        GRAD_SCALER: (
            "Reported: `loss.backward()` followed by `scaler.step(optimizer)`; the unsafe fix is "
            "`scaler.scale(loss).backward()`."
        ),
        FACTORY: "Reported and fixed as torch's.",
        TIMM: (
            "Not reported: `loss_scaler(loss, optimizer)` runs the backward pass itself; a `loss.backward()` "
            "before it fails at once (a second backward through a freed graph)."
        ),
        ACCELERATE: (
            "Reported: `loss.backward()` where the optimizer that steps came from `accelerator.prepare(...)`: in "
            "fp16 its step unscales gradients that were never scaled. The unsafe fix is "
            "`accelerator.backward(loss)`, which also divides the loss by the accelerator's gradient accumulation"
            " steps. Not reported where the file makes the accelerator with a precision that has no scaler."
        ),
        LIGHTNING: (
            "Reported: `loss.backward()` in a LightningModule that sets `self.automatic_optimization = False`; "
            "the unsafe fix is `self.manual_backward(loss)`."
        ),
        FABRIC: (
            "Reported: `loss.backward()` where the optimizer came from `fabric.setup(...)`; the unsafe fix is "
            "`fabric.backward(loss)`."
        ),
        DEEPSPEED: (
            "Not reported: DeepSpeed's loss scale is the engine's, applied in `model_engine.backward(loss)`, and "
            "`model_engine.step()` is no scaler's or prepared optimizer's step."
        ),
    }

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
        Valid(CORRECT[GRAD_SCALER], framework=GRAD_SCALER),
        Valid(CORRECT[FACTORY], framework=FACTORY),
        Valid(CORRECT[TIMM], framework=TIMM),
        Valid(CORRECT[ACCELERATE], framework=ACCELERATE),
        Valid(CORRECT[LIGHTNING], framework=LIGHTNING),
        Valid(CORRECT[FABRIC], framework=FABRIC),
        Valid(CORRECT[DEEPSPEED], framework=DEEPSPEED),
        Valid(  # the accelerator is made with a precision that has no scaler
            "class Trainer:\n"
            "    def __init__(self, model, optimizer):\n"
            "        self.accelerator = Accelerator(mixed_precision='bf16')\n"
            "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n"
            "\n"
            "    def fit(self, loader):\n"
            "        for x in loader:\n"
            "            loss = self.model(x)\n"
            "            loss.backward()\n"
            "            self.optimizer.step()\n",
            framework=ACCELERATE,
        ),
    ]
    INVALID = [
        Invalid(
            "def train(model, optimizer, loader, args):\n"
            "    scaler = torch.amp.GradScaler('cuda') if args.fp16 else None\n"
            "    for x, y in loader:\n"
            "        loss = model(x, y)\n"
            "        loss.backward()\n"
            "        if args.fp16:\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n"
            "        else:\n"
            "            optimizer.step()\n",
            "def train(model, optimizer, loader, args):\n"
            "    scaler = torch.amp.GradScaler('cuda') if args.fp16 else None\n"
            "    for x, y in loader:\n"
            "        loss = model(x, y)\n"
            "        # TODO(ampmigrate): review, this rewrite is unsafe: where `args.fp16`, every\n"
            "        #   update changes: the gradients were never scaled, and scaler.step divides\n"
            "        #   them by the scale\n"
            "        (scaler.scale(loss) if args.fp16 else loss).backward()\n"
            "        if args.fp16:\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n"
            "        else:\n"
            "            optimizer.step()\n",
            unsafe_fixes=True,
        ),
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
            "        # TODO(ampmigrate): review, this rewrite is unsafe: every update changes: the\n"
            "        #   gradients were never scaled, and scaler.step divides them by the scale\n"
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
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = model(x, y)\n"
            "        loss.backward()\n"
            "        scaler.step(optimizer)\n"
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
            "        loss.backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            framework=FACTORY,
        ),
        Invalid(
            "def train(model, optimizer, loader, accelerator):\n"
            "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            "    for x, y in loader:\n"
            "        loss = model(x, y)\n"
            "        loss.backward()\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n",
            framework=ACCELERATE,
        ),
        Invalid(
            "import lightning as L\n"
            "\n"
            "\n"
            "class Model(L.LightningModule):\n"
            "    def __init__(self, net):\n"
            "        super().__init__()\n"
            "        self.net = net\n"
            "        self.automatic_optimization = False\n"
            "\n"
            "    def training_step(self, batch, batch_idx):\n"
            "        opt = self.optimizers()\n"
            "        loss = self.net(*batch)\n"
            "        loss.backward()\n"
            "        opt.step()\n"
            "        opt.zero_grad()\n",
            framework=LIGHTNING,
        ),
        Invalid(
            "def train(model, optimizer, loader, fabric):\n"
            "    model, optimizer = fabric.setup(model, optimizer)\n"
            "    for x, y in loader:\n"
            "        loss = model(x, y)\n"
            "        loss.backward()\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n",
            framework=FABRIC,
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
                loss = nodes.code(backward.node.func.value)
                plain = [step.node for step in model.all_events(Kind.STEP) if step.subject == event.subject and not step.inlined()]
                test = self._only_where(event.node, backward.node, plain)
                if test is False:
                    yield backward.node, None, {}  # `elif fp16: scaler.step(...)`: scaled on every run, the others' updates change
                    continue
                scaled = f"{event.scaler}.scale({loss})" if test is None else f"({event.scaler}.scale({loss}) if {test} else {loss})"
                replacement = backward.node.with_changes(
                    func=backward.node.func.with_changes(value=nodes.parse_expression(scaled, model.module)))
                where = "every update changes" if test is None else f"where `{test}`, every update changes"
                yield self._marked_fix(backward, replacement, None, f"Use `{scaled}.backward()`",
                                       f"{where}: the gradients were never scaled, and scaler.step divides them by the scale")
        prepared, by_hand = prepared_optimizers(model.module), steps_by_hand(model.module)
        for steps, backward, instead in _framework_steps(model, prepared, by_hand):
            runner = "self" if instead == _MANUAL_BACKWARD else instead.rsplit(".", 1)[0]
            if runner != "self" and precision_without_scaler(model.module, runner):
                continue  # `Accelerator(mixed_precision="bf16")`: no scaler to bypass
            loss = nodes.code(backward.node.func.value)
            framework = words.scaling_framework(runner)[0]
            message = (f"`{loss}.backward()` bypasses {framework}'s loss scaling: in float16 mixed precision its optimizer "
                       f"step unscales gradients that were never scaled; use `{instead}({loss})`")
            if backward.node.args:
                yield backward.node, message, {}
                continue
            yield self._marked_fix(backward, nodes.parse_expression(f"{instead}({loss})", model.module), message,
                              f"Use `{instead}({loss})`", _WHY_UNSAFE.get(framework, _WHY_UNSAFE[None]))

    def _only_where(self, step: cst.CSTNode, backward: cst.CSTNode, plain: list[cst.CSTNode]) -> str | None | bool:
        """The test choosing between the scaler's ``step`` and a plain ``optimizer.step()`` in its
        other arm (``if fp16: scaler.step(opt) else: opt.step()``: ``fp16``; the scaler's in the
        ``else:``: ``not fp16``), for the backward to be scaled only where the scaler steps; an
        ``if`` around them both (an accumulation boundary) is no such test: every micro-batch
        feeding the scaler's step is scaled. None where the step runs wherever the backward does;
        False where it runs under another test, or one that cannot be said again at the backward
        (an ``elif``, a test that calls something, a loop or a function between)."""
        parent_of = functools.partial(self.get_metadata, ParentNodeProvider, default=None)

        def ancestors(node: cst.CSTNode | None) -> set[int]:
            found = set()
            while node is not None:
                found.add(id(node))
                node = parent_of(node)
            return found

        around, plain_in = ancestors(backward), set().union(*map(ancestors, plain))  # the plain steps' blocks
        tested = False
        child, node = step, parent_of(step)
        while node is not None and id(node) not in around:
            if isinstance(node, (cst.For, cst.While, cst.Try, cst.FunctionDef, cst.Lambda)):
                return False
            if isinstance(node, cst.If) and child is not node.test:
                tested = True
                other = node.orelse if child is node.body else node.body
                if other is not None and id(other) in plain_in:
                    outer = parent_of(node)
                    if (isinstance(outer, cst.If) and outer.orelse is node) or isinstance(child, cst.If) or not nodes.is_pure(node.test):
                        return False
                    return nodes.code(node.test) if child is node.body else _negated(node.test)
            child, node = node, parent_of(node)
        return False if tested else None

    def _marked_fix(self, backward, replacement: cst.BaseExpression, message: str | None, fix_message: str,
                    why: str) -> tuple[cst.CSTNode, str | None, dict]:
        """The finding of a plain backward pass with its unsafe fix: the line holding the call,
        rewritten and marked with a ``TODO(ampmigrate)`` saying what changes (an unsafe fix changes
        the training only where it says so). No fix where the call is inlined from a helper or has
        no line of its own."""
        statement = None if backward.inlined() else line_holding(self, backward.node)
        if statement is None:
            return backward.node, message, {}
        return statement, message, {"replacement": marked(statement.deep_replace(backward.node, replacement), why),
                                    "safety": Safety.UNSAFE, "fix_message": fix_message, "why_unsafe": why}


_MANUAL_BACKWARD = "self.manual_backward"  # Lightning's, in a LightningModule that steps by hand
_WHY_UNSAFE = {
    "Accelerate": "in float16 the loss becomes scaled (that is the point), and `accelerator.backward` also divides it by "
                  "the `gradient_accumulation_steps` the Accelerator is made with",
    None: "in float16 the loss becomes scaled, which changes every update (that is the point)",
}


def _negated(test: cst.BaseExpression) -> str:
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return nodes.code(test.expression)
    return f"not {nodes.code(test)}" if isinstance(test, (cst.Name, cst.Attribute)) else f"not ({nodes.code(test)})"


def _framework_steps(model, prepared: dict[str, str], by_hand: set[int]):
    """``(steps, plain backward, what to call instead)`` for each ``loss.backward()`` whose step
    is an optimizer's that a framework prepared (``accelerator.prepare``, ``fabric.setup``), or
    a LightningModule's that steps by hand, with no backward of the framework's in the pass."""
    for steps, event in model.each(Kind.STEP):
        if event.detail.get("framework"):
            continue  # timm's `loss_scaler(...)`: it runs its own backward
        owner = model.facts.owner.get(id(steps.root))
        if event.subject in prepared:
            instead = f"{prepared[event.subject]}.backward"
        elif owner is not None and id(owner) in by_hand and not event.inlined():
            instead = _MANUAL_BACKWARD
        else:
            continue
        backwards = steps.before(event, (Kind.BACKWARD,))
        if backwards and all(b.how is Backward.PLAIN for b in backwards):
            for backward in backwards:
                yield steps, backward, instead


def _parameters(root) -> set[str]:
    if not isinstance(root, cst.FunctionDef):
        return set()
    return {param.name.value for param in parameters_of(root)}
