"""AMP100: a training-step tensor pulled to the host every iteration."""
from __future__ import annotations

import re

import libcst as cst
from libcst.metadata import PositionProvider

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._framework_loops import (ACCELERATE, CORRECT, DEEPSPEED, FABRIC, FACTORY, GRAD_SCALER, LIGHTNING,
                                              TIMM)
from migrate.rules._training_step import CORRECT_LOOP, CORRECT_TRAINER, TrainingStepRule
from migrate.step_model import Arm, Event, Kind, Loop, Steps, Via
from migrate.step_model import vocabulary as words
from migrate.step_model.values import StepValues
from migrate.step_model.vocabulary import PULL_METHODS
from migrate.tree_walk import descendants



# A scaled training step, for the examples on which binding of a value reaches a read after it.
_SCALED_STEP = (
    "def train(model, opt, loader, scaler):\n"
    "    for x, y in loader:\n"
    "        loss = model(x, y)\n"
    "        scaler.scale(loss).backward()\n"
    "        scaler.step(opt)\n"
    "        scaler.update()\n"
)

class HostSyncEveryStep(TrainingStepRule):
    """What it does:
    Reports a step tensor read on the host in every iteration of the training loop:
    ``loss.item()``, ``float(loss)``, ``.cpu()``, ``.tolist()``, ``.numpy()``, ``print(loss)``,
    ``f"{loss}"``, ``"%.4f" % loss``, ``"{:.4f}".format(loss)``, or an ``if`` on its value (``if torch.isnan(loss):``, ``if grad_norm > max_norm:``).
    One finding per iteration: at its first read, the others listed as related places; a read in a
    helper the loop calls is reported at the call, the helper's line related. A helper of another
    file of the project, found from the file's imports (``metric_logger.update(**loss_dict)``
    whose ``update`` calls ``v.item()``, ``misc.check_nan_losses(loss)``), is reported at the call
    too, its file and line named in the message.

    A *step tensor* is computed, on the device, from the model's output, the loss, the parameters
    or their gradients; the reads are followed through assignments, unpacking, loops over
    containers, the file's helpers (their parameters and returns) and the functions the values
    go through; collectives (``reduce_dict``, ``accelerator.gather``) give tensors back, and a
    clip returns the gradients' norm (``grad_norm = model.clip_grad_norm_(1.0)``). Names are
    followed in the function that binds them: a setter's ``loss`` parameter is not the step's. A
    read sees the bindings that reach it through the function's control flow (the same
    reaching-definition query the migration asks): either arm of an ``if`` or a ``try``, the last
    step's value round the loop, not a binding on the other arm. Indices, shapes, lengths, batch values, tensors made from host values
    (``torch.tensor([len(x)])``, ``(schedule == t).nonzero()`` on sampled inputs) and values
    already pulled (``best = torch.argmax(out.cpu(), 1)``, then ``best[i].item()``: the
    ``.cpu()`` is where the GPU waits) are not.

    The training loop is the innermost loop that runs a backward pass or an optimizer step,
    written natively (``scaler.scale(loss).backward()``) or through a framework: timm's
    ``loss_scaler(loss, optimizer, ...)``, Accelerate's ``accelerator.backward(loss)``,
    Lightning's ``self.manual_backward(loss)`` (a ``training_step`` is one step), Fabric's
    ``fabric.backward(loss)``, DeepSpeed's ``engine.backward(loss)`` and ``engine.step()``, or its
    pipeline engine's ``loss = engine.train_batch()``. An
    out-of-memory retry loop around one batch is part of the iteration around it; a validation
    loop inside the training loop, a loop that clears the gradients of its backward passes
    without stepping (a scan for out-of-memory batches) and a ``test_...`` function (a unit test,
    whose reads are what it checks) are not training steps.

    Not reported: a read under a logging guard (``if step % log_every == 0:``,
    ``if rank == 0 and step % n == 0:``, every n seconds, once: ``if global_step == 0:``,
    ``if i == len(loader) - 1:``), or in a loop of its own that such an ``if`` of the training
    loop holds (a regulariser's accumulation loop every 16 steps), inside an ``if`` on the data (the test
    is what waits), after the loop. An ``if`` with a ``%`` that also steps the optimizer is a
    gradient-accumulation boundary, and one whose arms take turns at whole steps (a GAN's
    ``if (step // accum) % 2 == 0:``) is training, not a guard.

    Why is this bad?
    CUDA runs asynchronously: the host queues kernels and goes on. Reading a value on the host
    makes it wait until the GPU has computed it, so each step the queue drains and the GPU idles
    while the host prepares the next batch. With mixed precision the step is short, and this
    wait can cost a large part of it.

    Fix safety:
    No fix: accumulate on the device (``running_loss += loss.detach()``) and read the value
    every ``n`` steps, which changes what is logged. For an ``if`` on the loss, test it every n
    steps, or leave non-finite steps to ``GradScaler``, whose ``step`` skips them.
    """

    CODE = "AMP100"
    MESSAGE = "a training-step tensor is pulled to the host every iteration (the GPU waits each step)"
    # A mixed-precision step (fp32 loops are not this linter's), or a framework's step, whose
    # precision is set where the trainer is made: Lightning, Fabric, Accelerate, DeepSpeed.
    TRIGGERS = ("GradScaler", "autocast", "scaler", "amp", "apex", "manual_backward", "fabric", "accelerator",
                "deepspeed", "model_engine", "training_step", "train_batch")
    NEEDS_A_STEP = True

    FRAMEWORKS = {
        GRAD_SCALER: 'Reported: the loop around `scaler.scale(loss).backward()`.',
        FACTORY: (
            "Reported: a scaler a function of the project makes (`scaler = build_grad_scaler(cfg)`) is used as "
            "torch's."
        ),
        TIMM: 'Reported: `loss_scaler(loss, optimizer, ...)` is the whole step (backward, clip, step, update).',
        ACCELERATE: (
            "Reported: `accelerator.backward(loss)` is the backward pass; `accelerator.log({...})` of a pulled "
            "value waits as `print` does."
        ),
        LIGHTNING: (
            "Reported: a `training_step` is one step, whether Lightning runs the backward pass or "
            "`self.manual_backward(loss)` does."
        ),
        FABRIC: 'Reported: `fabric.backward(loss)` is the backward pass.',
        DEEPSPEED: (
            "Reported: `model_engine.backward(loss)` with `model_engine.step()`, or the pipeline engine's `loss ="
            " engine.train_batch()`."
        ),
    }

    VALID = [
        Valid(CORRECT_LOOP),
        Valid(CORRECT_TRAINER),
        Valid(  # an autograd Function given a tensor made on the host
            "def train(model, optimizer, loader, scaler):\n"
            "    for x, y in loader:\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = model(x, y)\n"
            "        count = float(AllReduce.apply(torch.tensor([len(y)])))\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
        ),
        Valid(
            "def train(model, opt, loader, scaler):\n"
            "    losses = []\n"
            "    for i, (x, y) in enumerate(loader):\n"
            "        loss = model(x, y)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(opt)\n"
            "        scaler.update()\n"
            "        losses.append(loss.detach())\n"
            "        if i % 100 == 0 or i == len(loader) - 1:\n"
            "            print(float(loss))\n"
            "    return torch.stack(losses).mean().item()\n"
        ),
        Valid(  # what a read sees is the binding that reaches it: here the batch size, never the loss
            _SCALED_STEP +
            "        shown = torch.tensor([len(x)])\n"
            "        if x.shape[0] > 1:\n"
            "            shown = loss.detach()\n"
            "        else:\n"
            "            print(shown.item())\n"
        ),
        Valid(
            "def evaluate(model, loader):\n"
            "    correct = 0\n"
            "    for x, y in loader:\n"
            "        correct += (model(x).argmax(1) == y).sum().item()\n"
            "    return correct\n"
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
        Invalid(  # DeepSpeed's pipeline engine: one call is the whole step, and returns the loss
            "def train(engine, loader, steps):\n"
            "    batches = iter(loader)\n"
            "    for step in range(steps):\n"
            "        loss = engine.train_batch(data_iter=batches)\n"
            "        print(f'step {step}: loss {loss.item()}')\n"
        ),
        Invalid(  # through an autograd Function (a collective written as one)
            "def train(model, optimizer, loader, scaler):\n"
            "    for x, y in loader:\n"
            "        with torch.autocast('cuda'):\n"
            "            outputs = model(x)\n"
            "        loss = criterion(outputs, y)\n"
            "        acc = 100.0 * outputs.argmax(1).eq(y).sum() / len(y)\n"
            "        meter.update(float(AllReduce.apply(acc)))\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
        ),
        Invalid(
            "import torch\n"
            "\n"
            "def train_one_epoch(model, criterion, loader, optimizer, loss_scaler, amp=True):\n"
            "    for samples, targets in loader:\n"
            "        with torch.autocast('cuda', enabled=amp):\n"
            "            loss = criterion(model(samples), targets)\n"
            "        loss_value = loss.item()\n"
            "        loss_scaler(loss, optimizer, clip_grad=None, parameters=model.parameters())\n"
            "        optimizer.zero_grad()\n"
        ),
        Invalid(
            "def train(model, optimizer, loader, scaler):\n"
            "    for x in loader:\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = model(x)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.unscale_(optimizer)\n"
            "        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "        if torch.isnan(loss) or grad_norm > 100:\n"
            "            print('skipping a bad step')\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
        ),
        Invalid(
            "def train(model, optimizer, loader, scaler):\n"
            "    total = 0.0\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = model(x, y)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "        total += loss.item()\n"
        ),
        Invalid(
            "def train(model, optimizer, data, scaler, max_steps):\n"
            "    step = 0\n"
            "    while step < max_steps:\n"
            "        logits = model(next(data))\n"
            "        loss = logits.logsumexp(-1).mean()\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "        print(f'step {step}: {loss}')\n"
            "        step += 1\n"
        ),
        Invalid(
            "class Trainer:\n"
            "    def fit(self, loader):\n"
            "        for batch in loader:\n"
            "            self.history.append(self.train_step(batch))\n"
            "\n"
            "    def train_step(self, batch):\n"
            "        outputs = self.model(batch['x'])\n"
            "        loss = self.criterion(outputs, batch['y'])\n"
            "        self.scaler.scale(loss).backward()\n"
            "        self.scaler.step(self.optimizer)\n"
            "        self.scaler.update()\n"
            "        return outputs.detach().cpu().numpy()\n"
        ),
        Invalid(
            "def train(model, optimizer, loader, scaler):\n"
            "    for epoch in range(10):\n"
            "        for i, (x, y) in enumerate(loader):\n"
            "            loss = model(x, y)\n"
            "            scaler.scale(loss).backward()\n"
            "            if (i + 1) % 4 == 0:\n"
            "                scaler.step(optimizer)\n"
            "                scaler.update()\n"
            "                print(float(loss))\n"
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
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "        print(f'loss {loss.item():.4f}')\n",
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
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "        print(f'loss {loss.item():.4f}')\n",
            framework=FACTORY,
        ),
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train_one_epoch(model, criterion, loader, optimizer, loss_scaler):\n"
            "    for samples, targets in loader:\n"
            '        with torch.autocast("cuda"):\n'
            "            loss = criterion(model(samples), targets)\n"
            "        loss_value = loss.item()\n"
            "        loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters())\n"
            "        optimizer.zero_grad()\n",
            framework=TIMM,
        ),
        Invalid(
            "def train(model, optimizer, loader, accelerator):\n"
            "    for x, y in loader:\n"
            "        loss = model(x, y)\n"
            "        accelerator.backward(loss)\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n"
            '        accelerator.log({"loss": loss.item()})\n',
            framework=ACCELERATE,
        ),
        Invalid(
            "import lightning as L\n"
            "\n"
            "\n"
            "class Model(L.LightningModule):\n"
            "    def training_step(self, batch, batch_idx):\n"
            "        loss = self.net(*batch)\n"
            '        self.log("loss", loss.item())\n'
            "        return loss\n",
            framework=LIGHTNING,
        ),
        Invalid(
            "def train(model, optimizer, loader, fabric):\n"
            "    for x, y in loader:\n"
            "        loss = model(x, y)\n"
            "        fabric.backward(loss)\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n"
            '        fabric.print(f"loss {loss.item():.4f}")\n',
            framework=FABRIC,
        ),
        Invalid(  # the loss reaches the read on one arm: on those steps the host waits
            _SCALED_STEP +
            "        if x.shape[0] > 1:\n"
            "            shown = loss.detach()\n"
            "        else:\n"
            "            shown = torch.zeros(())\n"
            "        print(shown.item())\n"
        ),
        Invalid(
            "def train(model_engine, loader):\n"
            "    for x, y in loader:\n"
            "        loss = model_engine(x, y)\n"
            "        model_engine.backward(loss)\n"
            "        model_engine.step()\n"
            '        print(f"loss {loss.item():.4f}")\n',
            framework=DEEPSPEED,
        ),
    ]

    def findings(self, model):
        # One finding per iteration: the first read on the host, the others related to it. A read
        # in a helper is reported at the call the loop makes, the helper's line related to it.
        reads: dict[int, tuple] = {}  # statement -> (steps, event, loop); a loop's walk beats a helper's own
        for steps, event in model.each(Kind.HOST_PULL):
            running, loop = steps.each_step(event)
            if not running or steps.guarded(event, loop) or event.detail.get("host"):
                continue  # `.item()` of what is already a numpy value
            statement = id(event.statements[-1]) if event.statements else id(event.node)
            earlier = reads.get(statement)
            if earlier is not None and (earlier[2] is not None or loop is None):
                continue
            if _waits(model, steps, event, loop):
                reads[statement] = (steps, event, loop)
        iterations: dict[int, list] = {}
        for steps, event, loop in reads.values():
            iterations.setdefault(id(loop.node) if loop else id(steps.root), []).append((steps, event, loop))
        for group in iterations.values():
            yield self._finding(sorted(group, key=lambda read: self._line(_anchor(read[1], read[2]))), model.facts.models)

    def _finding(self, group: list, models: set[str]) -> tuple:
        steps, event, loop = group[0]
        call = _anchor(event, loop)
        call = None if call is event.node else call
        related = [(other.node, f"also read on the host in the same iteration: `{_shown(other)}`") for _, other, _ in group[1:]]
        where = f"every iteration of the loop at line {self._line(loop.node)}" if loop else "every training step"
        root = _value_name(steps.values(models, through_calls=True), event.detail["pulled"])
        if event.detail.get("form") == "if":
            advice = "test it every n steps, or leave non-finite steps to the GradScaler, whose `step` skips them"
            what = f"`{_shown(event)}` waits for `{root}` on the host in {where} (the GPU idles each step)"
        elif event.detail.get("form") == "torch.tensor()":  # a list of device tensors made one on the host
            advice = f"stack them on the device (`torch.stack({root})`) and read that every n steps"
            what = f"`{_shown(event)}` copies training-step tensors to the host in {where} (the GPU waits each step)"
        else:
            running = "running_" + re.sub(r"\W+", "_", root.rsplit(".", 1)[-1]).strip("_")
            advice = f"accumulate on the device (`{running} += {root}.detach()`) and read it every n steps" \
                if root != "the value" else "accumulate on the device and read it every n steps"
            what = f"`{_shown(event)}` pulls a training-step tensor to the host in {where} (the GPU waits each step)"
        reader = event.detail.get("reader")
        if reader is not None:  # a helper of another file: its line is named, the call reported
            what = (f"`{_call_shown(event.node)}` reads a training-step tensor on the host in `{reader.label}` "
                    f"({reader.where}) in {where}")
            if event.detail.get("spread"):  # `update(**loss_dict)`: each value is read
                advice = f"accumulate the values of `{root}` on the device and hand them over every n steps"
        elif call is not None:
            related.insert(0, (event.node, f"the read, in the helper the loop calls: `{_shown(event)}`"))
            what = f"`{_call_shown(call)}` reads a training-step tensor on the host (line {self._line(event.node)}) in {where}"
        more = f"; {len(group) - 1} more read{'s' if len(group) > 2 else ''} in the same iteration" if len(group) > 1 else ""
        return (call or event.node), f"{what}{more}; {advice}", {"related": tuple(related)}

    def _line(self, node) -> int:
        return self.get_metadata(PositionProvider, node).start.line


