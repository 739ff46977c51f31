"""AMP101: gradients read after a scaled backward, before ``scaler.unscale_(optimizer)``."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._framework_loops import (ACCELERATE, CORRECT, DEEPSPEED, FABRIC, FACTORY, GRAD_SCALER, LIGHTNING,
                                              TIMM)
from migrate.rules._training_step import CORRECT_LOOP, CORRECT_TRAINER, TrainingStepRule
from migrate.rules._frameworks import scaled_by_a_framework
from migrate.rules._unscaled_paths import unscaled_on_every_path
from migrate.step_model import Backward, Event, Kind, Steps, scaler_off_where
from migrate.step_model import vocabulary as words
from migrate.types import FixSafety, Safety


class GradientsReadWhileScaled(TrainingStepRule):
    """What it does:
    Reports a gradient clip, a gradient norm or a read of ``p.grad`` after
    ``scaler.scale(loss).backward()`` with no ``scaler.unscale_(optimizer)`` before it in the
    same step: one finding per missing ``unscale_``, at the first read, the others related. A
    reading call handed the scale or the scaler (``clip_gradients(model, max_norm,
    scale=scaler.get_scale())``) knows the gradients are scaled and is not reported; nor is a read
    where the scaler is off (``else:`` of ``if args.fp16:``, the scaler made with
    ``enabled=args.fp16``, or a conjunction holding it), nor one after a loop of micro-batches whose
    ``unscale_`` runs after the backward under a test of the pass (``if is_last_batch:``) and whose
    step follows the loop: only the last pass may unscale there; a ``test_...`` function is no training step. A framework that scales the loss itself (Accelerate, Fabric,
    Lightning's ``self.manual_backward``) has the same mistake: a torch clip between its backward
    pass and its optimizer step, instead of its own clip, which unscales first (see "In each
    framework").

    Why is this bad?
    Until ``unscale_`` (or ``scaler.step``) runs, every gradient is multiplied by the scale,
    65,536 at the start. ``clip_grad_norm_(params, 1.0)`` then clips gradients whose true norm
    is about 1.5e-5: in effect it always clips, and the logged norms are the scale's size.

    Fix safety:
    ``scaler.unscale_(optimizer)`` goes before the first reading statement, offered only where
    ``scaler.step(optimizer)`` follows it in the same block, the scaler steps one optimizer,
    nothing else in the step calls ``unscale_`` (a second call per step raises) and no backward
    pass runs in between (it would add scaled gradients to unscaled ones). ``scaler.step`` then
    skips its own unscaling, and the reader sees true gradients: a logged norm is the true one,
    a clip clips at the threshold it names (that is the point).
    Safe where the step always follows: every way on from the read reaches it within the
    iteration, through the function's control flow (a ``continue`` of a loop over the
    parameters stays in the iteration; a ``continue`` of the training loop leaves it).
    Unsafe where only an exception can skip both the step and ``scaler.update()``: a ``try``
    within the step whose handler lets the loop go on (the out-of-memory recovery loop), since
    an exception caught between ``unscale_`` and the step skips them and the next ``unscale_``
    raises; an ``update()`` after the ``try``, a handler that raises again, or a ``finally``
    alone (the exception ends the run) keeps it safe. Elsewhere the finding has no fix: unscaling where no step may follow
    (gradient accumulation, the step in another branch) raises at the next ``unscale_``.
    A clip that apex made inside ``amp.scale_loss`` saw scaled gradients there too: the
    migration keeps it so and marks it ``# noqa: AMP101``; delete the mark to have it fixed.
    """

    CODE = "AMP101"
    FIX = 'inserts scaler.unscale_(optimizer) before the gradients are read'
    FIX_SAFETY = FixSafety.SOMETIMES
    MESSAGE = "gradients are read while still multiplied by the loss scale; call `scaler.unscale_(optimizer)` first"
    TRIGGERS = ("scaler", "GradScaler", "accelerator", "fabric", "manual_backward")
    NEEDS_A_STEP = True

    FRAMEWORKS = {
        GRAD_SCALER: (
            "Reported: a read between `scaler.scale(loss).backward()` and `scaler.unscale_(optimizer)`; fixed by "
            "inserting the `unscale_` where that is safe."
        ),
        FACTORY: "Reported and fixed as torch's: what the factory returns is used as a `GradScaler`.",
        TIMM: (
            "Not reported: `loss_scaler(loss, optimizer, clip_grad=...)` unscales before it clips and steps "
            "inside the call, so no code of the loop sees scaled gradients."
        ),
        ACCELERATE: (
            "Reported: a torch clip or a read of `p.grad` after `accelerator.backward(loss)` and before the step "
            "sees gradients still multiplied by the scale when the accelerator runs fp16; "
            "`accelerator.clip_grad_norm_` unscales first. Not reported where the file makes the accelerator with"
            " a precision that has no scaler (`mixed_precision=\"bf16\"` or `\"no\"`). No fix."
        ),
        LIGHTNING: (
            "Reported: a torch clip after `self.manual_backward(loss)`, which sees scaled gradients under "
            "`16-mixed` precision; `self.clip_gradients(opt, ...)` unscales first. The Trainer's precision is set"
            " elsewhere, so the message says when it holds. No fix."
        ),
        FABRIC: (
            "Reported: a torch clip after `fabric.backward(loss)`; `fabric.clip_gradients(model, optimizer, ...)`"
            " unscales first. Not reported where the file makes the Fabric with a precision that has no scaler. "
            "No fix."
        ),
        DEEPSPEED: (
            "Not reported: the engine keeps its gradients and its loss scale to itself, and clips as its "
            "configuration says (`gradient_clipping`)."
        ),
    }

    VALID = [
        Valid(CORRECT_LOOP),
        Valid(CORRECT_TRAINER),
        Valid(  # what a gradient is, not its values: the same whatever the scale
            "scaler = torch.amp.GradScaler('cuda')\n"
            "for inputs, targets in loader:\n"
            "    with torch.autocast('cuda'):\n"
            "        loss = criterion(net(inputs), targets)\n"
            "    scaler.scale(loss).backward()\n"
            "    print(f'grad dtype: {net.fc.weight.grad.dtype}, shape: {tuple(net.fc.weight.grad.size())}')\n"
            "    scaler.step(opt)\n"
            "    scaler.update()\n"
        ),
        Valid(
            "def train(model, optimizer, loader, scaler, max_norm):\n"
            "    for x in loader:\n"
            "        scaler.scale(model(x)).backward()\n"
            "        clip_gradients(model, max_norm, scale=scaler.get_scale())\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
        ),
        Valid(
            "def train(model, opt, loader, scaler):\n"
            "    for x in loader:\n"
            "        scaler.scale(model(x)).backward()\n"
            "        for p in model.parameters():\n"
            "            if p.grad is not None:\n"
            "                torch.distributed.all_reduce(p.grad)\n"
            "        scaler.step(opt)\n"
            "        scaler.update()\n"
            "        norms = [p.grad.norm() for p in model.parameters()]\n"
        ),
        Valid(
            "from accelerate import Accelerator\n"
            "\n"
            'accelerator = Accelerator(mixed_precision="bf16")\n'
            "\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            "    for x, y in loader:\n"
            "        loss = model(x, y)\n"
            "        accelerator.backward(loss)\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n",
            framework=ACCELERATE,
        ),
        Valid(CORRECT[GRAD_SCALER], framework=GRAD_SCALER),
        Valid(CORRECT[FACTORY], framework=FACTORY),
        Valid(CORRECT[TIMM], framework=TIMM),
        Valid(CORRECT[ACCELERATE], framework=ACCELERATE),
        Valid(CORRECT[LIGHTNING], framework=LIGHTNING),
        Valid(CORRECT[FABRIC], framework=FABRIC),
        Valid(CORRECT[DEEPSPEED], framework=DEEPSPEED),
        Valid(  # a precision with no scaler, through a module constant
            "from lightning.fabric import Fabric\n"
            "\n"
            "PRECISION = 'bf16-mixed'\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            "    fabric = Fabric(precision=PRECISION)\n"
            "    model, optimizer = fabric.setup(model, optimizer)\n"
            "    for x, y in loader:\n"
            "        fabric.backward(model(x, y))\n"
            "        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "        optimizer.step()\n",
            framework=FABRIC,
        ),
        Valid(  # a trainer's own `self.backward`, handed a loss its scaler scaled, then unscaled
            "class Trainer(LightningLite):\n"
            "    def run(self, model, optimizer, loader, scaler):\n"
            "        for x, y in loader:\n"
            "            with torch.autocast('cuda'):\n"
            "                loss = model(x, y)\n"
            "            self.backward(scaler.scale(loss))\n"
            "            scaler.unscale_(optimizer)\n"
            "            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n",
            framework=LIGHTNING,
        ),
    ]
    INVALID = [
        Invalid(
            "def train(model, optimizer, loader, scaler):\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        loss = model(x, y)\n"
            "        scaler.scale(loss).backward()\n"
            "        # keep updates small\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            "def train(model, optimizer, loader, scaler):\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        loss = model(x, y)\n"
            "        scaler.scale(loss).backward()\n"
            "        # keep updates small\n"
            "        scaler.unscale_(optimizer)\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
        ),
        Invalid(
            "class Trainer:\n"
            "    def fit(self, data):\n"
            "        while self.step < self.max_steps:\n"
            "            self.backward(self.model(next(data)))\n"
            "            if self.clip:\n"
            "                norm = clip_grad_norm_(self.model.parameters(), self.clip)\n"
            "            self.scaler.step(self.optimizer)\n"
            "            self.scaler.update()\n"
            "\n"
            "    def backward(self, loss):\n"
            "        self.scaler.scale(loss).backward()\n",
            "class Trainer:\n"
            "    def fit(self, data):\n"
            "        while self.step < self.max_steps:\n"
            "            self.backward(self.model(next(data)))\n"
            "            self.scaler.unscale_(self.optimizer)\n"
            "            if self.clip:\n"
            "                norm = clip_grad_norm_(self.model.parameters(), self.clip)\n"
            "            self.scaler.step(self.optimizer)\n"
            "            self.scaler.update()\n"
            "\n"
            "    def backward(self, loss):\n"
            "        self.scaler.scale(loss).backward()\n",
        ),
        Invalid(
            "def train(model, optimizer, loader, scaler):\n"
            "    batches = iter(loader)\n"
            "    while True:\n"
            "        try:\n"
            "            scaler.scale(model(next(batches))).backward()\n"
            "            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n"
            "        except torch.cuda.OutOfMemoryError:\n"
            "            optimizer.zero_grad()\n",
            "def train(model, optimizer, loader, scaler):\n"
            "    batches = iter(loader)\n"
            "    while True:\n"
            "        try:\n"
            "            scaler.scale(model(next(batches))).backward()\n"
            "            scaler.unscale_(optimizer)\n"
            "            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n"
            "        except torch.cuda.OutOfMemoryError:\n"
            "            optimizer.zero_grad()\n",
            unsafe_fixes=True,
        ),
        Invalid(
            "def train(model, optimizer, loader, scaler, accumulation):\n"
            "    for i, batch in enumerate(loader):\n"
            "        scaler.scale(model(batch) / accumulation).backward()\n"
            "        if (i + 1) % accumulation == 0:\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n"
            "        if i % 100 == 0:\n"
            "            grad_norm = sum(p.grad.norm() ** 2 for p in model.parameters()) ** 0.5\n"
            "            print(grad_norm)\n"
        ),
        Invalid(
            "class Trainer:\n"
            "    def train_step(self, batch):\n"
            "        loss = self.model(batch)\n"
            "        self.scaler.scale(loss).backward()\n"
            "        self.optimizer_step()\n"
            "\n"
            "    def optimizer_step(self):\n"
            "        torch.nn.utils.clip_grad_value_(self.model.parameters(), 0.5)\n"
            "        self.scaler.step(self.optimizer)\n"
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
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = model(x, y)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.unscale_(optimizer)\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
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
            "        scaler.scale(loss).backward()\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            "    scaler = build_grad_scaler(cfg)\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = model(x, y)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.unscale_(optimizer)\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            framework=FACTORY,
        ),
        Invalid(
            "def train(model, optimizer, loader, accelerator):\n"
            "    for x, y in loader:\n"
            "        loss = model(x, y)\n"
            "        accelerator.backward(loss)\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n",
            framework=ACCELERATE,
        ),
        Invalid(
            "import lightning as L\n"
            "\n"
            "\n"
            "class Model(L.LightningModule):\n"
            "    def training_step(self, batch, batch_idx):\n"
            "        opt = self.optimizers()\n"
            "        loss = self.net(*batch)\n"
            "        self.manual_backward(loss)\n"
            "        torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)\n"
            "        opt.step()\n"
            "        opt.zero_grad()\n",
            framework=LIGHTNING,
        ),
        Invalid(
            "def train(model, optimizer, loader, fabric):\n"
            "    for x, y in loader:\n"
            "        loss = model(x, y)\n"
            "        fabric.backward(loss)\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n",
            framework=FABRIC,
        ),
    ]

    def findings(self, model):
        # One missing `unscale_` is one finding: at the first read, the step's later reads related.
        reported: set[int] = set()
        missing: dict[tuple, list] = {}  # (iteration, scaler) -> [(steps, read)]
        by_framework: dict[int, list] = {}  # the framework's backward (id) -> [(steps, read, backward)]
        for steps, event in model.each(Kind.GRAD_READ):
            statement = event.statements[-1] if event.statements else event.node
            if id(statement) in reported:
                continue
            managed = scaled_by_a_framework(model.module, steps, event)
            if managed is not None:
                reported.add(id(statement))
                by_framework.setdefault(id(managed.node), []).append((steps, event, managed))
                continue
            scaled = self._scaled_before(steps, event)
            if scaled is None or _given_the_scale(event, scaled[0]) or scaler_off_where(model.module, scaled[0], event):
                continue
            reported.add(id(statement))
            scaler, backward = scaled
            missing.setdefault((id(backward.node), scaler), []).append((steps, event))
        for (_, scaler), reads in missing.items():
            steps, event = reads[0]
            anchor, fix = self._fix(steps, event, scaler)
            related = tuple((other.node, f"also read before `{scaler}.unscale_`: `{' '.join(nodes.code(other.node).split())}`")
                            for _, other in reads[1:])
            message = self.MESSAGE if len(reads) == 1 else f"{self.MESSAGE} ({len(reads)} reads in this step)"
            if fix and anchor is not event.statements[-1]:  # reported where `unscale_` goes: before the `if` holding the read
                related = ((event.node, f"the read: `{' '.join(nodes.code(event.node).split())}`"), *related)
            yield (anchor if fix else event.node), message, {**fix, "related": related}
        for reads in by_framework.values():
            yield _framework_finding(reads)

    @staticmethod
    def _scaled_before(steps: Steps, event: Event) -> tuple[str, Event] | None:
        """The scaler whose scaled gradients ``event`` reads and the backward pass that scaled
        them, unless an ``unscale_`` or a step that always runs before it (no ``if`` of its own)
        unscaled them."""
        end = steps.index(event)
        for backward in reversed(steps.before(event, (Kind.BACKWARD,))):
            if backward.how is not Backward.SCALED:
                continue
            start = steps.index(backward)
            between = [e for e in steps.events[start:end] if e.scaler == backward.scaler
                       and e.kind in (Kind.UNSCALE, Kind.SCALER_STEP)]
            return None if unscaled_on_every_path(steps, between, event, backward) else (backward.scaler, backward)
        return None

    def _fix(self, steps: Steps, event: Event, scaler: str) -> tuple[cst.CSTNode | None, dict]:
        """The statement to put ``unscale_`` before, and the fix; ``(None, {})`` where unscaling there
        could fail or be wrong (no step on the way, a second ``unscale_``, another backward pass)."""
        stepping = [e for e in steps.after(event, (Kind.SCALER_STEP,)) if e.scaler == scaler]
        everywhere = [e for e in steps.events if e.scaler == scaler and steps.same_iteration(event, e)]
        optimizers = {e.subject for e in everywhere if e.kind is Kind.SCALER_STEP}
        if len(optimizers) != 1 or None in optimizers or any(e.kind is Kind.UNSCALE for e in everywhere):
            return None, {}
        step = next((e for e in stepping if not e.inlined()), None)
        path = None if step is None else steps.straight_path(event, step)
        if path is None or not isinstance(path[0], cst.BaseStatement):
            return None, {}
        if self._backward_between(steps, event, step, path):
            return None, {}
        anchor = path[0]
        line = f"{scaler}.unscale_({step.subject})"
        module = steps.root if isinstance(steps.root, cst.Module) else cst.Module(body=[])
        new = nodes.parse_statements(line + "\n", module)[0]
        placed = cst.FlattenSentinel([nodes.with_leading(new, anchor), anchor.with_changes(leading_lines=())])
        fix = {"replacement": placed, "fix_message": f"Insert `{line}` before the gradients are read"}
        # `update()` is what makes the next `unscale_` legal: reaching it, even with the step skipped, is enough
        updates = tuple(e for e in steps.after(event, (Kind.UPDATE,)) if e.scaler == scaler)
        if steps.always_follows(event, step, or_else=updates):
            return anchor, {**fix, "safety": Safety.SAFE}
        if not steps.always_follows(event, step, or_else=updates, exceptions=False):
            return None, {}  # a way on leaves the iteration first (`continue`, a step under `if`)
        return anchor, {**fix, "safety": Safety.UNSAFE,
                        "why_unsafe": f"an exception caught between it and `{scaler}.step` inside the step would leave the "
                                      "gradients unscaled with no step, and the next `unscale_` raises"}

    @staticmethod
    def _backward_between(steps: Steps, event: Event, step: Event, path: list) -> bool:
        """Whether a backward pass runs after the unscaling and before the step: it would add
        scaled gradients to unscaled ones."""
        end = steps.index(step)
        return any(e.kind is Kind.BACKWARD and (steps.index(e) > steps.index(event) or path[0] in e.statements)
                   for e in steps.events[:end])


def _framework_finding(reads: list) -> tuple:
    """One finding per framework backward pass: at the first read, the step's later reads related."""
    _, read, backward = reads[0]
    runner = backward.detail["runner"]
    framework, clip = words.scaling_framework(runner)
    text = lambda event: " ".join(nodes.code(event.node).split())  # noqa: E731
    runs = "self.manual_backward(...)" if nodes.call_name(backward.node) == "manual_backward" else f"{runner}.backward(...)"
    message = (f"gradients are read after `{runs}`, which multiplies them by the loss scale when {framework} runs "
               f"float16 mixed precision, before its optimizer step unscales them; clip with `{clip}`, which unscales first")
    if len(reads) > 1:
        message += f" ({len(reads)} reads in this step)"
    related = tuple((other.node, f"also read before the step: `{text(other)}`") for _, other, _ in reads[1:])
    return read.node, message, {"related": related}


def _given_the_scale(read: Event, scaler: str) -> bool:
    """Whether the reading call is handed the scale or the scaler (``clip_gradients(model,
    max_norm, scale=scaler.get_scale())``): it reads the scaled gradients knowing their scale,
    and an ``unscale_`` before it would undo its own correction."""
    if not isinstance(read.node, cst.Call):
        return False
    for arg in read.node.args:
        value = arg.value
        if isinstance(value, cst.Call) and nodes.call_name(value) == "get_scale":
            return True
        if nodes.code(value) == scaler or (arg.keyword is not None and arg.keyword.value in ("scaler", "grad_scaler")):
            return True
    return False
