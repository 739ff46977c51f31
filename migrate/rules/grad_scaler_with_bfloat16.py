"""AMP106: a GradScaler used where autocast runs in bfloat16 only."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._framework_loops import (ACCELERATE, CORRECT, DEEPSPEED, FABRIC, FACTORY, GRAD_SCALER, LIGHTNING,
                                              TIMM)
from migrate.rules._training_step import CORRECT_LOOP, CORRECT_TRAINER, TrainingStepRule
from migrate.step_model import Event, Kind, StepModel, Steps
from migrate.step_model.vocabulary import joined_by, literal_bool


class GradScalerWithBfloat16(TrainingStepRule):
    """What it does:
    Reports a ``GradScaler`` that is always enabled where every autocast region of the steps it
    scales runs in ``torch.bfloat16`` (a CPU autocast, or ``dtype=torch.bfloat16``): the regions
    of the function that makes it and of the functions whose backward pass it scales; where
    none of those is known (made in ``__init__``, used elsewhere), the file's regions. A scaler
    enabled only for float16 (``GradScaler(enabled=dtype == torch.float16)``) is not reported,
    nor is one where any of those regions' dtype is float16 or computed; one enabled by the flag
    that enables the bfloat16 regions (``enabled=hps.bf16_run`` on both, or
    ``enabled=hps.amp and hps.grad_scaling`` beside ``autocast(enabled=hps.amp)``) is.

    Why is this bad?
    bfloat16 has float32's exponent range: its gradients do not underflow, so loss scaling
    protects nothing. The scaler still multiplies and divides every gradient, checks them all for
    inf/NaN and syncs with the host each step.

    Fix safety:
    No fix: drop the scaler (or pass ``enabled=False``) and keep ``loss.backward()`` and
    ``optimizer.step()``, which is several edits.
    """

    CODE = "AMP106"
    MESSAGE = "a GradScaler with autocast in bfloat16 only: bfloat16 needs no loss scaling"
    TRIGGERS = ("GradScaler", "scaler")  # the scaler is what it reports: torch's, or a factory's
    STEP_TRIGGERS = ("scaler",)  # a feature scaler is no loss scaler: only where a step is

    FRAMEWORKS = {
        GRAD_SCALER: 'Reported: an always-enabled `GradScaler` beside autocast regions that are all bfloat16.',
        FACTORY: (
            "Not reported: whether what the factory returns is enabled is the factory's to say "
            "(`get_grad_scaler(cfg)` often returns a disabled one for bfloat16); one given `enabled=True` is "
            "judged as torch's."
        ),
        TIMM: (
            "Reported: timm's `NativeScaler()` (and the `NativeScalerWithGradNormCount` of MAE, DeiT and "
            "ConvNeXt) is always enabled."
        ),
        ACCELERATE: 'Not reported: `mixed_precision="bf16"` makes no scaler.',
        LIGHTNING: 'Not reported: `precision="bf16-mixed"` makes no scaler.',
        FABRIC: 'Not reported: `Fabric(precision="bf16-mixed")` makes no scaler.',
        DEEPSPEED: 'Not reported: bfloat16 in the configuration uses no loss scale.',
    }

    VALID = [
        Valid(CORRECT_LOOP),
        Valid(CORRECT_TRAINER),
        Valid(
            "def train(model, optimizer, loader, args):\n"
            "    scaler = torch.amp.GradScaler('cuda', enabled=args.fp16)\n"
            "    for x in loader:\n"
            "        with torch.autocast('cuda', enabled=args.bf16, dtype=torch.bfloat16):\n"
            "            loss = model(x)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
        ),
        Valid(
            "def pretrain(model, loader):\n"
            "    for x in loader:\n"
            "        with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "            model(x).backward()\n"
            "\n"
            "\n"
            "def finetune(model, optimizer, loader):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for x in loader:\n"
            "        with torch.autocast('cuda', dtype=torch.float16):\n"
            "            loss = model(x)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
        ),
        Valid(
            "def train(model, loader, dtype):\n"
            "    scaler = torch.amp.GradScaler('cuda', enabled=dtype == torch.float16)\n"
            "    for x in loader:\n"
            "        with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "            loss = model(x)\n"
            "        scaler.scale(loss).backward()\n"
        ),
        Valid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            "    scaler = build_grad_scaler(cfg)\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "            loss = model(x, y)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            framework=FACTORY,
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
        Invalid(  # on only where the bfloat16 region is: `amp and grad_scaling` implies `amp`
            "class Pipeline:\n"
            "    def __init__(self, model, optimizer, enable_amp, enable_grad_scaling):\n"
            "        self.model, self.optimizer, self.enable_amp = model, optimizer, enable_amp\n"
            "        self.scaler = torch.amp.GradScaler('cuda', enabled=self.enable_amp and enable_grad_scaling)\n"
            "\n"
            "    def step(self, batch):\n"
            "        with torch.autocast('cuda', dtype=torch.bfloat16, enabled=self.enable_amp):\n"
            "            loss = self.model(batch)\n"
            "        self.scaler.scale(loss).backward()\n"
            "        self.scaler.step(self.optimizer)\n"
            "        self.scaler.update()\n"
        ),
        Invalid(
            "def train(model, optimizer, loader, hps):\n"
            "    scaler = torch.amp.GradScaler('cuda', enabled=hps.bf16_run)\n"
            "    for x in loader:\n"
            "        with torch.autocast('cuda', enabled=hps.bf16_run, dtype=torch.bfloat16):\n"
            "            loss = model(x)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
        ),
        Invalid(
            "def evaluate_fp16(model, loader):\n"
            "    with torch.autocast('cuda', dtype=torch.float16):\n"
            "        return [model(x) for x in loader]\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for x in loader:\n"
            "        with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "            loss = model(x)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
        ),
        Invalid(
            "def train(model, optimizer, loader):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for i, x in enumerate(loader):\n"
            "        with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "            loss = model(x)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
        ),
        Invalid(
            "class Trainer:\n"
            "    def __init__(self, model):\n"
            "        self.model = model\n"
            "        self.scaler = torch.amp.GradScaler('cuda', enabled=True)\n"
            "\n"
            "    def forward(self, batch):\n"
            "        with torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n"
            "            return self.model(batch)\n"
        ),
        Invalid(
            "from torch.amp import GradScaler\n"
            "\n"
            "scaler = GradScaler('cpu')\n"
            "while True:\n"
            "    with torch.autocast('cpu'):\n"
            "        loss = model(next(data))\n"
            "    scaler.scale(loss).backward()\n"
        ),
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "            loss = model(x, y)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            framework=GRAD_SCALER,
        ),
        Invalid(
            "import torch\n"
            "from timm.utils import NativeScaler\n"
            "\n"
            "\n"
            "def train(model, criterion, loader, optimizer):\n"
            "    loss_scaler = NativeScaler()\n"
            "    for x, y in loader:\n"
            '        with torch.autocast("cuda", dtype=torch.bfloat16):\n'
            "            loss = criterion(model(x), y)\n"
            "        loss_scaler(loss, optimizer, parameters=model.parameters())\n"
            "        optimizer.zero_grad()\n",
            framework=TIMM,
        ),
    ]

    def findings(self, model):
        for steps, event in model.each(Kind.SCALER_NEW):
            enabled = nodes.argument(event.node, None, "enabled")
            if event.detail.get("factory") and event.detail.get("enabled") is not True and enabled is None:
                continue  # `get_grad_scaler(cfg)`: whether what it makes is enabled is the factory's to say
            autocasts = _regions_of_its_steps(model, steps, event) or model.all_events(Kind.AUTOCAST)
            autocasts = [e for e in autocasts if e.detail.get("enabled") is not False]
            if not autocasts or any(e.detail.get("dtype") != "bfloat16" for e in autocasts):
                continue
            # always on, or on only when the bfloat16 regions are (`enabled=args.bf16` on both,
            # `enabled=amp and grad_scaling` with `autocast(enabled=amp)`)
            if enabled is None or literal_bool(enabled.value) is True or all(
                    _enabled_text(e) in joined_by(enabled.value, cst.And) for e in autocasts):
                yield event.node, None, {}


def _enabled_text(autocast: Event) -> str | None:
    given = nodes.argument(autocast.node, None, "enabled") if isinstance(autocast.node, cst.Call) else None
    return nodes.code(given.value) if given is not None else None


def _regions_of_its_steps(model: StepModel, steps: Steps, created: Event) -> list[Event]:
    """The autocast regions of the steps that use the scaler made at ``created``: in the function
    that makes it, and in every function whose backward pass it scales. Empty where none is
    known (a scaler made in ``__init__`` and used in another file): the file's regions decide."""
    names = created.bound()
    users = [other for other in model.roots if other is steps or any(
        backward.scaler in names for backward in other.backwards())]
    return [event for user in users for event in user.of(Kind.AUTOCAST)]

