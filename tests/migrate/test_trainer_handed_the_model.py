"""A trainer class handed the model ``main`` initialized (``Trainer(model, model_fn, optimizer)``,
kept as ``self.model``), its loop computing the loss through what it was handed
(``self.model_fn(self.model, batch)``): apex O1 cast every forward pass once ``initialize`` ran,
so that call is the forward pass the autocast region covers, and the rewrite is safe. Run on the
CPU, the rewritten trainer takes the steps plain float32 training takes (autocast("cuda") leaves
CPU tensors alone; the scaler, made in ``main`` and read by the trainer, is on)."""
from __future__ import annotations

import pytest

from migrate.api import migrate_source
from migrate.types import Safety

torch = pytest.importorskip("torch")

SOURCE = """\
import torch
from apex import amp


class Trainer:
    def __init__(self, {model}, model_fn, optimizer):
        self.{model}, self.model_fn, self.optimizer = {model}, model_fn, optimizer

    def train(self, batches):
        for batch in batches:
            self.optimizer.zero_grad()
            loss = self.model_fn(self.{model}, batch)
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
            self.optimizer.step()


def main({model}, model_fn, optimizer, batches):
    {model}, optimizer = amp.initialize({model}, optimizer, opt_level="O1")
    Trainer({model}, model_fn, optimizer).train(batches)
"""


@pytest.mark.parametrize("model", ["model", "net"])
def test_the_forward_through_what_the_trainer_was_handed_is_under_autocast(model):
    result = migrate_source(SOURCE.format(model=model), filename="train.py")
    assert {d.fix.applicability for d in result.diagnostics if d.fix} == {Safety.SAFE}, result.diagnostics
    region = result.new_source.index("with torch.autocast(")
    assert region < result.new_source.index("loss = self.model_fn(") < result.new_source.index("scaler.scale(loss)")


def test_the_rewritten_trainer_takes_the_steps_plain_training_takes(monkeypatch):
    result = migrate_source(SOURCE.format(model="model"), filename="train.py")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the GradScaler("cuda") it makes is on

    def trained(source: str) -> torch.Tensor:
        namespace: dict = {}
        exec(compile(source, "train.py", "exec"), namespace)
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(3)]
        namespace["main"](model, lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]),
                          torch.optim.SGD(model.parameters(), lr=0.1), batches)
        return model.weight.detach()

    plain = SOURCE.format(model="model").replace("from apex import amp\n", "").replace(
        '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n', "").replace(
        "            with amp.scale_loss(loss, self.optimizer) as scaled_loss:\n                scaled_loss.backward()\n",
        "            loss.backward()\n")
    assert torch.allclose(trained(result.new_source), trained(plain))
