"""The amp core on CUDA: float16, and no host synchronisation beyond the overflow read."""
import warnings

import pytest
import torch

from _amp_testing import fresh_amp_state, mlp, quiet  # noqa: F401
from ampshim.initialize import initialize
from ampshim.scale_loss import scale_loss
from ampshim.state import _amp_state, master_params

pytestmark = [quiet, pytest.mark.cuda]


def cuda_o2(**kwargs):
    model = mlp().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return initialize(model, optimizer, opt_level="O2", verbosity=0, **kwargs)


def test_o2_on_cuda_is_float16_with_fp32_masters_and_trains():
    model, optimizer = cuda_o2()
    assert model[0].weight.dtype == torch.float16 and model[1].weight.dtype == torch.float32
    inputs = torch.randn(64, 4, device="cuda")
    targets = inputs[:, :2] * 2 - inputs[:, 2:]
    losses = []
    for _ in range(60):
        optimizer.zero_grad()
        out = model(inputs)
        assert out.dtype == torch.float32
        loss = torch.nn.functional.mse_loss(out, targets)
        with scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(p.dtype == torch.float32 for p in master_params(optimizer))
    assert losses[-1] < 0.2 * losses[0]


def test_float16_overflow_skips_and_halves(capsys):
    model, optimizer = cuda_o2()
    before = model[0].weight.detach().clone()
    loss = model(torch.randn(8, 4, device="cuda")).sum() * float("inf")
    with scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    assert torch.equal(model[0].weight, before)
    assert _amp_state.loss_scalers[0].loss_scale() == 2.**15
    assert "Gradient overflow.  Skipping step" in capsys.readouterr().out


def _count_syncs(action):
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            action()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum("synchronizing" in str(w.message) for w in caught)


def test_one_sync_per_non_delayed_exit_and_none_elsewhere():
    model, optimizer = cuda_o2()
    inputs = torch.randn(8, 4, device="cuda")
    for delay, expected in ((True, 0), (False, 1)):
        context = scale_loss(model(inputs).sum(), optimizer, delay_unscale=delay)
        context.__enter__().backward()
        assert _count_syncs(lambda: context.__exit__(None, None, None)) == expected
    assert _count_syncs(optimizer.step) == 0
    assert _count_syncs(optimizer.zero_grad) == 0


def test_bfloat16_on_cuda_on_request(monkeypatch):
    monkeypatch.setenv("AMPSHIM_DTYPE", "bfloat16")
    model, _ = cuda_o2()
    assert model[0].weight.dtype == torch.bfloat16
