"""A base trainer's ``optimize(self, loss)`` holds ``amp.scale_loss``; subclasses in the same file
compute the loss with a forward pass and call ``self.optimize(loss)``. Those calls are the base
method's callers: each one's forward pass goes under autocast (apex O1 cast it), never left in
float32 while only the base class's own callers get a region."""
from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from migrate.api import migrate_source

HEAD = '''\
import torch
import torch.nn.functional as F
from apex import amp


class Trainer:
    def __init__(self, model, optimizer):
        self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")

    def optimize(self, loss):
        self.optimizer.zero_grad()
        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()
        self.optimizer.step()
'''
BASE_STEP = '''
    def lm_step(self, x, y):
        out = self.model(x)
        loss = F.mse_loss(out, y)
        self.optimize(loss)
        return loss
'''
# the subclass's forward pass, spelled several ways
FORWARDS = {
    "attribute": "out = self.model(x)",
    "local": "net = self.model\n        out = net(x)",
    "wrapped": "out = torch.tanh(self.model(x))",
}
# how the subclass reaches the base: directly, through an intermediate class, or with the base's step too
SHAPES = ("direct", "intermediate", "beside_base_step")


def _source(forward: str, shape: str) -> str:
    step = (f"\n    def mt_step(self, x, y):\n        {FORWARDS[forward]}\n"
            "        loss = F.l1_loss(out, y)\n        self.optimize(loss)\n        return loss\n")
    text = HEAD + (BASE_STEP if shape == "beside_base_step" else "")
    if shape == "intermediate":
        text += "\n\nclass Middle(Trainer):\n    def describe(self):\n        return 'middle'\n"
    base = "Middle" if shape == "intermediate" else "Trainer"
    text += f"\n\nclass EncDecTrainer({base}):{step}"
    return text + MAIN


MAIN = '''

def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = EncDecTrainer(model, optimizer)
    for step in range(20):
        x, y = torch.randn(16, 8).cuda(), torch.randn(16, 1).cuda()
        trainer.mt_step(x, y)


if __name__ == "__main__":
    main()
'''


@pytest.mark.parametrize("forward, shape", list(itertools.product(FORWARDS, SHAPES)))
def test_a_subclass_handing_its_loss_to_the_base_optimize_gets_its_forward_under_autocast(forward, shape):
    new = migrate_source(_source(forward, shape), "trainer.py").new_source
    assert "amp.scale_loss" not in new, new
    mt_step = new[new.index("def mt_step"):]
    assert "with torch.autocast(" in mt_step.split("self.optimize(loss)")[0], new


@pytest.mark.slow
def test_the_subclass_rewrite_trains_as_apex_did(tmp_path):
    source = _source("attribute", "direct")
    original = tmp_path / "original.py"
    original.write_text(source)
    migrated = tmp_path / "migrated.py"
    migrated.write_text(migrate_source(source, "trainer.py").new_source)
    run = subprocess.run([sys.executable, "-m", "ampshim", "compare", "--device", "cpu", str(original), str(migrated)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
