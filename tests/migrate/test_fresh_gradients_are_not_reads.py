"""Gradients computed afresh (``torch.autograd.grad``: a gradient penalty, a path-length
regularizer) and the ``.grad`` of an input perturbation (``Variable(x, requires_grad=True)``) are
not the optimizer's gradients: apex never unscaled them, loss scaling never touched the first, so
reading them between the scaled backward and the step is no gradient read. A helper of the file is
judged by its body, not by a name holding "grad"."""
from __future__ import annotations

import pytest

from migrate.api import migrate_source

SCRIPT = """\
import torch
from torch import autograd
from torch.autograd import Variable, grad as torch_grad
from apex import amp


def gradient_penalty(images, output):
    gradients = torch_grad(outputs=output, inputs=images, grad_outputs=torch.ones_like(output), create_graph=True)[0]
    return ((gradients.norm(2, dim=1) - 1) ** 2).mean()


def grad_norm_of(model):
    return sum(float(p.grad.norm()) for p in model.parameters() if p.grad is not None)


model, opt = amp.initialize(model, opt, opt_level="O1")
for step, (x, y) in enumerate(loader):
    noise = Variable(torch.zeros_like(x), requires_grad=True).cuda()
    out = model(x + noise)
    loss = ((out - y) ** 2).mean() / 4
    with amp.scale_loss(loss, opt) as scaled_loss:
        scaled_loss.backward()
    {read}
    if step % 4 == 3:
        opt.step()
        opt.zero_grad()
"""
NOT_READS = {
    "penalty_helper": "penalty = gradient_penalty(x, out)",
    "autograd_keywords": "g = torch_grad(outputs=out, inputs=x, grad_outputs=torch.ones_like(out))[0]",
    "autograd_attribute": "g = torch.autograd.grad(out.sum(), x, retain_graph=True)[0]",
    "autograd_module": "g = autograd.grad(out.sum(), x)[0]",
    "perturbation": "x = x + 0.01 * noise.grad.sign()",
}
READS = {
    "helper_reading": "norm = grad_norm_of(model)",
    "parameter_grad": "first = next(model.parameters()).grad.abs().max()",
}


@pytest.mark.parametrize("case", NOT_READS)
def test_fresh_gradients_leave_the_rewrite_safe_and_unmarked(case):
    result = migrate_source(SCRIPT.format(read=NOT_READS[case]), "train.py")
    assert "amp.scale_loss" not in result.new_source, [d.fix.why_unsafe for d in result.diagnostics if d.fix]
    assert "TODO(ampmigrate)" not in result.new_source


@pytest.mark.parametrize("case", READS)
def test_the_optimizers_gradients_are_still_reads(case):
    result = migrate_source(SCRIPT.format(read=READS[case]), "train.py", unsafe_fixes=True)
    assert "gradients still scaled" in result.new_source, result.new_source
