"""An optimizer over the file's own tensors made in a precision that may be float16 (an input
optimized by model inversion: ``inputs = torch.randn(..., dtype=torch.half if args.amp else
torch.float, requires_grad=True)``, ``optim.Adam([inputs])``). apex O1 stepped float16 tensors;
``GradScaler.unscale_`` refuses their gradients, so the rewrite would raise at its first
``scaler.step``: the file is not rewritten, in either mode, and says why. A tensor made in
float32 is no such tensor."""
from __future__ import annotations

import itertools

import pytest
import torch

from migrate.api import migrate_source

SCRIPT = """import torch
import torch.optim as optim
from apex import amp


def invert(net, args):
    data_type = torch.half if args.amp else torch.float
    {made}
    optimizer = {optimizer}
    if args.amp:
        net, optimizer = amp.initialize(net, optimizer, opt_level="O1")
    for _ in range(10):
        optimizer.zero_grad()
        loss = net(inputs).sum()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
"""
MAYBE_HALF = {
    "dtype name": "inputs = torch.randn((8, 3), requires_grad=True, device='cuda', dtype=data_type)",
    "dtype half": "inputs = torch.zeros(8, 3, dtype=torch.half, device='cuda').requires_grad_()",
    "dtype float16": "inputs = torch.rand(8, 3, device='cuda', dtype=torch.float16, requires_grad=True)",
    ".half()": "inputs = torch.randn(8, 3, device='cuda').half().requires_grad_()",
    ".to(float16)": "inputs = torch.randn(8, 3, device='cuda').to(torch.float16).requires_grad_(True)",
    "parameter": "inputs = torch.nn.Parameter(torch.randn(8, 3, device='cuda', dtype=data_type))",
}
FLOAT32 = {
    "no dtype": "inputs = torch.randn((8, 3), requires_grad=True, device='cuda')",
    "dtype float": "inputs = torch.randn((8, 3), requires_grad=True, device='cuda', dtype=torch.float)",
    "dtype float32": "inputs = torch.randn((8, 3), requires_grad=True, device='cuda', dtype=torch.float32)",
    "dtype float64": "inputs = torch.randn((8, 3), requires_grad=True, device='cuda', dtype=torch.float64)",
    "dtype string": "inputs = torch.randn((8, 3), requires_grad=True, device='cuda', dtype='float32')",
}
OPTIMIZERS = {
    "optim.Adam": "optim.Adam([inputs], lr=0.1)",
    "torch.optim.SGD": "torch.optim.SGD([inputs], lr=0.1, momentum=0.9)",
    "two tensors": "optim.Adam([scale, inputs], lr=0.1)",
}


def _script(made: str, optimizer: str) -> str:
    if "scale," in optimizer:
        made = "scale = torch.ones(1, device='cuda', requires_grad=True)\n    " + made
    return SCRIPT.format(made=made, optimizer=optimizer)


@pytest.mark.parametrize(("made", "optimizer"), list(itertools.product(MAYBE_HALF, OPTIMIZERS)))
@pytest.mark.parametrize("unsafe_fixes", [False, True])
def test_an_optimizer_of_tensors_that_may_be_float16_is_not_rewritten(made, optimizer, unsafe_fixes):
    source = _script(MAYBE_HALF[made], OPTIMIZERS[optimizer])
    result = migrate_source(source, "invert.py", unsafe_fixes=unsafe_fixes)
    assert result.new_source == source, result.new_source
    assert any("refuses their gradients" in d.message and "`inputs`" in d.message for d in result.diagnostics), \
        [d.message for d in result.diagnostics]


@pytest.mark.parametrize("made", list(FLOAT32))
def test_a_float32_tensor_is_rewritten(made):
    result = migrate_source(_script(FLOAT32[made], OPTIMIZERS["optim.Adam"]), "invert.py")
    assert "scaler.step(optimizer)" in result.new_source and "amp.initialize" not in result.new_source, result.new_source


def test_gradscaler_refuses_float16_gradients():
    """The premise, on the installed torch: stepping a float16 tensor through an enabled scaler raises."""
    inputs = torch.randn(4, dtype=torch.half, requires_grad=True)
    optimizer = torch.optim.Adam([inputs], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale((inputs.float() ** 2).sum()).backward()
    with pytest.raises(ValueError, match="FP16 gradients"):
        scaler.step(optimizer)
