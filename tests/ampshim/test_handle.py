"""The O1 handle: autocast scope, state restore, no stale weight casts, the 2018 handle API."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from _amp_testing import fresh_amp_state, quiet  # noqa: F401
from ampshim.handle import AmpHandle, NoOpHandle, OptimWrapper, init
from ampshim.state import _amp_state

pytestmark = quiet
LOW = torch.bfloat16



def o1(**kwargs):
    return init(device_type="cpu", **kwargs)


def test_init_turns_on_autocast_process_wide_with_cache_off():
    handle = o1()
    assert isinstance(handle, AmpHandle) and handle.is_active()
    assert _amp_state.handle is handle
    assert torch.is_autocast_enabled("cpu")
    assert torch.get_autocast_dtype("cpu") == LOW
    assert not torch.is_autocast_cache_enabled()
    # Code outside any model (a metric, a loss) runs under autocast's policies too.
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    assert (a @ b).dtype == LOW
    assert F.mse_loss(a.to(LOW), b.to(LOW)).dtype == torch.float32


def test_disabled_init_returns_a_no_op_handle():
    handle = init(enabled=False)
    assert isinstance(handle, NoOpHandle) and not handle.is_active()
    assert _amp_state.handle is handle
    assert not torch.is_autocast_enabled("cpu")
    loss = torch.tensor(2.0)
    with handle.scale_loss(loss, None) as scaled:
        assert scaled is loss


def test_deactivate_restores_the_previous_autocast_state():
    before = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
              torch.is_autocast_cache_enabled())
    torch.set_autocast_dtype("cpu", torch.float16)
    try:
        handle = o1()
        handle._deactivate()
        assert not handle.is_active()
        assert torch.get_autocast_dtype("cpu") == torch.float16
        assert not torch.is_autocast_enabled("cpu")
        assert torch.is_autocast_cache_enabled()
        handle._deactivate()  # a second call changes nothing
        assert not torch.is_autocast_enabled("cpu")
    finally:
        torch.set_autocast_dtype("cpu", before[1])


def test_deactivate_inside_disable_casts_stays_deactivated():
    handle = o1()
    with handle._disable_casts():
        handle._deactivate()
    assert not torch.is_autocast_enabled("cpu") and not handle.is_active()


def test_a_second_init_replaces_the_first_handle():
    first = o1()
    second = o1()
    assert not first.is_active() and second.is_active()
    second._deactivate()
    assert not torch.is_autocast_enabled("cpu")  # not left on by the first handle


def test_clear_cache_is_harmless():
    handle = o1()
    handle._clear_cache()
    assert handle.is_active() and (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == LOW


# --- no stale weight casts ------------------------------------------------------------------

def _forward(model):
    return model(torch.ones(1, 4)).float()


def _edit_in_place(model):
    with torch.no_grad():
        model.weight.mul_(2.0)


def _load_state_dict(model):
    doubled = copy.deepcopy(model.state_dict())
    doubled["weight"] = doubled["weight"] * 2.0
    model.load_state_dict(doubled)


def _optimizer_step(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model.weight.grad = -model.weight.detach().clone()  # step doubles the weight
    model.bias.grad = torch.zeros_like(model.bias)
    with _amp_state.handle._disable_casts():
        optimizer.step()


@pytest.mark.parametrize("change", [_edit_in_place, _load_state_dict, _optimizer_step])
def test_second_forward_sees_the_changed_weight(change):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    with torch.no_grad():
        model.bias.zero_()
    o1()
    first = _forward(model)
    change(model)
    second = _forward(model)
    assert torch.allclose(second, 2.0 * first, rtol=2e-2)


def test_the_stale_weight_test_detects_a_cache():
    # Control: with autocast's weight cache on, the same in-place edit goes unseen.
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    o1()
    torch.set_autocast_cache_enabled(True)
    try:
        first = _forward(model)
        _edit_in_place(model)
        assert torch.equal(_forward(model), first)
    finally:
        torch.clear_autocast_cache()
        torch.set_autocast_cache_enabled(False)


def test_a_cached_autocast_block_inside_o1_is_cleared_on_exit():
    # The documented tip for weights reused many times per forward (an RNN cell stepped in a
    # loop): a nested `torch.autocast(..., cache_enabled=True)` caches only for its own block.
    torch.manual_seed(0)
    model = nn.Linear(4, 3, bias=False)
    o1()
    with torch.autocast("cpu", dtype=LOW, cache_enabled=True):
        first = _forward(model)
        assert torch.equal(_forward(model), first)
    assert not torch.is_autocast_cache_enabled() and torch.is_autocast_enabled("cpu")
    _edit_in_place(model)
    with torch.autocast("cpu", dtype=LOW, cache_enabled=True):  # would reuse a surviving cast
        assert torch.allclose(_forward(model), 2.0 * first, rtol=2e-2)


def test_eval_under_no_grad_then_train_still_reaches_the_weights():
    model = nn.Linear(4, 3)
    o1()
    with torch.no_grad():
        model(torch.ones(2, 4))
    model(torch.ones(2, 4)).float().sum().backward()
    assert model.weight.grad is not None
    assert torch.count_nonzero(model.weight.grad) > 0


# --- the legacy OptimWrapper ----------------------------------------------------------------

def _weight_and_wrapper(handle, num_loss):
    weight = nn.Parameter(torch.ones(3))
    optimizer = handle.wrap_optimizer(torch.optim.SGD([weight], lr=1.0), num_loss=num_loss)
    return weight, optimizer


def _backward(optimizer, loss):
    with optimizer.scale_loss(loss) as scaled_loss:
        assert not torch.is_autocast_enabled("cpu")  # backward runs outside autocast
        scaled_loss.backward()


def test_optim_wrapper_accumulates_unscaled_grads_of_each_loss():
    weight, optimizer = _weight_and_wrapper(o1(), num_loss=2)
    assert isinstance(optimizer, OptimWrapper)
    optimizer.zero_grad()
    _backward(optimizer, (weight * 2.0).sum())
    assert torch.equal(weight.grad, torch.full((3,), 2.0))
    _backward(optimizer, (weight * 3.0).sum())
    assert torch.equal(weight.grad, torch.full((3,), 5.0))
    optimizer.step()
    assert torch.equal(weight.detach(), torch.full((3,), -4.0))
    assert [scaler.loss_scale() for scaler in optimizer._loss_scaler] == [2.0 ** 16] * 2


def test_optim_wrapper_skips_the_step_after_an_overflow_in_any_loss():
    weight, optimizer = _weight_and_wrapper(o1(), num_loss=2)
    optimizer.zero_grad()
    _backward(optimizer, (weight * 2.0).sum())
    _backward(optimizer, (weight * float("inf")).sum())
    optimizer.step()
    assert torch.equal(weight.detach(), torch.ones(3))  # skipped
    assert [scaler.loss_scale() for scaler in optimizer._loss_scaler] == [2.0 ** 16, 2.0 ** 15]
    optimizer.zero_grad()
    _backward(optimizer, (weight * 2.0).sum())
    _backward(optimizer, (weight * 1.0).sum())
    optimizer.step()
    assert torch.equal(weight.detach(), torch.full((3,), -2.0))  # the next step runs


def test_optim_wrapper_errors():
    weight, optimizer = _weight_and_wrapper(o1(), num_loss=1)
    _backward(optimizer, weight.sum())
    with pytest.raises(RuntimeError, match=r"num_loss=2"):
        _backward(optimizer, weight.sum())
    with pytest.raises(NotImplementedError, match="closure"):
        optimizer.step(lambda: None)


def test_optim_wrapper_forwards_to_the_optimizer():
    weight, optimizer = _weight_and_wrapper(o1(), num_loss=1)
    assert optimizer.param_groups[0]["params"] == [weight]
    assert optimizer.defaults["lr"] == 1.0
    assert optimizer.state_dict()["param_groups"][0]["lr"] == 1.0
    assert "SGD" in repr(optimizer)


def test_optim_wrapper_of_a_disabled_handle_is_plain():
    weight, optimizer = _weight_and_wrapper(init(enabled=False), num_loss=1)
    loss = weight.sum()
    with optimizer.scale_loss(loss) as scaled_loss:
        assert scaled_loss is loss
        scaled_loss.backward()
    optimizer.step()
    assert torch.equal(weight.detach(), torch.zeros(3))


# --- the 2018 handle.scale_loss -------------------------------------------------------------

class _RecordingSGD(torch.optim.SGD):
    """Records whether autocast was on when step() ran."""

    def step(self, closure=None):
        self.autocast_during_step = torch.is_autocast_enabled("cpu")
        return super().step(closure)


def test_handle_scale_loss_trains_with_unscaled_grads():
    torch.manual_seed(0)
    handle = o1()
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = _RecordingSGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 8)
    y = x.sum(dim=1, keepdim=True).sin()
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        with handle.scale_loss(loss, optimizer) as scaled_loss:
            assert scaled_loss.dtype == torch.float32
            assert torch.allclose(scaled_loss, loss.float() * 2.0 ** 16)
            assert not torch.is_autocast_enabled("cpu")
            scaled_loss.backward()
        assert torch.is_autocast_enabled("cpu")
        assert model[0].weight.grad.abs().max() < 100  # unscaled at exit
        optimizer.step()
        assert optimizer.autocast_during_step is False
        losses.append(loss.item())
    assert losses[-1] < 0.75 * losses[0]
    assert handle._default_scaler._unskipped == 30


def test_handle_scale_loss_skips_the_step_after_an_overflow():
    handle = o1()
    weight = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    with handle.scale_loss((weight * float("inf")).sum(), optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    assert torch.equal(weight.detach(), torch.ones(3))
    assert handle._default_scaler.loss_scale() == 2.0 ** 15
    optimizer.zero_grad()
    context = handle.scale_loss((weight * 2.0).sum(), optimizer)  # manual use, as some code does
    context.__enter__().backward()
    assert context.__exit__(None, None, None) is False
    optimizer.step()
    assert torch.equal(weight.detach(), torch.full((3,), -1.0))


def test_handle_scale_loss_after_wrap_optimizer_points_to_the_wrapper():
    handle = o1()
    weight = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    handle.wrap_optimizer(optimizer)
    with pytest.raises(RuntimeError, match=r"optimizer\.scale_loss\(loss\)"):
        handle.scale_loss(weight.sum(), optimizer)