def _waits(model, steps: Steps, event: Event, loop: Loop | None) -> bool:
    """Whether ``event`` makes the host wait for a step tensor (``StepValues``), and is not inside
    an ``if`` on the data (``if grad_norm > max_norm:``: the test is what waits, and is reported)."""
    # A tensor's own method says the value is a tensor: what any call computed from the step
    # counts. `print(x)` and `f"{x}"` take anything: only what is surely a step tensor does.
    form, tick = event.detail.get("form"), event.detail["tick"]
    if _decided_by_the_data(event, loop, steps.values(model.facts.models, through_calls=False)):
        return False
    values = steps.values(model.facts.models, through_calls=form in PULL_METHODS)
    at = (event.frames, event.statements[-1]) if event.statements else None
    return values.decides(event.detail["pulled"], tick, at) if form == "if" else values.holds_at(event.detail["pulled"], tick, at)


def _decided_by_the_data(event: Event, loop: Loop | None, values: StepValues) -> bool:
    """Whether an ``if`` within the step around ``event`` tests a step tensor's value."""
    return any(isinstance(frame, Arm) and values.decides(frame.node.test, event.detail["tick"],
                                                         (event.frames[:event.frames.index(frame)], frame.node))
               for frame in event.frames_inside(loop))


def _shown(event: Event) -> str:
    text = " ".join(nodes.code(event.node).split())
    return f"if {text}" if event.detail.get("form") == "if" else text


