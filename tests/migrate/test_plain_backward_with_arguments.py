"""A plain backward pass beside the scaled one, where every step of the optimizer goes through the
scaler (an unsafe rewrite): it is scaled too, keeping its arguments (``loss.backward(**kwargs)``,
``retain_graph=True``). Left unscaled, ``scaler.step`` raised in every iteration that took it
(``_scale is None``), the default fp32 run of a file that never calls ``amp.initialize``."""
from __future__ import annotations

import pytest
import torch

from migrate.api import migrate_source

ARGUMENTS = {"kwargs": ("**kwargs", "**kwargs"), "keyword": ("retain_graph=True", ""),
             "both": ("retain_graph=True, **kwargs", "**kwargs")}

SOURCE = """\
import torch
from apex import amp


def loss_backwards(fp16, loss, optimizer, {params}):
    if fp16:
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward({arguments})
    else:
        loss.backward({arguments})


def train(model, opt, batches, fp16=False):
    for x in batches:
        loss = (model(x) - x).pow(2).mean()
        loss_backwards(fp16, loss, opt)
        opt.step()
        opt.zero_grad()
    return model
"""


@pytest.mark.parametrize("spelling", list(ARGUMENTS))
def test_the_plain_backward_is_scaled_with_its_arguments(spelling):
    arguments, params = ARGUMENTS[spelling]
    source = SOURCE.format(arguments=arguments, params=params or "retain=False")
    fixed = migrate_source(source, "train.py", unsafe_fixes=True).new_source
    assert fixed.count(f"scaler.scale(loss).backward({arguments})") == 2, fixed
    assert "TODO(ampmigrate)" in fixed, fixed
    # the default fp32 run steps through the scaler without raising
    namespace: dict = {}
    exec(compile(fixed.replace('GradScaler("cuda"', 'GradScaler("cpu"'), "train.py", "exec"), namespace)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    before = model.weight.detach().clone()
    namespace["train"](model, torch.optim.SGD(model.parameters(), lr=0.1), [torch.randn(2, 4) for _ in range(3)])
    assert not torch.equal(before, model.weight)
