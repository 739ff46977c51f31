"""The accepted difference of ``scale_loss(loss, [opt_a, opt_b])`` migrated to ``scaler.step`` for
each optimizer (docs/codemod.md): where only one optimizer's gradients overflow, apex skipped both
steps, GradScaler skips that one's. Run on the CPU, on ampshim's apex and on torch."""
import pytest
import torch
import torch.nn as nn

pytestmark = [pytest.mark.filterwarnings("ignore::ampshim.deprecation.DeprecatedFeatureWarning"),
              pytest.mark.filterwarnings("ignore:ampshim. the model is on:UserWarning")]


def nets():
    torch.manual_seed(0)
    return nn.Linear(2, 1), nn.Linear(2, 1)


def loss_overflowing_in_b(a, b):
    x = torch.ones(4, 2)
    return a(x).sum() + (b(x) * 1e38).sum()  # b's gradients times the scale overflow, a's do not


def test_apex_skips_every_step_of_the_loss():
    from ampshim import amp

    a, b = nets()
    before = [a.weight.detach().clone(), b.weight.detach().clone()]
    opts = [torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)]
    [a, b], opts = amp.initialize([a, b], opts, opt_level="O1", verbosity=0)
    with amp.scale_loss(loss_overflowing_in_b(a, b), opts) as scaled:
        scaled.backward()
    for opt in opts:
        opt.step()
    assert torch.equal(a.weight, before[0]) and torch.equal(b.weight, before[1])


def test_grad_scaler_skips_only_the_overflowing_optimizer():
    a, b = nets()
    before = [a.weight.detach().clone(), b.weight.detach().clone()]
    opts = [torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)]
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(loss_overflowing_in_b(a, b)).backward()
    for opt in opts:
        scaler.step(opt)
    scaler.update()
    assert not torch.equal(a.weight, before[0]) and torch.equal(b.weight, before[1])
    assert scaler.get_scale() == 32768.0  # lowered, as apex lowered it
