"""An object of a class of the file that reads the gradients (``tracker.update()`` between the
scaled backward and the step), wherever its name is bound: in the training function, at module
level (a script's loop under ``if __name__ == "__main__":`` or bare), a global the training
function reads, a function around the closure that steps. apex unscaled as ``scale_loss`` exited,
so the tracker saw true gradients; the rewrite must ``unscale_`` before it. Drawn by the bench
(seed 4600, scripts 212-218: the loop under the guard, where only a function's names were looked
up). Judged by running: with mixed precision on, the tracker sets the learning rate it sets with
it off (before, from gradients 65,536 times too large)."""
from __future__ import annotations

import itertools
import sys
import textwrap

import pytest

from migrate.api import migrate_source

torch = pytest.importorskip("torch")

TRACKER = """\
import sys

import torch
from apex import amp


def total_norm(parameters):
    return sum(float(p.grad.pow(2).sum()) for p in parameters if p.grad is not None) ** 0.5


class GradScaleLR:
    \"\"\"Lowers the learning rate where the gradients' norm is large.\"\"\"

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer
        self.base = [group["lr"] for group in optimizer.param_groups]

    def update(self):
        norm = {norm}
        for group, base in zip(self.optimizer.param_groups, self.base):
            group["lr"] = base / max(1.0, float(norm))


"""
NORMS = {
    "p.grad": "sum(float(p.grad.pow(2).sum()) for p in self.model.parameters()) ** 0.5",
    "an infinite clip": 'torch.nn.utils.clip_grad_norm_(self.model.parameters(), float("inf"))',
    "a helper of the file": "total_norm(self.model.parameters())",
}
STEP = """\
optimizer.zero_grad()
loss = torch.nn.functional.mse_loss(model(x), y)
if use_amp:
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
else:
    loss.backward()
{tracker}.update()
optimizer.step()
"""
MADE = """\
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [(torch.randn(16, 8), torch.randn(16, 1) * 100) for _ in range(3)]
use_amp = "--amp" in sys.argv
"""
INITIALIZE = """\
if use_amp:
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
"""
MAKE_TRACKER = "{tracker} = GradScaleLR(model, optimizer)\n"
LOOP = "for x, y in batches:\n"


def _indented(text: str, depth: int = 1) -> str:
    return textwrap.indent(text, "    " * depth)


def _bound(place: str, tracker: str) -> str:
    """The script's body, with the tracker bound at ``place``."""
    made, step = MAKE_TRACKER.format(tracker=tracker), STEP.format(tracker=tracker)
    if place == "the training function":
        return (MADE + "\n\ndef train(model, optimizer, batches, use_amp):\n" + _indented(INITIALIZE + made + LOOP + _indented(step))
                + "    return model\n\n\nmodel = train(model, optimizer, batches, use_amp)\n")
    if place == "the module, under the main guard":
        return 'if __name__ == "__main__":\n' + _indented(MADE + INITIALIZE + made + LOOP + _indented(step))
    if place == "the module, bare":
        return MADE + INITIALIZE + made + LOOP + _indented(step)
    if place == "a global the training function reads":
        return (MADE + INITIALIZE + made + "\n\ndef train():\n" + _indented(LOOP + _indented(step))
                + "\n\ntrain()\n")
    assert place == "a function around the stepping closure"
    return (MADE + "\n\ndef train(model, optimizer, batches, use_amp):\n"
            + _indented(INITIALIZE + made + "\ndef one_step(x, y):\n" + _indented(step) + "\n" + LOOP + "    one_step(x, y)\n")
            + "    return model\n\n\nmodel = train(model, optimizer, batches, use_amp)\n")


PLACES = ["the training function", "the module, under the main guard", "the module, bare",
          "a global the training function reads", "a function around the stepping closure"]


def _weights(source: str, use_amp: bool, monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(sys, "argv", ["train.py"] + (["--amp"] if use_amp else []))
    namespace = {"__name__": "__main__"}
    exec(compile(source, "train.py", "exec"), namespace)
    return namespace["model"].weight.detach()


@pytest.mark.parametrize("place, norm, tracker", list(itertools.product(PLACES, sorted(NORMS), ["tracker", "lr_by_norm"])))
def test_the_tracker_reads_unscaled_gradients_wherever_it_is_bound(place, norm, tracker, monkeypatch):
    source = TRACKER.format(norm=NORMS[norm]) + _bound(place, tracker)
    new = migrate_source(source, filename="train.py").new_source
    assert "from apex" not in new, new
    update = next(i for i, line in enumerate(new.splitlines()) if f"{tracker}.update()" in line)
    unscaled = [i for i, line in enumerate(new.splitlines()) if ".unscale_(optimizer)" in line]
    assert unscaled and unscaled[0] < update, new
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the GradScaler("cuda") the rewrite makes is on
    assert torch.allclose(_weights(new, True, monkeypatch), _weights(new, False, monkeypatch), rtol=1e-3)




HELPER = """\
def lower_lr():
    norm = sum(float(p.grad.pow(2).sum()) for p in model.parameters()) ** 0.5
    for group in optimizer.param_groups:
        group["lr"] = 0.1 / max(1.0, norm)
"""
# Where the helper reading the gradients is defined: in a block, not at the top of its scope.
DEFINED = {
    "under the main guard": lambda step: 'if __name__ == "__main__":\n' + _indented(MADE + INITIALIZE + HELPER + LOOP + _indented(step)),
    "in the loop's body": lambda step: MADE + INITIALIZE + LOOP + _indented(HELPER + step),
    "under an if in the function": lambda step: (
        MADE + "\n\ndef train(model, optimizer, batches, use_amp):\n"
        + _indented(INITIALIZE + "if True:\n" + _indented(HELPER) + LOOP + _indented(step)) + "    return model\n\n\n"
        + "model = train(model, optimizer, batches, use_amp)\n"),
    "in a with block of the function": lambda step: (
        MADE + "\n\ndef train(model, optimizer, batches, use_amp):\n"
        + _indented(INITIALIZE + "with torch.no_grad():\n" + _indented(HELPER) + LOOP + _indented(step)) + "    return model\n\n\n"
        + "model = train(model, optimizer, batches, use_amp)\n"),
}


@pytest.mark.parametrize("defined", sorted(DEFINED))
def test_a_helper_defined_in_a_block_reads_unscaled_gradients(defined, monkeypatch):
    """A function of the file defined under an ``if``, a loop or a ``with`` is found by its call
    as one at the top of its scope is."""
    source = TRACKER.format(norm="0.0") + DEFINED[defined](STEP.replace("{tracker}.update()", "lower_lr()"))
    new = migrate_source(source, filename="train.py").new_source
    assert "from apex" not in new, new
    lines = new.splitlines()
    call = next(i for i, line in enumerate(lines) if line.strip() == "lower_lr()")
    assert any(".unscale_(optimizer)" in line for line in lines[:call]), new
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert torch.allclose(_weights(new, True, monkeypatch), _weights(new, False, monkeypatch), rtol=1e-3)
