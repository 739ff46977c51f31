"""A forward pass outside the training step (an evaluation function handed the model) is left in
float32, with no region and no marker: the decision docs/codemod.md states. Apex's O1 cast it;
training is the same either way, and only the evaluation's own numbers differ."""
from __future__ import annotations

import pytest

from migrate.api import migrate_source

EVALUATIONS = {
    "function": ("def validate(model, loader):\n    with torch.no_grad():\n        for x, y in loader:\n"
                 "            print((model(x).argmax(1) == y).sum().item())\n\n\n", "        validate(model, val_loader)\n"),
    "after_training": ("", "    with torch.no_grad():\n        for x, y in val_loader:\n            print(model(x).sum().item())\n"),
}


@pytest.mark.parametrize("evaluation", sorted(EVALUATIONS))
def test_an_evaluation_outside_the_step_stays_in_float32(evaluation):
    defined, called = EVALUATIONS[evaluation]
    in_loop = called if evaluation == "function" else ""
    after = called if evaluation != "function" else ""
    source = ("import torch\nfrom apex import amp\n\n\n" + defined
              + "def main(model, optimizer, loader, val_loader, epochs):\n"
              + "    model, optimizer = amp.initialize(model, optimizer, opt_level='O1')\n"
              + "    for epoch in range(epochs):\n        for x, y in loader:\n"
              + "            loss = torch.nn.functional.cross_entropy(model(x), y)\n            optimizer.zero_grad()\n"
              + "            with amp.scale_loss(loss, optimizer) as scaled_loss:\n                scaled_loss.backward()\n"
              + "            optimizer.step()\n" + in_loop + after)
    new = migrate_source(source, "train.py").new_source
    # one region, the training step's: it holds the loss, not the evaluation's forward pass
    assert new.count("torch.autocast(") == 1 and "TODO(ampmigrate)" not in new, new
    assert new.index("torch.autocast(") < new.index("cross_entropy") < new.index("scaler.update()"), new
    evaluated = new.index("def validate") if evaluation == "function" else new.rindex("model(x)")
    assert evaluated < new.index("torch.autocast(") or evaluated > new.index("scaler.update()"), new
