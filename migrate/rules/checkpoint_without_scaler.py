"""AMP107: a checkpoint with the model's and the optimizer's state but not the scaler's."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._training_step import CORRECT_LOOP, CORRECT_TRAINER, TrainingStepRule, made_each_iteration
from migrate.step_model import Kind, StepModel, Steps
from migrate.step_model.vocabulary import optimizer_like
from migrate.tree_walk import descendants


class CheckpointWithoutScaler(TrainingStepRule):
    """What it does:
    Reports a checkpoint (``torch.save({...})``, or the file's own ``save_checkpoint({...})``)
    whose dictionary holds a model's and an optimizer's ``state_dict()`` but nothing from the
    GradScaler, in a file that scales its losses with one. Entries added to the dictionary
    later in the same function (``state["scaler"] = scaler.state_dict()``) count. A scaler that
    is made but never scales, steps or updates, or that is made anew in the training loop (AMP105:
    fix that first), holds no state worth keeping.

    Why is this bad?
    A run resumed from it starts the scaler again at its initial scale (65,536): the first steps
    after each resume overflow and are skipped until the scale has fallen back, and the growth
    tracker starts from zero. Training does not continue as it would have.

    Fix safety:
    No fix: add ``"scaler": scaler.state_dict()`` to the checkpoint and
    ``scaler.load_state_dict(checkpoint["scaler"])`` where it is loaded.
    """

    CODE = "AMP107"
    MESSAGE = "the checkpoint saves the model and the optimizer but not the GradScaler's state"
    TRIGGERS = ("GradScaler",)  # only where the file creates one

    VALID = [
        Valid(CORRECT_LOOP),
        Valid(CORRECT_TRAINER),
        Valid(
            "def save(model, optimizer, path):\n"
            "    torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, path)\n"
        ),
        Valid(  # the scaler's calls commented out: it never scales, and has no state
            "def train(model, optimizer, loader):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for x in loader:\n"
            "        loss = model(x)\n"
            "        loss.backward()  # scaler.scale(loss).backward()\n"
            "        optimizer.step()  # scaler.step(optimizer); scaler.update()\n"
            "    torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, 'last.pt')\n"
        ),
        Valid(  # made anew each epoch (AMP105 reports that): no scale outlives the epoch
            "class Trainer:\n"
            "    def fit(self, loader, epochs):\n"
            "        for epoch in range(epochs):\n"
            "            self.run_epoch(loader)\n"
            "            torch.save({'net': self.net.state_dict(), 'opt': self.opt.state_dict()}, 'last.pt')\n"
            "\n"
            "    def run_epoch(self, loader):\n"
            "        scaler = torch.amp.GradScaler('cuda')\n"
            "        for batch in loader:\n"
            "            scaler.scale(self.net(batch)).backward()\n"
            "            scaler.step(self.opt)\n"
            "            scaler.update()\n"
        ),
    ]
    INVALID = [
        Invalid(
            "def train(model, optimizer, loader, epochs):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for epoch in range(epochs):\n"
            "        for x in loader:\n"
            "            scaler.scale(model(x)).backward()\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n"
            "        torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'epoch': epoch}, 'last.pt')\n"
        ),
        Invalid(
            "class Trainer:\n"
            "    def __init__(self, model, optimizer):\n"
            "        self.model, self.optimizer = model, optimizer\n"
            "        self.scaler = torch.amp.GradScaler('cuda')\n"
            "\n"
            "    def train_step(self, batch):\n"
            "        self.scaler.scale(self.model(batch)).backward()\n"
            "        self.scaler.step(self.optimizer)\n"
            "        self.scaler.update()\n"
            "\n"
            "    def save(self, path):\n"
            "        state = {'model': self.model.state_dict()}\n"
            "        state['optimizer'] = self.optimizer.state_dict()\n"
            "        torch.save(state, path)\n"
        ),
        Invalid(
            "def main(model, optimizer, loader):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    step = 0\n"
            "    while step < 100:\n"
            "        scaler.scale(model(next(loader))).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "        step += 1\n"
            "    save_checkpoint({'state_dict': model.module.state_dict(), 'optimizer': optimizer.state_dict()}, is_best=True)\n"
        ),
        Invalid(  # the loop that scales is in another file: the scaler is handed to it
            "from engine import train_loop\n"
            "\n"
            "def main(model, optimizer, loader, epochs):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for epoch in range(epochs):\n"
            "        train_loop(model, optimizer, scaler, loader)\n"
            "        torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, 'last.pt')\n"
        ),
    ]

    def findings(self, model):
        scalers = model.facts.scalers
        made = list(model.each(Kind.SCALER_NEW))
        if not scalers or not made:
            return
        anew = {id(event.node) for steps, event in made if made_each_iteration(steps, event)}  # in any walk
        if all(id(event.node) in anew for _, event in made):
            return
        if not _used(model):
            return
        for steps, event in model.each(Kind.SAVE):
            entries = _entries(steps, event)
            if entries is None:
                continue
            owners = [nodes.code(v.func.value) for v in entries if _state_dict(v)]
            optimizers = [o for o in owners if optimizer_like(o) or o in model.facts.optimizers]
            models = [o for o in owners if o not in optimizers and "sched" not in o.lower() and o not in scalers]
            saved = any(o in scalers or "scaler" in o.lower() for o in owners) or any(
                "scaler" in nodes.code(v).lower() for v in entries)
            if optimizers and models and not saved:
                yield event.node, None, {}


def _used(model: StepModel) -> bool:
    """Whether a scaler of the file scales, steps or updates, or is read anywhere but where it is
    made: handed to a training loop in another file (``train_loop(model, scaler, ...)``)."""
    if model.scaled() or model.all_events(Kind.SCALER_STEP, Kind.UPDATE, Kind.UNSCALE):
        return True
    made: set[int] = set()
    for node in descendants(model.module):
        kind = type(node)
        if kind is cst.AssignTarget or kind is cst.AnnAssign:
            made.add(id(node.target))
        elif (kind is cst.Name or kind is cst.Attribute) and id(node) not in made and nodes.code(node) in model.facts.scalers:
            return True
    return False


def _state_dict(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Call) and nodes.call_name(value) == "state_dict" and isinstance(value.func, cst.Attribute)


def _entries(steps: Steps, event) -> list[cst.BaseExpression] | None:
    """The keys and values of the dictionary a save call writes, with those added to it later."""
    call = event.node
    first = call.args[0].value if call.args else None
    name = None
    if isinstance(first, (cst.Name, cst.Attribute)):
        name = nodes.code(first)
        bound = [a for a in steps.assigned(name) if isinstance(a.value, cst.Dict)]
        if not bound:
            return None
        first = bound[-1].value
    if not isinstance(first, cst.Dict):
        return None
    found = [part for element in first.elements if isinstance(element, cst.DictElement)
             for part in (element.key, element.value)]
    if name is not None:
        items = steps.items_assigned(name)
        found += list({id(a): a.value for a, _ in items}.values())  # one value per assignment
        found += [cst.SimpleString(repr(t)) for _, t in items]
    return found
