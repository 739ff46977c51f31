"""AMP105: a GradScaler created inside the training loop."""
from __future__ import annotations

import re

import libcst as cst

from migrate.rule import Invalid, Valid
from migrate.rules._framework_loops import (ACCELERATE, CORRECT, DEEPSPEED, FABRIC, FACTORY, GRAD_SCALER, LIGHTNING,
                                              TIMM)
from migrate.rules._training_step import CORRECT_LOOP, CORRECT_TRAINER, TrainingStepRule, made_each_iteration
from migrate.step_model import Event, Kind, Steps, Via


class GradScalerInLoop(TrainingStepRule):
    """What it does:
    Reports ``GradScaler(...)`` created in a loop that runs backward passes: in the training loop,
    in an epoch loop around it, or in a helper (``train_one_epoch``, ``train_step``) called there;
    also at the top of a function named for one epoch (``train_one_epoch``) that loops over its
    batches, where no function of the file calls it (its epoch loop is in another file).
    A function that runs a whole training (its own loop over epochs, or over a name bound to
    them: ``train_iterator = trange(args.num_train_epochs)``) may make its scaler, even
    when a search calls it once per trial, and so may a search's loop that makes it before its
    own loop over epochs. A scaler made by a factory or another class (timm's ``NativeScaler()``,
    ``build_grad_scaler(cfg)``) counts, except where the call that makes it binds a new optimizer
    too (a schedule that rebuilds the whole trainer). Nor is a scaler that the loop's call never
    makes: a literal argument turns the ``if`` around it false (an evaluation in the loop calling
    ``self._wrap_model(model, training=False)``, which makes it under ``if use_amp and training:``).

    Why is this bad?
    A new scaler starts again at its initial scale (65,536) with no memory of overflows: every
    iteration (or epoch) the first steps overflow and are skipped, and the scale never settles.

    Fix safety:
    No fix: create the scaler once, before the loop, and pass it to the helpers.

    Options:
    An autocast object created each iteration (``with torch.autocast("cuda"):``) is how autocast
    is meant to be used, and is not reported.
    """

    CODE = "AMP105"
    MESSAGE = "a GradScaler is created inside the training loop: its scale starts over each time"
    TRIGGERS = ("GradScaler", "scaler")  # torch's, or one a factory makes (`loss_scaler = NativeScaler()`)
    STEP_TRIGGERS = ("scaler",)  # a feature scaler is no loss scaler: only where a step is

    FRAMEWORKS = {
        GRAD_SCALER: 'Reported: `GradScaler(...)` made inside the training loop, or in a function named for one epoch.',
        FACTORY: (
            "Reported: a factory's scaler made inside the training loop; not where the call that makes it binds a"
            " new optimizer too (`model, optimizer, scaler = build_trainer(cfg)` when a schedule rebuilds the "
            "model)."
        ),
        TIMM: 'Reported: `NativeScaler()` made inside the training loop.',
        ACCELERATE: 'Not reported: the accelerator makes its scaler once, from its precision; the file makes none.',
        LIGHTNING: 'Not reported: the precision plugin makes its scaler once; the file makes none.',
        FABRIC: 'Not reported: Fabric makes its scaler once, from its precision; the file makes none.',
        DEEPSPEED: 'Not reported: the engine keeps its own loss scaler.',
    }

    VALID = [
        Valid(CORRECT_LOOP),
        Valid(CORRECT_TRAINER),
        Valid(  # a function that runs a whole training, named for what it trains
            "def train_epochs(model, criterion, data_loader, optimizer, epochs):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for epoch in range(epochs):\n"
            "        for samples, targets in data_loader:\n"
            "            with torch.autocast('cuda'):\n"
            "                loss = criterion(model(samples), targets)\n"
            "            scaler.scale(loss).backward()\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n"
        ),
        Valid(
            "def train(model, optimizer, loader, epochs):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for epoch in range(epochs):\n"
            "        for x in loader:\n"
            "            scaler.scale(model(x)).backward()\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n"
            "\n"
            "def search(trials, model, optimizer, loader):\n"
            "    for trial in range(trials):\n"
            "        train(model, optimizer, loader, epochs=10)\n"
        ),
        Valid(
            "def run(configs, model):\n"
            "    for config in configs:\n"
            "        scaler = torch.amp.GradScaler('cuda', enabled=config.amp)\n"
            "        evaluate(model, scaler)\n"
        ),
        Valid(  # one whole training per trial, written in the search's loop
            "for trial in range(args.trials):\n"
            "    model, optimizer = build(args, trial)\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for epoch in range(args.epochs):\n"
            "        for x in loader:\n"
            "            scaler.scale(model(x)).backward()\n"
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
        Valid(  # a schedule that rebuilds the whole trainer makes a new optimizer and scaler with it
            "def build_trainer(cfg):\n"
            "    model = build_model(cfg)\n"
            "    optimizer = build_optimizer(model, cfg)\n"
            "    loss_scaler = NativeScaler()\n"
            "    return model, optimizer, loss_scaler\n"
            "\n"
            "\n"
            "def train(cfg, loader):\n"
            "    model, optimizer, loss_scaler = build_trainer(cfg)\n"
            "    for epoch in range(cfg.epochs):\n"
            "        if epoch in cfg.long_cycle:\n"
            "            model, optimizer, loss_scaler = build_trainer(cfg)\n"
            "        for x, y in loader:\n"
            "            with torch.autocast('cuda'):\n"
            "                loss = model(x, y)\n"
            "            loss_scaler(loss, optimizer, parameters=model.parameters())\n"
            "            optimizer.zero_grad()\n",
            framework=TIMM,
        ),
    ]
    INVALID = [
        Invalid(  # called once per epoch by another file's loop
            "def train_one_epoch(model, criterion, data_loader, optimizer, epoch, args):\n"
            "    scaler = torch.amp.GradScaler('cuda', enabled=args.amp)\n"
            "    for samples, targets in data_loader:\n"
            "        with torch.autocast('cuda', enabled=args.amp):\n"
            "            loss = criterion(model(samples), targets)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
        ),
        Invalid(  # made in the epoch's function, whose loop runs the epoch's iterations
            "def train_one_epoch(model, optimizer, loader, total_it_each_epoch):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for cur_it in range(total_it_each_epoch):\n"
            "        scaler.scale(model(next(loader))).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "\n"
            "def train(model, optimizer, loader, epochs):\n"
            "    for epoch in range(epochs):\n"
            "        train_one_epoch(model, optimizer, loader, len(loader))\n"
        ),
        Invalid(
            "def train(model, optimizer, loader):\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        scaler = torch.amp.GradScaler('cuda')\n"
            "        scaler.scale(model(x, y)).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
        ),
        Invalid(
            "from torch.amp import GradScaler\n"
            "\n"
            "def train_one_epoch(model, optimizer, loader):\n"
            "    scaler = GradScaler('cuda')\n"
            "    for x in loader:\n"
            "        scaler.scale(model(x)).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "\n"
            "def main(model, optimizer, loader):\n"
            "    epoch = 0\n"
            "    while epoch < 90:\n"
            "        train_one_epoch(model, optimizer, loader)\n"
            "        epoch += 1\n"
        ),
        Invalid(
            "class Trainer:\n"
            "    def fit(self, loader):\n"
            "        for batch in loader:\n"
            "            self.train_step(batch)\n"
            "\n"
            "    def train_step(self, batch):\n"
            "        self.scaler = torch.amp.GradScaler('cuda')\n"
            "        self.scaler.scale(self.model(batch)).backward()\n"
            "        self.scaler.step(self.optimizer)\n"
            "        self.scaler.update()\n"
        ),
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            "    pass\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = model(x, y)\n"
            "        scaler = torch.amp.GradScaler('cuda')\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            framework=GRAD_SCALER,
        ),
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            "    pass\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = model(x, y)\n"
            "        scaler = build_grad_scaler(cfg)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            framework=FACTORY,
        ),
        Invalid(
            "import torch\n"
            "from timm.utils import NativeScaler\n"
            "\n"
            "\n"
            "def train(model, criterion, loader, optimizer):\n"
            "    for x, y in loader:\n"
            "        loss_scaler = NativeScaler()\n"
            '        with torch.autocast("cuda"):\n'
            "            loss = criterion(model(x), y)\n"
            "        loss_scaler(loss, optimizer, parameters=model.parameters())\n"
            "        optimizer.zero_grad()\n",
            framework=TIMM,
        ),
    ]

    def findings(self, model):
        for steps, event in model.each(Kind.SCALER_NEW):
            if made_each_iteration(steps, event):
                yield event.node, None, {}
            elif _made_per_epoch(steps, event):
                name = steps.root.name.value
                yield event.node, (f"a GradScaler is created in `{name}`, which its name says runs once per epoch: "
                                   "its scale starts over each epoch; create it once and pass it in"), {}


# A function that runs one epoch: `train_one_epoch`, `train_epoch`, `run_epoch`, `epoch_train`.
_PER_EPOCH = re.compile(r"(^|_)(one_)?epoch($|_)", re.IGNORECASE)


def _made_per_epoch(steps: Steps, created: Event) -> bool:
    """Whether the scaler is made at the top of a function named for one epoch that loops over
    its batches, and that no function of the file calls (its caller, another file's epoch loop,
    is not seen; one of this file's is judged by ``made_each_iteration``)."""
    root = steps.root
    if steps.entered or not isinstance(root, cst.FunctionDef) or not _PER_EPOCH.search(root.name.value):
        return False
    if created.loops() or any(isinstance(frame, Via) for frame in created.frames) or created.detail.get("enabled") is False:
        return False
    return any(backward.loops() for backward in steps.backwards())
