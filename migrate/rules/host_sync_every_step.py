"""AMP100: a training-step tensor pulled to the host every iteration."""
from __future__ import annotations

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._training_step import CORRECT_LOOP, CORRECT_TRAINER, TrainingStepRule
from migrate.step_model import Kind

_ALWAYS = ("item",)  # only a tensor (or a numpy scalar) has it: no need to know where the value came from
_OF_TENSORS = ("cpu", "tolist", "numpy")


class HostSyncEveryStep(TrainingStepRule):
    """What it does:
    Reports a value of the training step (the loss, the model's outputs and what is computed from
    them) read on the host in every iteration: ``loss.item()``, ``float(loss)``, ``.cpu()``,
    ``.tolist()``, ``.numpy()``, ``print(loss)`` or ``f"{loss}"``. A read under a logging guard
    (``if step % log_every == 0:``, ``if rank == 0 and step % n == 0:``), after the loop, or of a
    value already pulled (``best = torch.argmax(out.cpu(), 1)``, then ``best[i].item()``: the
    ``.cpu()`` is where the GPU waits; what a function of the file returns as ``loss.cpu()``) is
    not reported; an ``if`` with a ``%`` that also steps the optimizer is a gradient-accumulation
    boundary, not a guard.

    Why is this bad?
    CUDA runs asynchronously: the host queues kernels and goes on. Reading a value on the host
    makes it wait until the GPU has computed it, so each step the queue drains and the GPU idles
    while the host prepares the next batch. With mixed precision the step is short, and this
    wait can cost a large part of it.

    Fix safety:
    No fix: accumulate on the device (``running += loss.detach()``) and read the value every
    ``n`` steps, which changes what is logged.
    """

    CODE = "AMP100"
    MESSAGE = "a training-step tensor is pulled to the host every iteration (the GPU waits each step)"
    TRIGGERS = ("GradScaler", "autocast", "scaler", "amp", "apex")  # a mixed-precision step: fp32 loops are not this linter's
    NEEDS_A_STEP = True

    VALID = [
        Valid(CORRECT_LOOP),
        Valid(CORRECT_TRAINER),
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
        Valid(
            "def evaluate(model, loader):\n"
            "    correct = 0\n"
            "    for x, y in loader:\n"
            "        correct += (model(x).argmax(1) == y).sum().item()\n"
            "    return correct\n"
        ),
    ]
    INVALID = [
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
    ]

    def findings(self, model):
        reported: set[int] = set()  # one finding per statement: `print(f"{a.item()} {b.item()}")` is one wait
        for steps, event in model.each(Kind.HOST_PULL):
            running, loop = steps.each_step(event)
            if not running or steps.guarded(event, loop):
                continue
            form = event.detail.get("form")
            tensor = event.subject in steps.tensors()
            statement = id(event.statements[-1]) if event.statements else id(event.node)
            if statement in reported:
                continue
            if event.detail.get("host"):
                continue  # `.item()` of what is already a numpy value
            if form in _ALWAYS or (form in _OF_TENSORS and tensor) or (tensor and event.detail.get("bare")):
                reported.add(statement)
                yield event.node, f"`{nodes.code(event.node)}` pulls a training-step tensor to the host every iteration " \
                                  "(the GPU waits each step); accumulate on the device and read it under a logging guard", {}
