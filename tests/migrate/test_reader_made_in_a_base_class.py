"""An object reading the gradients (``self.tracker.update()`` before the step) made in a base
class's ``__init__`` and used in the subclass's loop: it is found as it is where one class holds
both, so the gradients are unscaled before it reads them, as apex had them."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

SOURCE = '''\
import torch
import torch.nn.functional as F
from apex import amp


class GradNorm:
    def __init__(self, model):
        self.model = model
        self.last = 0.0

    def update(self):
        self.last = sum(float(p.grad.pow(2).sum()) for p in self.model.parameters()) ** 0.5


class Base:
    def __init__(self, model, optimizer):
        self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")
        self.{tracker} = GradNorm(self.model)
{middle}

class Trainer({parent}):
    def fit(self, batches):
        for x, y in batches:
            loss = F.mse_loss(self.model(x), y)
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
            self.{tracker}.update()
            self.optimizer.step()
            self.optimizer.zero_grad()
'''
MIDDLE = {"direct": ("", "Base"), "grandparent": ("\n\nclass Middle(Base):\n    pass\n", "Middle")}


@pytest.mark.parametrize("depth, tracker", list(itertools.product(MIDDLE, ["tracker", "grad_monitor"])))
def test_the_reader_made_in_a_base_class_reads_unscaled_gradients(depth, tracker):
    middle, parent = MIDDLE[depth]
    new = migrate_source(SOURCE.format(tracker=tracker, middle=middle, parent=parent), "train.py").new_source
    assert "apex" not in new, new
    fit = new[new.index("    def fit("):]
    assert "unscale_(self.optimizer)" in fit and fit.index("unscale_(") < fit.index(f"self.{tracker}.update()"), new
