"""AMP107: a checkpoint with the model's and the optimizer's state but not the scaler's."""
from __future__ import annotations

import functools

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider

from migrate import apex_nodes as nodes
from migrate.rule import FixSafety, Invalid, Valid
from migrate.rules._checkpoint_entries import entries_saved, optimizers_container, state_dicts
from migrate.rules._scaler_in_checkpoint import one_per_line, scaler_in_reach, with_scaler_entry
from migrate.rules._framework_loops import (ACCELERATE, CORRECT, DEEPSPEED, FABRIC, FACTORY, GRAD_SCALER, LIGHTNING,
                                              TIMM)
from migrate.rules._training_step import CORRECT_LOOP, CORRECT_TRAINER, TrainingStepRule, made_each_iteration
from migrate.step_model import Kind, StepModel, Steps
from migrate.step_model.shapes import parameters_given, parameters_of
from migrate.step_model.vocabulary import makes_a_scaler, optimizer_like
from migrate.tree_walk import descendants


# The INVALID examples that are fixed, and the saves the fix grows: a line past 88 characters
# (or past the file's longest) is broken one entry per line.
_EPOCH_SAVE = "        torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'epoch': epoch}, 'last.pt')\n"
_EPOCH_SAVE_FIXED = (
    "        torch.save({\n"
    "            'model': model.state_dict(),\n"
    "            'optimizer': optimizer.state_dict(),\n"
    "            'epoch': epoch,\n"
    "            'scaler': scaler.state_dict(),\n"
    "        }, 'last.pt')\n")
_LOCAL = (
    "def train(model, optimizer, loader, epochs):\n"
    "    scaler = torch.amp.GradScaler('cuda')\n"
    "    for epoch in range(epochs):\n"
    "        for x in loader:\n"
    "            scaler.scale(model(x)).backward()\n"
    "            scaler.step(optimizer)\n"
    "            scaler.update()\n" + _EPOCH_SAVE)

_BEST_SAVE = "    save_checkpoint({'state_dict': model.module.state_dict(), 'optimizer': optimizer.state_dict()}, is_best=True)\n"
_BEST_SAVE_FIXED = (
    "    save_checkpoint({\n"
    "        'state_dict': model.module.state_dict(),\n"
    "        'optimizer': optimizer.state_dict(),\n"
    "        'scaler': scaler.state_dict(),\n"
    "    }, is_best=True)\n")
_WHILE = (
    "def main(model, optimizer, loader):\n"
    "    scaler = torch.amp.GradScaler('cuda')\n"
    "    step = 0\n"
    "    while step < 100:\n"
    "        scaler.scale(model(next(loader))).backward()\n"
    "        scaler.step(optimizer)\n"
    "        scaler.update()\n"
    "        step += 1\n" + _BEST_SAVE)

_LAST_SAVE = "        torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, 'last.pt')\n"
_LAST_SAVE_FIXED = (
    "        torch.save({\n"
    "            'model': model.state_dict(),\n"
    "            'optimizer': optimizer.state_dict(),\n"
    "            'scaler': scaler.state_dict(),\n"
    "        }, 'last.pt')\n")
_HANDED_ON = (  # the loop that scales is in another file: the scaler is handed to it
    "from engine import train_loop\n"
    "\n"
    "def main(model, optimizer, loader, epochs):\n"
    "    scaler = torch.amp.GradScaler('cuda')\n"
    "    for epoch in range(epochs):\n"
    "        train_loop(model, optimizer, scaler, loader)\n" + _LAST_SAVE)

_SELF_SAVE = '        torch.save({"net": self.net.state_dict(), "opt": self.opt.state_dict()}, path)\n'
_SELF_SAVE_FIXED = (
    "        torch.save({\n"
    '            "net": self.net.state_dict(),\n'
    '            "opt": self.opt.state_dict(),\n'
    '            "scaler": self.scaler.state_dict(),\n'
    "        }, path)\n")
_IN_INIT = (  # made in __init__: every method sees it
    "class Trainer:\n"
    "    def __init__(self, net, opt):\n"
    "        self.net, self.opt = net, opt\n"
    "        self.scaler = torch.amp.GradScaler('cuda')\n"
    "\n"
    "    def step(self, batch):\n"
    "        self.scaler.scale(self.net(batch)).backward()\n"
    "        self.scaler.step(self.opt)\n"
    "        self.scaler.update()\n"
    "\n"
    "    def save(self, path):\n" + _SELF_SAVE)

