"""AMP104: ``backward()`` inside an autocast region."""
from __future__ import annotations

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._framework_loops import (ACCELERATE, CORRECT, DEEPSPEED, FABRIC, FACTORY, GRAD_SCALER, LIGHTNING,
                                              TIMM)
from migrate.rules._training_step import CORRECT_LOOP, CORRECT_TRAINER, TrainingStepRule
from migrate.step_model import Kind


class BackwardInsideAutocast(TrainingStepRule):
    """What it does:
    Reports a backward pass (``loss.backward()``, ``scaler.scale(loss).backward()``) run inside a
    ``with torch.autocast(...)`` block, directly or in a helper called there, one of another file
    of the project too (found from the file's imports; the call is reported, naming the helper's line). A block with
    ``enabled=False`` inside the region turns it off.

    Why is this bad?
    PyTorch's AMP documentation advises against it: the backward ops run in the dtype autocast
    chose for their forward ops anyway, and autocast inside the backward pass only adds casts
    (and, for a custom backward, can cast what the forward left in float32).

    Fix safety:
    No fix: the ``with`` block has to end after the loss is computed, which moves code out of it.
    """

    CODE = "AMP104"
    MESSAGE = "`backward()` inside an autocast region; end the `with autocast` block after the loss"
    TRIGGERS = ("autocast",)
    NEEDS_A_STEP = True

    FRAMEWORKS = {
        GRAD_SCALER: 'Reported: `scaler.scale(loss).backward()` inside `with autocast(...)`.',
        FACTORY: "Reported as torch's.",
        TIMM: 'Reported: `loss_scaler(loss, ...)` inside the autocast region runs the backward pass there.',
        ACCELERATE: (
            "Reported: `accelerator.backward(loss)` inside `with accelerator.autocast():` or a torch autocast "
            "region."
        ),
        LIGHTNING: 'Reported: `self.manual_backward(loss)` inside a torch autocast region of the step.',
        FABRIC: 'Reported: `fabric.backward(loss)` inside `with fabric.autocast():`.',
        DEEPSPEED: 'Reported: `model_engine.backward(loss)` inside a torch autocast region.',
    }

    VALID = [
        Valid(CORRECT_LOOP),
        Valid(CORRECT_TRAINER),
        Valid(
            "def train(model, loader):\n"
            "    for x in loader:\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = model(x)\n"
            "            with torch.autocast('cuda', enabled=False):\n"
            "                loss.float().backward()\n"
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
            "    for x, y in loader:\n"
            "        with torch.autocast('cuda', dtype=torch.float16):\n"
            "            loss = model(x, y)\n"
            "            scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
        ),
        Invalid(
            "from torch.amp import autocast\n"
            "\n"
            "def train(model, optimizer, data):\n"
            "    step = 0\n"
            "    while step < 1000:\n"
            "        with autocast('cuda'):\n"
            "            loss = model(next(data))\n"
            "            loss.backward()\n"
            "        step += 1\n"
        ),
        Invalid(
            "class Trainer:\n"
            "    def train_step(self, batch):\n"
            "        with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "            loss = self.model(batch)\n"
            "            self.backward(loss)\n"
            "\n"
            "    def backward(self, loss):\n"
            "        self.scaler.scale(loss).backward()\n"
        ),
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            '    scaler = torch.amp.GradScaler("cuda")\n'
            "    for x, y in loader:\n"
            '        with torch.autocast("cuda"):\n'
            "            loss = model(x, y)\n"
            "            scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            framework=GRAD_SCALER,
        ),
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader, cfg):\n"
            "    scaler = build_grad_scaler(cfg)\n"
            "    for x, y in loader:\n"
            '        with torch.autocast("cuda"):\n'
            "            loss = model(x, y)\n"
            "            scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            framework=FACTORY,
        ),
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model, criterion, loader, optimizer, loss_scaler):\n"
            "    for x, y in loader:\n"
            '        with torch.autocast("cuda"):\n'
            "            loss = criterion(model(x), y)\n"
            "            loss_scaler(loss, optimizer, parameters=model.parameters())\n"
            "        optimizer.zero_grad()\n",
            framework=TIMM,
        ),
        Invalid(
            "def train(model, optimizer, loader, accelerator):\n"
            "    for x, y in loader:\n"
            "        with accelerator.autocast():\n"
            "            loss = model(x, y)\n"
            "            accelerator.backward(loss)\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n",
            framework=ACCELERATE,
        ),
        Invalid(
            "import lightning as L\n"
            "import torch\n"
            "\n"
            "\n"
            "class Model(L.LightningModule):\n"
            "    def training_step(self, batch, batch_idx):\n"
            "        opt = self.optimizers()\n"
            '        with torch.autocast("cuda", dtype=torch.bfloat16):\n'
            "            loss = self.net(*batch)\n"
            "            self.manual_backward(loss)\n"
            "        opt.step()\n"
            "        opt.zero_grad()\n",
            framework=LIGHTNING,
        ),
        Invalid(
            "def train(model, optimizer, loader, fabric):\n"
            "    for x, y in loader:\n"
            "        with fabric.autocast():\n"
            "            loss = model(x, y)\n"
            "            fabric.backward(loss)\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n",
            framework=FABRIC,
        ),
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model_engine, loader):\n"
            "    for x, y in loader:\n"
            '        with torch.autocast("cuda", dtype=torch.bfloat16):\n'
            "            loss = model_engine(x, y)\n"
            "            model_engine.backward(loss)\n"
            "        model_engine.step()\n",
            framework=DEEPSPEED,
        ),
    ]

    def findings(self, model):
        for _, event in model.each(Kind.BACKWARD):
            regions = event.regions()
            if regions and regions[-1].enabled is not False:
                yield event.node, None, {}
        for _, event in model.each(Kind.BACKWARD_ELSEWHERE):  # a helper of another file the region calls
            regions = event.regions()
            if regions and regions[-1].enabled is not False:
                reader = event.detail["reader"]
                call = " ".join(nodes.code(event.node).split())
                shown = call if len(call) <= 60 else f"{nodes.code(event.node.func)}(...)"
                yield event.node, (f"`{shown}` runs a backward pass (`{reader.label}`, {reader.backward}) inside an "
                                   "autocast region; end the `with autocast` block after the loss"), {}