def _anchor(event: Event, loop: Loop | None):
    """Where a read is reported: the call the loop makes into the helper holding it, or itself."""
    return next((frame.node for frame in event.frames_inside(loop) if isinstance(frame, Via)), event.node)


def _value_name(values: StepValues, pulled) -> str:
    """The step tensor a read reads, as the code names it (``train_loss`` in
    ``not torch.isfinite(train_loss)``, ``loss`` in ``accelerator.gather(loss).mean()``)."""
    called = {id(node.func) for node in descendants(pulled) if type(node) is cst.Call}  # `loss.detach` is no value
    found = [node for node in descendants(pulled) if type(node) in (cst.Name, cst.Attribute) and id(node) not in called
             and nodes.code(node) not in ("self", "torch") and values.holds(node)]
    if type(pulled) is cst.Subscript and values.holds(pulled):
        return nodes.code(pulled)  # `v["loss"]` in `v["loss"].item()`
    named = [nodes.code(node) for node in found if not (type(node) is cst.Name and any(
        type(other) is cst.Attribute and nodes.code(other).startswith(node.value + ".") for other in found))]
    root = words.root_text(pulled)
    # a value the code does not name (`float(torch.nn.utils.clip_grad_norm_(...))`): no module's name stands for it
    return named[0] if named else (root if root and root not in ("self", "torch", "math", "np", "numpy") else "the value")


def _call_shown(call: cst.Call) -> str:
    """A call as one short line: ``compute_loss(...)`` where its arguments would not fit."""
    text = " ".join(nodes.code(call).split())
    return text if len(text) <= 60 else f"{nodes.code(call.func)}(...)"
