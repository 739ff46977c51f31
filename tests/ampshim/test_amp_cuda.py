"""The amp core on CUDA: float16, and no host synchronisation beyond the overflow read."""
import contextlib

import pytest
import torch

from _amp_testing import fresh_amp_state, mlp, quiet  # noqa: F401
from ampshim.initialize import initialize
from ampshim.scale_loss import scale_loss
from ampshim.scaler import LossScaler
from ampshim.state import _amp_state, master_params

pytestmark = [quiet, pytest.mark.cuda]


def cuda_o2(verbosity=0):
    model = mlp().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return initialize(model, optimizer, opt_level="O2", verbosity=verbosity)


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
    model, optimizer = cuda_o2(verbosity=1)  # apex prints the skip only when verbose
    before = model[0].weight.detach().clone()
    loss = model(torch.randn(8, 4, device="cuda")).sum() * float("inf")
    with scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    assert torch.equal(model[0].weight, before)
    assert _amp_state.loss_scalers[0].loss_scale() == 2.**15
    assert "Gradient overflow.  Skipping step" in capsys.readouterr().out


@contextlib.contextmanager
def host_syncs_raise():
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype")
def test_the_overflow_read_is_the_only_host_sync(monkeypatch):
    reads = []
    read_found_inf = LossScaler._read_found_inf

    def counted_read(scaler):  # the one allowed synchronisation, counted
        reads.append(scaler)
        torch.cuda.set_sync_debug_mode(0)
        try:
            return read_found_inf(scaler)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(LossScaler, "_read_found_inf", counted_read)
    model, optimizer = cuda_o2()
    inputs = torch.randn(8, 4, device="cuda")
    for delay, expected_reads in ((True, 0), (False, 1)):
        context = scale_loss(model(inputs).sum(), optimizer, delay_unscale=delay)
        context.__enter__().backward()
        with host_syncs_raise():
            context.__exit__(None, None, None)
        assert len(reads) == expected_reads
    with host_syncs_raise():
        optimizer.step()
        optimizer.zero_grad()
    assert len(reads) == 1


def test_bfloat16_on_cuda_on_request(monkeypatch):
    monkeypatch.setenv("AMPSHIM_DTYPE", "bfloat16")
    model, _ = cuda_o2()
    assert model[0].weight.dtype == torch.bfloat16
