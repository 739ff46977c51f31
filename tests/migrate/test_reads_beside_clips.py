"""A clip in one arm and another gradient read in the other (``if clip: clip_grad_norm_(...)`` /
``else: norm = total_norm(amp.master_params(opt))``), after every micro-batch, the step every
second. The clip alone gets the scale-aware form; the other read, a helper of the file reading
``p.grad`` too, is not covered by it. Before, that arm got ``scaler.unscale_(opt)`` in a safe
rewrite, which raised at the second micro-batch (unscale_ twice before a step)."""
from __future__ import annotations

import pytest

from migrate.api import migrate_source

TEMPLATE = """\
import torch
from apex import amp


{helper}


def train(model, optimizer, batches, clip):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for index, (x, y) in enumerate(batches):
        loss = torch.nn.functional.mse_loss(model(x), y) / 2
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        if {test}:
{first}
        else:
{second}
        if (index + 1) % 2 == 0:
            optimizer.step()
            optimizer.zero_grad()
"""
HELPERS = {
    "norm_of_params": "def total_norm(params):\n    return torch.norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))",
    "norm_of_model": "def total_norm(model):\n    return sum(p.grad.pow(2).sum() for p in model.parameters()) ** 0.5",
}
READS = {"norm_of_params": "norm = total_norm({params})", "norm_of_model": "norm = total_norm(model)",
         "inline": "norm = sum(p.grad.abs().sum() for p in {params})"}
PARAMS = {"master_params": "amp.master_params(optimizer)", "parameters": "model.parameters()"}


@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.parametrize("params", sorted(PARAMS))
@pytest.mark.parametrize("clip_first", [True, False])
@pytest.mark.parametrize("unsafe_fixes", [False, True])
def test_no_unscale_where_a_read_beside_the_clip_runs_every_micro_batch(read, params, clip_first, unsafe_fixes):
    clip = f"            norm = torch.nn.utils.clip_grad_norm_({PARAMS[params]}, clip)"
    other = "            " + READS[read].format(params=PARAMS[params])
    source = TEMPLATE.format(helper=HELPERS.get(read, HELPERS["norm_of_params"]), test="clip" if clip_first else "not clip",
                             first=clip if clip_first else other, second=other if clip_first else clip)
    result = migrate_source(source, "train.py", unsafe_fixes=unsafe_fixes)
    assert result.error is None
    code = [line for line in result.new_source.splitlines() if not line.lstrip().startswith("#")]
    assert not any("unscale_(" in line for line in code), result.new_source
    compile(result.new_source, "train.py", "exec")
