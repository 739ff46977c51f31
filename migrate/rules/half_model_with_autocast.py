"""AMP108: ``.half()`` / ``.to(torch.float16)`` on the model while also using autocast or a GradScaler."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._framework_loops import (ACCELERATE, CORRECT, DEEPSPEED, FABRIC, FACTORY, GRAD_SCALER, LIGHTNING,
                                              TIMM)
from migrate.rules._training_step import CORRECT_LOOP, CORRECT_TRAINER, TrainingStepRule
from migrate.step_model import Kind, Steps
from migrate.step_model.vocabulary import model_like
from migrate.tree_walk import descendants


class HalfModelWithAutocast(TrainingStepRule):
    """What it does:
    Reports ``model.half()`` or ``model.to(torch.float16)`` (on what the file trains or evaluates:
    an object whose ``parameters()``, ``train()`` or ``eval()`` it uses, or one named like a model)
    in a file that also runs autocast or a GradScaler, where both can run in one pass. A model
    the file freezes (``base_model.requires_grad_(False)``, or ``requires_grad = False`` on each
    of its parameters) is not reported: a float16 frozen base beside a trained float32 adapter
    updates no float16 weight.

    Why is this bad?
    Native mixed precision keeps the weights in float32 and lets autocast pick float16 per op.
    A float16 model keeps float16 master weights: small updates round away, and ``GradScaler``
    refuses to unscale float16 gradients ("Attempting to unscale FP16 gradients").

    Fix safety:
    No fix: removing the cast changes memory use and the dtype of everything the model returns.
    """

    CODE = "AMP108"
    MESSAGE = "the model is cast to float16 while autocast / a GradScaler manage precision; keep it in float32"
    TRIGGERS = ("autocast", "GradScaler")
    NEEDS_A_STEP = True

    FRAMEWORKS = {
        GRAD_SCALER: (
            "Reported: the model cast to float16 (`model.half()`, `.to(torch.float16)`) and run under autocast."
        ),
        FACTORY: "Reported as torch's.",
        TIMM: 'Reported: the same, whatever scales the loss.',
        ACCELERATE: 'Reported: a float16 model run in `with accelerator.autocast():`.',
        LIGHTNING: (
            "Reported only where the file's own autocast region runs a float16 model: Lightning's `16-mixed` "
            "autocast is set on the Trainer, elsewhere."
        ),
        FABRIC: 'Reported: a float16 model run in `with fabric.autocast():`.',
        DEEPSPEED: (
            "Not reported: DeepSpeed's fp16 (set in its configuration) keeps the model in float16 by design and "
            "runs in no autocast region of the file."
        ),
    }

    VALID = [
        Valid(CORRECT_LOOP),
        Valid(CORRECT_TRAINER),
        Valid(  # a frozen module of a ModuleList in float16
            "model = torch.nn.ModuleList([encoder, head]).cuda()\n"
            "model[0].half()\n"
            "model[0].requires_grad_(False)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "for x, y in loader:\n"
            "    with torch.autocast('cuda'):\n"
            "        loss = criterion(model[1].forward(model[0].forward(x)), y)\n"
            "    scaler.scale(loss).backward()\n"
            "    scaler.step(optimizer)\n"
            "    scaler.update()\n"
        ),
        Valid(
            "def train(base_model, adapter, optimizer, loader):\n"
            "    base_model.half()\n"
            "    base_model.requires_grad_(False)\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for x in loader:\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = adapter(base_model(x))\n"
            "        scaler.scale(loss).backward()\n"
        ),
        Valid(
            "class LoraTrainer:\n"
            "    def __init__(self, model, lora):\n"
            "        self.model = model.cuda().half()\n"
            "        for param in self.model.parameters():\n"
            "            param.requires_grad = False\n"
            "        self.lora = lora\n"
            "        self.scaler = torch.amp.GradScaler('cuda')\n"
            "\n"
            "    def step(self, x):\n"
            "        self.scaler.scale(self.lora(self.model(x))).backward()\n"
        ),
        Valid(
            "def train(model, x, fp16):\n"
            "    if fp16:\n"
            "        model.half()\n"
            "        model(x.half()).backward()\n"
            "    else:\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = model(x)\n"
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
        Invalid(  # one module of a ModuleList cast, the whole list trained
            "model = torch.nn.ModuleList([torch.nn.Linear(10, 20), torch.nn.Linear(20, 10)]).cuda()\n"
            "model[0].half()\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "for x, y in loader:\n"
            "    with torch.autocast('cuda'):\n"
            "        loss = torch.nn.functional.mse_loss(model[1].forward(model[0].forward(x)), y)\n"
            "    scaler.scale(loss).backward()\n"
            "    scaler.step(optimizer)\n"
            "    scaler.update()\n"
        ),
        Invalid(
            "def train(base_model, adapter, optimizer, loader):\n"
            "    base_model.half()\n"
            "    adapter.requires_grad_(False)\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for x in loader:\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = adapter(base_model(x))\n"
            "        scaler.scale(loss).backward()\n"
        ),
        Invalid(
            "def train(model, optimizer, loader):\n"
            "    model = model.cuda().half()\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for step, x in enumerate(loader):\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = model(x)\n"
            "        scaler.scale(loss).backward()\n"
        ),
        Invalid(
            "class Trainer:\n"
            "    def __init__(self, net):\n"
            "        self.net = net.to(torch.float16)\n"
            "        self.scaler = torch.amp.GradScaler('cuda')\n"
            "\n"
            "    def step(self, x):\n"
            "        self.net.train()\n"
            "        self.scaler.scale(self.net(x)).backward()\n"
        ),
        Invalid(
            "model.to(device, dtype=torch.half)\n"
            "while True:\n"
            "    with torch.autocast('cuda', dtype=torch.float16):\n"
            "        loss = model(next(data))\n"
            "    loss.backward()\n"
        ),
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            '    scaler = torch.amp.GradScaler("cuda")\n'
            "    model.half()\n"
            "    for x, y in loader:\n"
            '        with torch.autocast("cuda"):\n'
            "            loss = model(x, y)\n"
            "        scaler.scale(loss).backward()\n"
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
            "    model.half()\n"
            "    for x, y in loader:\n"
            '        with torch.autocast("cuda"):\n'
            "            loss = model(x, y)\n"
            "        scaler.scale(loss).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            framework=FACTORY,
        ),
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model, criterion, loader, optimizer, loss_scaler):\n"
            "    model.half()\n"
            "    for x, y in loader:\n"
            '        with torch.autocast("cuda"):\n'
            "            loss = criterion(model(x), y)\n"
            "        loss_scaler(loss, optimizer, parameters=model.parameters())\n"
            "        optimizer.zero_grad()\n",
            framework=TIMM,
        ),
        Invalid(
            "def train(model, optimizer, loader, accelerator):\n"
            "    model.half()\n"
            "    for x, y in loader:\n"
            "        with accelerator.autocast():\n"
            "            loss = model(x, y)\n"
            "        accelerator.backward(loss)\n"
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
            "    def __init__(self, net):\n"
            "        super().__init__()\n"
            "        self.net = net.half()\n"
            "\n"
            "    def training_step(self, batch, batch_idx):\n"
            '        with torch.autocast("cuda"):\n'
            "            return self.net(*batch)\n",
            framework=LIGHTNING,
        ),
        Invalid(
            "def train(model, optimizer, loader, fabric):\n"
            "    model.half()\n"
            "    for x, y in loader:\n"
            "        with fabric.autocast():\n"
            "            loss = model(x, y)\n"
            "        fabric.backward(loss)\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n",
            framework=FABRIC,
        ),
    ]

    def findings(self, model):
        frozen = None
        for steps, event in model.each(Kind.HALF):
            if not _model_like(event.node, model.facts.models):
                continue
            if frozen is None:
                frozen = _frozen(model.module)
            if ({_cast_receiver(event.node)} | event.bound()) & frozen:
                continue  # a frozen base model in float16 beside a trained adapter: nothing of it is updated
            if _evaluates(steps):
                continue
            managers = [e for e in steps.of(Kind.AUTOCAST, Kind.SCALER_NEW) if e.detail.get("enabled") is not False]
            if any(not steps.exclusive(event, other) for other in managers) or _run_under_autocast_elsewhere(model, steps, event):
                yield event.node, None, {}


def _run_under_autocast_elsewhere(model, steps: Steps, cast) -> bool:
    """Whether the attribute the cast makes float16 (``self.net = net.half()`` in ``__init__``)
    is run in an enabled autocast region of another method of the same class (a
    LightningModule's ``training_step``)."""
    cast_names = {name for name in {_cast_receiver(cast.node)} | cast.bound() if name and name.startswith("self.")}
    owner = model.facts.owner.get(id(steps.root))
    if not cast_names or owner is None:
        return False
    return any(model.facts.owner.get(id(other.root)) is owner and other is not steps and not _evaluates(other)
               and any(e.subject in cast_names and any(r.enabled is not False for r in e.regions())
                       for e in other.of(Kind.FORWARD))
               for other in model.roots)


def _evaluates(steps: Steps) -> bool:
    """An evaluation function (``evaluate``, ``predict``, ``test_step``) with no backward pass: a
    float16 copy of the weights for inference is a choice, not a mix-up."""
    name = getattr(getattr(steps.root, "name", None), "value", "").lower()
    return not steps.backwards() and any(word in name for word in ("eval", "predict", "infer", "test", "valid"))


def _model_like(cast: cst.Call, models: set[str]) -> bool:
    """Whether ``cast`` casts the model itself (``model.half()``, ``model.cuda().half()``), not a
    copy of it (``deepcopy(model).half()``, for a checkpoint) or a tensor."""
    receiver = _cast_receiver(cast)
    return receiver is not None and model_like(receiver.split("[", 1)[0], models)  # `model[0].half()`: a part of it


def _cast_receiver(cast: cst.Call) -> str | None:
    """``model`` for ``model.half()`` and ``model.cuda().half()``, ``model[0]`` for a module of a
    ``ModuleList``; None for a call's result."""
    receiver = _through_moves(cast.func.value)
    base = receiver
    while isinstance(base, cst.Subscript):
        base = base.value
    return nodes.code(receiver) if isinstance(base, (cst.Name, cst.Attribute)) else None


def _through_moves(node: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
            nodes.call_name(node) in ("cuda", "to", "half", "eval", "requires_grad_", "float"):
        node = node.func.value
    return node


def _frozen(module: cst.Module) -> set[str]:
    """The models the file freezes: ``vae.requires_grad_(False)``, ``model.eval().requires_grad_(False)``,
    or ``for p in model.parameters(): p.requires_grad = False``."""
    found: set[str] = set()
    for node in descendants(module):
        if type(node) is cst.Call and nodes.call_name(node) == "requires_grad_" and node.args \
                and nodes.code(node.args[0].value) == "False" and isinstance(node.func, cst.Attribute):
            found.add(nodes.code(_through_moves(node.func.value)))
        elif type(node) is cst.For and isinstance(node.iter, cst.Call) and nodes.call_name(node.iter) == "parameters" \
                and isinstance(node.iter.func, cst.Attribute) and _clears_requires_grad(node):
            found.add(nodes.code(node.iter.func.value))
    return found


def _clears_requires_grad(loop: cst.For) -> bool:
    target = nodes.code(loop.target)
    body = nodes.code(loop.body)
    return f"{target}.requires_grad = False" in body or f"{target}.requires_grad_(False)" in body
