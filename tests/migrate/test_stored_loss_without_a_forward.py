"""A hook or method that scales a loss another object computed and stored
(``losses = self.trainer.outputs["loss"]``, then divided for accumulation): nothing in its block
calls anything, so an autocast around it would cast nothing. The unsafe rewrite writes no such
region; its marker at the backward pass says the forward pass, elsewhere, needs autocast. Where
the block does compute the loss from a stored output (``F.cross_entropy(out, y)``), the region
stays: autocast runs that loss in float32, as apex's casts did."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

READS = ['self.trainer.step_outputs["loss_for_backward"]', "self.state.loss", "self.losses[-1]"]
DIVIDES = ["", "losses /= self.accumulate", "losses = losses / self.accumulate",
           "if self.accumulate > 1:\n            losses = losses / self.accumulate"]


def _hook(read: str, divide: str) -> str:
    return ("import torch\nfrom apex import amp\n\n\nclass OptimizationHook:\n"
            "    def __init__(self, trainer, accumulate):\n"
            "        self.trainer, self.accumulate = trainer, accumulate\n\n"
            "    def after_step(self):\n"
            f"        losses = {read}\n"
            + (f"        {divide}\n" if divide else "")
            + "        with amp.scale_loss(losses, self.trainer.optimizer) as scaled:\n"
            "            scaled.backward()\n"
            "        self.trainer.optimizer.step()\n")


@pytest.mark.parametrize(("read", "divide"), list(itertools.product(READS, DIVIDES)))
def test_a_stored_loss_gets_no_empty_region_and_a_marker_for_the_forward(read, divide):
    result = migrate_source(_hook(read, divide), "hooks.py", unsafe_fixes=True)
    assert result.error is None, result.error
    new = result.new_source
    assert "amp.scale_loss" not in new, new
    assert "torch.autocast(" not in new.split("TODO(ampmigrate)")[0], new  # no region around the read
    assert "# TODO(ampmigrate): compute `losses` (the forward pass) under" in new, new


@pytest.mark.parametrize("read", READS)
def test_a_loss_computed_from_a_stored_output_keeps_its_region(read):
    source = _hook(read, "").replace(f"losses = {read}", f"out = {read}\n        losses = torch.nn.functional.cross_entropy(out, self.target)")
    new = migrate_source(source, "hooks.py", unsafe_fixes=True).new_source
    assert 'with torch.autocast("cuda", dtype=torch.float16):\n            out = ' in new, new