_TOP_LEVEL = (  # a script's top level, in a file with a long line: the grown line stays whole
    "# the longest line of this file: 95 characters, so a line that the fix grows to 93 stays whole\n"
    "scaler = torch.amp.GradScaler('cuda')\n"
    "for batch in batches:\n"
    "    scaler.scale(m(batch)).backward()\n"
    "    scaler.step(o)\n"
    "    scaler.update()\n"
    "torch.save({'m': m.state_dict(), 'o': o.state_dict()}, 'f.pt')\n")


class CheckpointWithoutScaler(TrainingStepRule):
    """What it does:
    Reports a checkpoint (``torch.save({...})``, or the file's own ``save_checkpoint({...})``)
    whose dictionary holds a model's and an optimizer's ``state_dict()`` but nothing from the
    GradScaler, in a file that scales its losses with one. Entries added to the dictionary
    later in the same function (``state["scaler"] = scaler.state_dict()``) count, and so does a
    dict of the optimizers' states gathered under a key naming them (``state["optimizers"]``).
    A scaler made in another file counts where it is handed to the function that writes the
    checkpoint (a parameter, or ``self.scaler`` of its class). A scaler that
    is made but never scales, steps or updates, or that is made anew in the training loop (AMP105:
    fix that first), holds no state worth keeping.

    Why is this bad?
    A run resumed from it starts the scaler again at its initial scale (65,536): the first steps
    after each resume overflow and are skipped until the scale has fallen back, and the growth
    tracker starts from zero. Training does not continue as it would have.

    Fix safety:
    Safe: where the dictionary is written in the save call and one GradScaler is certain to exist
    there (made before it in the same function, at the top of the module, or in ``__init__`` for
    ``self.scaler``, or a parameter annotated as a GradScaler with no default),
    ``"scaler": scaler.state_dict()`` is added to it; of several (one per loss), the one that steps
    the optimizer saved there, where one does. A scaler handed in otherwise may be
    ``None`` on runs without mixed precision: reported, no fix. Training is unchanged;
    the checkpoint gains one entry. Loading it is left to you, since a resumed run then continues
    at the saved scale where it used to start again: add
    ``scaler.load_state_dict(checkpoint["scaler"])`` where the optimizer's state is loaded
    (guarded by ``if "scaler" in checkpoint`` for checkpoints written before).
    """

    CODE = "AMP107"
    FIX = "adds scaler.state_dict() to the checkpoint's dict"
    MESSAGE = "the checkpoint saves the model and the optimizer but not the GradScaler's state"
    TRIGGERS = ("GradScaler", "scaler")  # where the file makes one, or is handed one
    STEP_TRIGGERS = ("scaler",)  # a scaler handed in counts only where it scales: a step
    METADATA_DEPENDENCIES = (*TrainingStepRule.METADATA_DEPENDENCIES, ParentNodeProvider)  # the fix's scope walk
    FIX_SAFETY = FixSafety.ALWAYS

    FRAMEWORKS = {
        GRAD_SCALER: "Reported: a checkpoint of the model and the optimizer without the scaler's `state_dict()`.",
        FACTORY: "Reported as torch's.",
        TIMM: (
            "Reported: a checkpoint without `loss_scaler.state_dict()` (timm's scaler has `state_dict` and "
            "`load_state_dict`)."
        ),
        ACCELERATE: 'Not reported: `accelerator.save_state(...)` saves the scaler with the rest.',
        LIGHTNING: "Not reported: the Trainer's checkpoints hold the precision plugin's scaler.",
        FABRIC: (
            "Not reported: the scaler is Fabric's precision plugin's, which the file does not hold; what "
            "`fabric.save` saves is not judged."
        ),
        DEEPSPEED: "Not reported: `model_engine.save_checkpoint(...)` saves the loss scale with the optimizer's state.",
    }

    VALID = [
        Valid(CORRECT_LOOP),
        Valid(CORRECT_TRAINER),
        Valid(  # the scaler's state in a checkpoint written as a `dict(...)` call
            "def train(model, optimizer, loader, args):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for x in loader:\n"
            "        scaler.scale(model(x)).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "    state = dict(model=model.state_dict(), optimizer=optimizer.state_dict(), scaler=scaler.state_dict())\n"
            "    torch.save(state, 'model.pth')\n"
        ),
        Valid(  # the scaler's state handed to the helper that writes the checkpoint
            "scaler = torch.amp.GradScaler('cuda')\n"
            "\n"
            "def save_checkpoint(model, optimizer, extra_state, path):\n"
            "    torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'extra': extra_state}, path)\n"
            "\n"
            "def train(model, optimizer, loader):\n"
            "    for x in loader:\n"
            "        scaler.scale(model(x)).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "    save_checkpoint(model, optimizer, scaler.state_dict(), 'last.pt')\n"
        ),
        Valid(  # handed a scaler, but the checkpoint is written by a function that is not
            "def train_epoch(model, optimizer, scaler, loader):\n"
            "    for x in loader:\n"
            "        scaler.scale(model(x)).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "\n"
            "def save(model, optimizer, path):\n"
            "    torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, path)\n"
        ),
        Valid(  # an entry named for the optimizer that holds its name, not its state
            "def train(model, optimizer, scaler, loader, args):\n"
            "    for x in loader:\n"
            "        scaler.scale(model(x)).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "    torch.save({'model': model.state_dict(), 'optimizer': args.optimizer}, 'last.pt')\n"
        ),
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
        Valid(CORRECT[GRAD_SCALER], framework=GRAD_SCALER),
        Valid(CORRECT[FACTORY], framework=FACTORY),
        Valid(CORRECT[TIMM], framework=TIMM),
        Valid(CORRECT[ACCELERATE], framework=ACCELERATE),
        Valid(CORRECT[LIGHTNING], framework=LIGHTNING),
        Valid(CORRECT[FABRIC], framework=FABRIC),
        Valid(CORRECT[DEEPSPEED], framework=DEEPSPEED),
    ]
    INVALID = [
        Invalid(_LOCAL, _LOCAL.replace(_EPOCH_SAVE, _EPOCH_SAVE_FIXED)),
        Invalid(  # handed in, made in another file; no fix: the caller may pass None
            "def train(model, optimizer, scaler, loader, path, ddp):\n"
            "    for x in loader:\n"
            "        scaler.scale(model(x)).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "    torch.save({\n"
            "        'state_dict': model.module.state_dict() if ddp else model.state_dict(),\n"
            "        'optimizer': optimizer.state_dict(),\n"
            "    }, path)\n"
        ),
        Invalid(  # the optimizers' states gathered in a dict of their own
            "class Solver:\n"
            "    def __init__(self, model, optimizers, scaler):\n"
            "        self.model, self.optimizers, self.scaler = model, optimizers, scaler\n"
            "\n"
            "    def step(self, batch):\n"
            "        for name, optimizer in self.optimizers.items():\n"
            "            self.scaler.scale(self.model(batch)).backward()\n"
            "            self.scaler.step(optimizer)\n"
            "            self.scaler.update()\n"
            "        self.save('last.pt')\n"
            "\n"
            "    def save(self, path):\n"
            "        state = {'model': self.model.state_dict()}\n"
            "        optimizer_states = {}\n"
            "        for name, optimizer in self.optimizers.items():\n"
            "            optimizer_states[name] = optimizer.state_dict()\n"
            "        state['optimizers'] = optimizer_states\n"
            "        torch.save(state, path)\n"
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
        Invalid(_WHILE, _WHILE.replace(_BEST_SAVE, _BEST_SAVE_FIXED)),
        Invalid(_HANDED_ON, _HANDED_ON.replace(_LAST_SAVE, _LAST_SAVE_FIXED)),
        Invalid(_IN_INIT, _IN_INIT.replace(_SELF_SAVE, _SELF_SAVE_FIXED)),
        Invalid(_TOP_LEVEL, _TOP_LEVEL.replace("'o': o.state_dict()}", "'o': o.state_dict(), 'scaler': scaler.state_dict()}")),
        Invalid(  # the checkpoint's dict written as a call
            "def train(model, optimizer, loader, args):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for epoch in range(args.epochs):\n"
            "        for images, labels in loader:\n"
            "            scaler.scale(criterion(model(images), labels)).backward()\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n"
            "        state = dict(epoch=epoch + 1, model=model.state_dict(), optimizer=optimizer.state_dict())\n"
            "        torch.save(state, args.exp_dir / 'model.pth')\n"
        ),
        Invalid(  # timm's NativeScaler, handed to the loop of another file; the best model's save forgets it
            "from timm.utils import NativeScaler\n"
            "from engine import train_one_epoch\n"
            "\n"
            "def main(args, model, optimizer, loader):\n"
            "    loss_scaler = NativeScaler()\n"
            "    for epoch in range(args.epochs):\n"
            "        train_one_epoch(model, loader, optimizer, epoch, loss_scaler)\n"
            "        save_on_master({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, 'best.pth')\n"
        ),
        Invalid(  # made only when a flag is on: it may not exist where the checkpoint is written
            "def train(model, optimizer, loader, args):\n"
            "    if args.amp:\n"
            "        scaler = torch.amp.GradScaler('cuda')\n"
            "    for x in loader:\n"
            "        scaler.scale(model(x)).backward()\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "    torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, 'last.pt')\n"
        ),
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader, epochs):\n"
            '    scaler = torch.amp.GradScaler("cuda")\n'
            "    for epoch in range(epochs):\n"
            "        for x, y in loader:\n"
            '            with torch.autocast("cuda"):\n'
            "                loss = model(x, y)\n"
            "            scaler.scale(loss).backward()\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n"
            '        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "last.pt")\n',
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader, epochs):\n"
            '    scaler = torch.amp.GradScaler("cuda")\n'
            "    for epoch in range(epochs):\n"
            "        for x, y in loader:\n"
            '            with torch.autocast("cuda"):\n'
            "                loss = model(x, y)\n"
            "            scaler.scale(loss).backward()\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n"
            "        torch.save({\n"
            '            "model": model.state_dict(),\n'
            '            "optimizer": optimizer.state_dict(),\n'
            '            "scaler": scaler.state_dict(),\n'
            '        }, "last.pt")\n',
            framework=GRAD_SCALER,
        ),
        Invalid(
            "import torch\n"
            "\n"
            "\n"
            "def train(model, optimizer, loader, cfg):\n"
            "    scaler = build_grad_scaler(cfg)\n"
            "    for epoch in range(cfg.epochs):\n"
            "        for x, y in loader:\n"
            '            with torch.autocast("cuda"):\n'
            "                loss = model(x, y)\n"
            "            scaler.scale(loss).backward()\n"
            "            scaler.step(optimizer)\n"
            "            scaler.update()\n"
            '        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "last.pt")\n',
            framework=FACTORY,
        ),
        Invalid(
            "import torch\n"
            "from timm.utils import NativeScaler\n"
            "\n"
            "\n"
            "def train(model, criterion, loader, optimizer, epochs):\n"
            "    loss_scaler = NativeScaler()\n"
            "    for epoch in range(epochs):\n"
            "        for x, y in loader:\n"
            '            with torch.autocast("cuda"):\n'
            "                loss = criterion(model(x), y)\n"
            "            loss_scaler(loss, optimizer, parameters=model.parameters())\n"
            "            optimizer.zero_grad()\n"
            '        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "last.pt")\n',
            framework=TIMM,
        ),
    ]

    def findings(self, model):
        scalers = model.facts.scalers
        made = list(model.each(Kind.SCALER_NEW))
        if not scalers:
            return
        anew = {id(event.node) for steps, event in made if made_each_iteration(steps, event)}  # in any walk
        if made and all(id(event.node) in anew for _, event in made):
            return
        if made and all(event.detail.get("enabled") is False for _, event in made):
            return  # `GradScaler(enabled=False)`: it scales nothing and keeps no state worth saving
        if not _used(model):
            return
        # a scaler a factory makes in this file is this file's too (timm's `NativeScaler()`)
        factory_made = any(type(node) is cst.Call and makes_a_scaler(node) for node in descendants(model.module))
        for steps, event in model.each(Kind.SAVE):
            if not made and not factory_made and not self._handed_in(event.node, scalers):
                continue  # the scaler is made in another file: only a save beside its use is this file's
            entries = entries_saved(steps, event)
            if entries is None:
                continue
            values = [v for _, v in entries]
            owners = [nodes.code(c.func.value) for v in values for c in state_dicts(v)]
            optimizers = [o for o in owners if optimizer_like(o) or o in model.facts.optimizers]
            models = [o for o in owners if o not in optimizers and "sched" not in o.lower() and o not in scalers]
            saved = any(o in scalers or "scaler" in o.lower() for o in owners) or any(
                "scaler" in nodes.code(part).lower() for entry in entries for part in entry if part is not None)
            optimizers += [k for k, v in entries if optimizers_container(steps, k, v)]
            saved = saved or self._handed_a_scaler_state(event.node, values, model)
            if optimizers and models and not saved:
                yield event.node, None, self._saving_scaler(model, steps, event, optimizers)

    def _handed_a_scaler_state(self, call: cst.Call, values: list[cst.BaseExpression], model: StepModel) -> bool:
        """Whether an entry of the save is a parameter of its function that a call of the file
        gives the scaler or its state (``save_checkpoint(model, opt, scaler.state_dict())``
        saving ``{..., "amp": amp_state}``), or the state of such a parameter given the scaler
        (``save_checkpoint(model, opt, scaler)`` saving ``{..., "amp": amp.state_dict()}``)."""
        function = self._function_of(call)
        if function is None:
            return False
        # the entry itself (`amp_state`), or the state of what it names (`amp.state_dict()`)
        named = [v.func.value if type(v) is cst.Call and nodes.call_name(v) == "state_dict" and type(v.func) is cst.Attribute else v
                 for v in values]
        taken = {v.value for v in named if type(v) is cst.Name} & {p.name.value for p in parameters_of(function)}
        if not taken:
            return False
        for node in descendants(model.module):
            if type(node) is cst.Call and nodes.call_name(node) == function.name.value:
                for parameter, argument in parameters_given(function, node):
                    text = nodes.code(argument)
                    if parameter in taken and ("scaler" in text.lower() or any(s in text for s in model.facts.scalers)):
                        return True
        return False

    def _function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        while node is not None and not isinstance(node, cst.FunctionDef):
            node = self.get_metadata(ParentNodeProvider, node, None)
        return node

    def _handed_in(self, call: cst.Call, scalers: set[str]) -> bool:
        """Whether the function writing ``call`` is handed one of ``scalers``: as its parameter
        (``def train(model, optimizer, scaler, ...)``), or as ``self.scaler`` of its class."""
        node = self._function_of(call)
        if node is None:
            return False
        taken = {p.name.value for p in parameters_of(node)}
        return bool(taken & scalers) or ("self" in taken and any(s.startswith("self.") for s in scalers))

    def _saving_scaler(self, model: StepModel, steps: Steps, event, optimizers: list[str]) -> dict:
        """The fix: the save call with the scaler's state added to its dictionary. Of several
        scalers (one per loss), the one that steps the optimizers saved there."""
        call = event.node
        saved = call.args[0].value if call.args else None
        if not isinstance(saved, cst.Dict):
            return {}
        used = sorted({b.scaler for b in steps.of(Kind.BACKWARD) if b.scaler})
        parent_of = functools.partial(self.get_metadata, ParentNodeProvider, default=None)
        candidates = used or sorted(model.facts.scalers)
        stepping = {e.scaler for e in model.all_events(Kind.SCALER_STEP) if e.subject in optimizers} & set(candidates)
        scaler = scaler_in_reach(call, parent_of, sorted(stepping) if len(candidates) > 1 and len(stepping) == 1 else candidates)
        if scaler is None:
            return {}
        grown = with_scaler_entry(saved, scaler, model.module)
        if grown is None:
            return {}
        fixed = call.with_changes(args=[call.args[0].with_changes(value=grown), *call.args[1:]])
        text = model.module.code_for_node(fixed)
        if "\n" not in text and self.get_metadata(PositionProvider, call).start.column + len(text) > nodes.line_limit(model.module):
            grown = one_per_line(grown, model.module)  # as a person would break it
            fixed = call.with_changes(args=[call.args[0].with_changes(value=grown), *call.args[1:]])
        return {"replacement": fixed,
                "fix_message": f"Save `{scaler}.state_dict()` in the checkpoint (loading it is left to you: "
                               f"`{scaler}.load_state_dict(...)` where the optimizer's state is loaded)"}


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
