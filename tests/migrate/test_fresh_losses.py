"""A scaled loss made from nothing that trains: a template's placeholder.

A training template computes its output, then stands in for the loss it leaves to the user with
``loss = torch.zeros(1, requires_grad=True).float().to(device)`` and scales that. Its backward
reaches no parameter: apex's step left the model as it was, while ``GradScaler.step`` raises "No
inf checks were recorded for this optimizer", so the safe rewrite crashed at the first step (a
``compare`` run of the first case below parts at step 1 with that error). Such a site is left on
apex with the reason, in both modes; a loss that any binding computes is rewritten as before.
"""
from __future__ import annotations

import itertools

import pytest
from rewrite_runs import reasons_left_on_apex

from migrate.api import migrate_source

SCRIPT = """import argparse
import torch
import torch as th
import torch.nn as nn
from torch.autograd import Variable
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--use_amp", action="store_true")
args = parser.parse_args()
device = "cuda"
model = nn.Linear(4, 2).to(device)
optimizer = torch.optim.Adam(model.parameters())
if args.use_amp:
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
criterion = nn.MSELoss()
{body}
"""

MODULE_LOOP = """for step in range(3):
    output = model(torch.randn(2, 4).to(device))
{assign}
    optimizer.zero_grad()
{scaled}
    optimizer.step()
"""
FUNCTION = """def train(model, optimizer, steps):
    for step in range(steps):
        output = model(torch.randn(2, 4).to(device))
{assign}
        optimizer.zero_grad()
{scaled}
        optimizer.step()


train(model, optimizer, 3)
"""
METHOD = """class Trainer:
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def fit(self, steps):
        for step in range(steps):
            output = self.model(torch.randn(2, 4).to(device))
{assign}
            self.optimizer.zero_grad()
{scaled}
            self.optimizer.step()


Trainer(model, optimizer).fit(3)
"""
PLACES = {"module": (MODULE_LOOP, 4), "function": (FUNCTION, 8), "method": (METHOD, 12)}

# the placeholder, in the spellings templates use
NEW_TENSORS = {
    "zeros_chain": "torch.zeros(1, requires_grad=True).float().to(device)",
    "tensor": "torch.tensor(0.0, requires_grad=True)",
    "variable": "Variable(torch.zeros(1).cuda(), requires_grad=True)",
    "requires_grad_": "torch.zeros(1, device=device).requires_grad_()",
    "alias_times_zero": "th.ones(1, requires_grad=True) * 0",
}
# how the loss is bound: once, in both arms of an `if`, or handed to scale_loss as it is made
BINDINGS = ("once", "arms", "inline")
# the scaled backward: alone, or under the flag with a plain backward beside it
GUARDS = ("plain", "flagged")


def _script(place: str, new: str, binding: str, guard: str, optimizer: str | None = None) -> str:
    template, indent = PLACES[place]
    pad = " " * indent
    opt = optimizer or ("self.optimizer" if place == "method" else "optimizer")
    tensor = NEW_TENSORS[new]
    if binding == "once":
        assign, loss = f"{pad}loss = {tensor}", "loss"
    elif binding == "arms":
        assign = (f"{pad}if step % 2:\n{pad}    loss = {tensor}\n"
                  f"{pad}else:\n{pad}    loss = torch.zeros(1, requires_grad=True)")
        loss = "loss"
    else:
        assign, loss = f"{pad}pass", tensor
    scaled = [f"with amp.scale_loss({loss}, {opt}) as scaled_loss:", "    scaled_loss.backward()"]
    if guard == "flagged":
        scaled = ["if args.use_amp:", *("    " + line for line in scaled), "else:", f"    ({loss}).backward()"]
    return SCRIPT.format(body=template.format(assign=assign, scaled="\n".join(pad + line for line in scaled)))


CASES = list(itertools.product(sorted(PLACES), sorted(NEW_TENSORS), BINDINGS, GUARDS))


@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
@pytest.mark.parametrize(("place", "new", "binding", "guard"), CASES)
def test_a_placeholder_loss_is_left_on_apex_with_the_reason(place, new, binding, guard, unsafe):
    source = _script(place, new, binding, guard)
    reasons = reasons_left_on_apex(source, unsafe)
    assert reasons and all("reaches no parameter" in reason and "No inf checks" in reason for reason in reasons), reasons


# a loss some binding computes: the placeholder is a start, or a stand-in on one path only
COMPUTED = {
    "accumulated": "{pad}loss = torch.zeros(1).to(device)\n{pad}loss += criterion(output, torch.zeros_like(output))",
    "added": "{pad}loss = torch.tensor(0.0).cuda()\n{pad}loss = loss + criterion(output, torch.zeros_like(output))",
    "one_arm": ("{pad}if step % 2:\n{pad}    loss = torch.zeros(1, requires_grad=True)\n"
                "{pad}else:\n{pad}    loss = criterion(output, torch.zeros_like(output))"),
    "in_a_loop": ("{pad}loss = torch.zeros(1).cuda()\n{pad}for part in output:\n"
                  "{pad}    loss = loss + part.sum()"),
    "from_the_output": "{pad}loss = output.sum() * 0",
}


@pytest.mark.parametrize(("place", "computed"), list(itertools.product(sorted(PLACES), sorted(COMPUTED))))
def test_a_computed_loss_is_still_rewritten(place, computed):
    template, indent = PLACES[place]
    opt = "self.optimizer" if place == "method" else "optimizer"
    pad = " " * indent
    scaled = f"{pad}with amp.scale_loss(loss, {opt}) as scaled_loss:\n{pad}    scaled_loss.backward()"
    source = SCRIPT.format(body=template.format(assign=COMPUTED[computed].format(pad=pad), scaled=scaled))
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py").new_source
    assert "from apex import" not in new and ".scale(loss).backward()" in new, new


def test_a_loss_handed_in_is_not_taken_for_a_placeholder():
    """A parameter of that name: its value is computed by the caller, which the file may not show."""
    body = ("def backward_step(loss, optimizer):\n"
            "    if loss is None:\n        loss = torch.zeros(1, requires_grad=True)\n"
            "    with amp.scale_loss(loss, optimizer) as scaled_loss:\n        scaled_loss.backward()\n"
            "    optimizer.step()\n\n\n"
            "for step in range(3):\n    output = model(torch.randn(2, 4).to(device))\n"
            "    backward_step(criterion(output, torch.zeros_like(output)), optimizer)\n")
    result = migrate_source(SCRIPT.format(body=body), "train.py", unsafe_fixes=True)
    assert not any("reaches no parameter" in finding.message for finding in result.diagnostics)
    assert ".scale(loss).backward()" in result.new_source, result.new_source


@pytest.mark.slow
def test_the_placeholder_trains_on_ampshim(tmp_path):
    """What the site keeps: the original runs its steps on ampshim (apex's step changed nothing)."""
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(_script("function", "zeros_chain", "once", "flagged").replace('device = "cuda"', 'device = "cpu"'))
    done = subprocess.run([sys.executable, "-m", "ampshim", "--device", "cpu", str(script), "--use_amp"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
