"""The gradient of a tensor a function makes to take gradients itself (an input perturbation)
is no optimizer's: apex never unscaled it, so neither the migration's ``unscale_`` nor AMP101
counts reading it as reading the optimizer's scaled gradients. One handed to an optimizer is."""
from __future__ import annotations

import libcst as cst
import pytest

from migrate.engine import run_rules
from migrate.grad_readers import own_leaf_tensors
from migrate.rules import rule_by_code

MADE = {
    "zeros_like": "noise = torch.zeros_like(x, requires_grad=True)",
    "zeros": "noise = torch.zeros(x.shape, device=x.device, requires_grad=True)",
    "requires_grad_": "noise = x.clone().detach().requires_grad_()",
    "requires_grad_(True)": "noise = torch.empty_like(x).uniform_(-0.1, 0.1).requires_grad_(True)",
    "asked apart": "noise = torch.zeros_like(x)\nnoise.requires_grad_()",
}
READ = {
    "divided": "noise = (noise + 0.01 * noise.grad / scale).detach().requires_grad_()",
    "sign": "noise = (noise + 0.01 * noise.grad.sign()).detach().requires_grad_()",
    "copied": "noise = (noise + 0.01 * noise.grad.clone().detach().float() / scale).detach()",
}


def _step(made: str, read: str, optimized: bool) -> str:
    body = [*made.split("\n"), *(["perturbation_optimizer = torch.optim.SGD([noise], lr=0.1)"] if optimized else []),
            "loss = model(x + noise, y)", "scaler.scale(loss).backward()", "scale = scaler.get_scale()", read,
            "scaler.step(optimizer)", "scaler.update()"]
    return ("import torch\n\n\ndef train(model, optimizer, scaler, loader):\n    for x, y in loader:\n"
            + "".join(f"        {line}\n" for line in body))


@pytest.mark.parametrize("made", sorted(MADE))
@pytest.mark.parametrize("read", sorted(READ))
@pytest.mark.parametrize("optimized", [False, True])
def test_a_perturbations_gradient_is_its_own(made, read, optimized):
    source = _step(MADE[made], READ[read], optimized)
    function = cst.parse_module(source).body[1]
    assert ("noise" in own_leaf_tensors(function)) == (not optimized), source
    found = {d.code for d in run_rules(source, "train.py", [rule_by_code("AMP101")]).diagnostics}
    assert ("AMP101" in found) == optimized, source


def test_a_parameter_or_a_tensor_bound_otherwise_too_is_not_one():
    source = ("def f(model, x):\n"
              "    noise = torch.zeros_like(x, requires_grad=True)\n"
              "    noise = model.weight\n"
              "    w = model.weight\n")
    assert own_leaf_tensors(cst.parse_module(source).body[0]) == frozenset()
