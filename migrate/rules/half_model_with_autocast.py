"""AMP108: ``.half()`` / ``.to(torch.float16)`` on the model while also using autocast or a GradScaler."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._training_step import CORRECT_LOOP, CORRECT_TRAINER, TrainingStepRule
from migrate.step_model import Kind, Steps
from migrate.step_model.vocabulary import model_like


class HalfModelWithAutocast(TrainingStepRule):
    """What it does:
    Reports ``model.half()`` or ``model.to(torch.float16)`` (on what the file trains or evaluates:
    an object whose ``parameters()``, ``train()`` or ``eval()`` it uses, or one named like a model)
    in a file that also runs autocast or a GradScaler, where both can run in one pass.

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

    VALID = [
        Valid(CORRECT_LOOP),
        Valid(CORRECT_TRAINER),
        Valid(
            "def train(model, x, fp16):\n"
            "    if fp16:\n"
            "        model.half()\n"
            "        model(x.half()).backward()\n"
            "    else:\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = model(x)\n"
        ),
    ]
    INVALID = [
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
    ]

    def findings(self, model):
        for steps, event in model.each(Kind.HALF):
            if not _model_like(event.node, model.facts.models):
                continue
            if _evaluates(steps):
                continue
            managers = [e for e in steps.of(Kind.AUTOCAST, Kind.SCALER_NEW) if e.detail.get("enabled") is not False]
            if any(not steps.exclusive(event, other) for other in managers):
                yield event.node, None, {}


def _evaluates(steps: Steps) -> bool:
    """An evaluation function (``evaluate``, ``predict``, ``test_step``) with no backward pass: a
    float16 copy of the weights for inference is a choice, not a mix-up."""
    name = getattr(getattr(steps.root, "name", None), "value", "").lower()
    return not steps.backwards() and any(word in name for word in ("eval", "predict", "infer", "test", "valid"))


def _model_like(cast: cst.Call, models: set[str]) -> bool:
    """Whether ``cast`` casts the model itself (``model.half()``, ``model.cuda().half()``), not a
    copy of it (``deepcopy(model).half()``, for a checkpoint) or a tensor."""
    receiver = cast.func.value
    while isinstance(receiver, cst.Call) and nodes.call_name(receiver) in ("cuda", "to") and isinstance(receiver.func, cst.Attribute):
        receiver = receiver.func.value
    if not isinstance(receiver, (cst.Name, cst.Attribute)):
        return False
    return model_like(nodes.code(receiver), models)
