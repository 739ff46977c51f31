"""A scaled backward pass of a loss the forward pass inside an earlier autocast region computed.

A domain-adaptation trainer's net returns every loss: the main loss's scaled backward pass gets
the region around the forward pass; each discriminator loss is then scaled in a loop over the
discriminators' optimizers, reading the same dict. That loss was computed under the region, so
no marker asks for the forward pass to go under autocast (it is), and no reason says there is no
forward pass next to ``amp.scale_loss``.
"""
from __future__ import annotations

import itertools
import textwrap

import pytest

from migrate.api import migrate_source

LOOPS = {
    "items": ("for name, d_optimizer in d_optimizers.items():", "name in key"),
    "enumerate": ("for index, d_optimizer in enumerate(d_optimizers):", "key.endswith(str(index))"),
}
READS = {
    "keys": ("for key in losses.keys():\n    if {test}:\n        {scale}", "losses[key]"),
    "items": ("for key, value in losses.items():\n    if {test}:\n        {scale}", "value"),
}


def _script(loop: str, read: str, arms: bool = False) -> str:
    header, test = LOOPS[loop]
    template, loss = READS[read]
    scale = f"with amp.scale_loss({loss}, d_optimizer) as scaled_loss:\n            scaled_loss.backward()"
    inner = template.format(test=test, scale=scale)
    body = textwrap.indent(header + "\n" + textwrap.indent(inner + "\nd_optimizer.step()", "    "), "        ")
    return ("import torch\nfrom apex import amp\n\n\n"
            "def train(net, optimizer, d_optimizers, loader):\n"
            "    net, optimizer = amp.initialize(net, optimizer, opt_level=\"O1\")\n"
            "    for x, y in loader:\n"
            + ("        if y is None:\n            losses = net(x)\n        else:\n            losses = net(x, y)\n" if arms
               else "        losses = net(x, y)\n")
            + '        loss = sum(value for key, value in losses.items() if not key.startswith("D_"))\n'
            "        optimizer.zero_grad()\n"
            "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
            "            scaled_loss.backward()\n"
            "        optimizer.step()\n"
            + body + "\n")


@pytest.mark.parametrize(("loop", "read", "arms"), list(itertools.product(LOOPS, READS, [False, True])))
def test_a_loss_the_region_computed_gets_no_marker_for_its_forward_pass(loop, read, arms):
    result = migrate_source(_script(loop, read, arms), "train.py", unsafe_fixes=True)
    assert result.error is None, result.error
    new = result.new_source
    assert "amp.scale_loss" not in new, new
    assert "(the forward pass) under" not in new, new
    assert 'with torch.autocast("cuda", dtype=torch.float16):\n            ' + ("if y is None:" if arms else "losses = net(x, y)") in new, new
    reasons = " ".join(d.fix.why_unsafe for d in result.diagnostics if d.fix is not None)
    assert "no forward pass next to" not in reasons, reasons
    compile(new, "train.py", "exec")
