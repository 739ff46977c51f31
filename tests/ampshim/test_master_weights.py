import io

import pytest
import torch

from _amp_testing import exact_linear, fresh_amp_state, int_batch, mlp, quiet  # noqa: F401
from ampshim.initialize import initialize
from ampshim.scale_loss import scale_loss
from ampshim.state import _amp_state, load_state_dict, master_params, state_dict

pytestmark = quiet

HALF = torch.bfloat16  # what O2 casts to on the CPU


def o2(model, optimizer=None, **kwargs):
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=1.0)
    return initialize(model, optimizer, opt_level="O2", verbosity=0, **kwargs)


def backward(model, optimizer, value, **kwargs):
    with scale_loss(model(int_batch(value)).sum(), optimizer, **kwargs) as scaled:
        scaled.backward()


def test_masters_replace_half_params_in_param_groups():
    model, optimizer = o2(mlp())
    model_params = list(model.parameters())
    # before lazy init, master_params yields the model's own (half) parameters, like apex
    assert [p.dtype for p in master_params(optimizer)][0] == HALF
    optimizer._amp_lazy_init()
    stash = optimizer._amp_stash
    masters = list(master_params(optimizer))
    assert all(p.dtype == torch.float32 for p in masters)
    assert stash.all_fp16_params == [p for p in model_params if p.dtype == HALF]
    assert len(stash.all_fp32_from_fp16_params) == 4 and len(stash.all_fp32_from_fp32_params) == 2
    assert stash.all_fp32_from_fp16_params[0] is optimizer.param_groups[0]["params"][0]
    assert stash.all_fp32_from_fp32_params[0] is model[1].weight  # batch norm stays fp32
    for half, master in zip(stash.all_fp16_params, stash.all_fp32_from_fp16_params):
        assert torch.equal(half.float(), master) and master.requires_grad and master.is_leaf
    assert [len(g) for g in stash.fp16_groups] == [4]


def test_existing_optimizer_state_is_rekeyed_to_fp32_masters():
    model = exact_linear()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(int_batch(1)).sum().backward()
    optimizer.step()
    model, optimizer = o2(model, optimizer)
    optimizer._amp_lazy_init()
    [master] = optimizer.param_groups[0]["params"]
    assert master is not model.weight and master in optimizer.state
    assert model.weight not in optimizer.state
    assert optimizer.state[master]["exp_avg"].dtype == torch.float32


def _adam_with_tiny_second_moments():
    model = exact_linear()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    (model(int_batch(1)).sum() * 1e-5).backward()
    optimizer.step()
    exp_avg_sq = optimizer.state[model.weight]["exp_avg_sq"]
    assert exp_avg_sq.max() < 1e-10  # underflows in float16, rounds in bfloat16
    return model, optimizer, exp_avg_sq.clone()


def test_existing_fp32_state_never_passes_through_half_precision():
    model, optimizer, exp_avg_sq = _adam_with_tiny_second_moments()
    model, optimizer = o2(model, optimizer)
    backward(model, optimizer, 1)
    [master] = optimizer.param_groups[0]["params"]
    assert torch.equal(optimizer.state[master]["exp_avg_sq"], exp_avg_sq)


def test_loading_a_checkpoint_after_initialize_keeps_fp32_state():
    model, optimizer, exp_avg_sq = _adam_with_tiny_second_moments()
    checkpoint = optimizer.state_dict()
    fresh = exact_linear()
    fresh, fresh_optimizer = o2(fresh, torch.optim.Adam(fresh.parameters(), lr=0.1))
    fresh_optimizer.load_state_dict(checkpoint)
    [master] = fresh_optimizer.param_groups[0]["params"]
    assert master.dtype == torch.float32
    assert torch.equal(fresh_optimizer.state[master]["exp_avg_sq"], exp_avg_sq)


def test_step_before_any_backward_is_harmless():
    model, optimizer = o2(exact_linear())
    before = model.weight.detach().clone()
    optimizer.step()
    assert torch.equal(model.weight, before)


def test_step_copies_masters_back_and_drops_master_grads():
    model, optimizer = o2(exact_linear())
    before = model.weight.detach().float().clone()
    backward(model, optimizer, 1)
    [master] = optimizer._amp_stash.all_fp32_from_fp16_params
    assert master.grad.dtype == torch.float32 and torch.equal(master.grad, torch.full((3, 2), 2.))
    # apex: the half model grads hold the last backward's SCALED grads
    assert torch.equal(model.weight.grad.float(), torch.full((3, 2), 2. * 2**16))
    optimizer.step()
    assert torch.equal(master, before - 2.)
    assert model.weight.dtype == HALF and torch.equal(model.weight, master.to(HALF))
    assert master.grad is None


def test_accumulation_into_masters_is_exact_across_scales():
    model, optimizer = o2(exact_linear(), num_losses=2)
    _amp_state.loss_scalers[1]._loss_scale = 4.
    backward(model, optimizer, 1)
    backward(model, optimizer, 3, loss_id=1)
    backward(model, optimizer, 5, delay_unscale=True)
    backward(model, optimizer, 7)
    [master] = optimizer._amp_stash.all_fp32_from_fp16_params
    assert torch.equal(master.grad, torch.full((3, 2), 2. * (1 + 3 + 5 + 7)))


@pytest.mark.parametrize("loss_scale", ["dynamic", 1.0])
def test_fp32_params_accumulate_through_the_stash(loss_scale):
    # With a static scale of 1.0 apex dropped the accumulated grads of fp32 params (its post
    # step returned early without restoring the stash); ampshim keeps them.
    model = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False), torch.nn.BatchNorm1d(2))
    model, optimizer = o2(model, loss_scale=loss_scale)
    x = torch.randn(4, 2)
    grads = []
    for _ in range(2):
        with scale_loss(model(x).float().pow(2).sum(), optimizer) as scaled:
            scaled.backward()
        grads.append(model[1].weight.grad.clone())
    assert torch.allclose(grads[1], 2 * grads[0], rtol=1e-6)


def test_zero_grad_zeroes_model_grads_in_place_and_drops_master_grads():
    model, optimizer = o2(mlp())
    with scale_loss(model(torch.randn(4, 4)).sum(), optimizer) as scaled:
        scaled.backward()
    half_grad = model[0].weight.grad
    optimizer.zero_grad()
    assert model[0].weight.grad is half_grad and not half_grad.any()
    assert not model[1].weight.grad.any()
    assert all(m.grad is None for m in optimizer._amp_stash.all_fp32_from_fp16_params)


def test_zero_grad_accepts_set_to_none():
    model, optimizer = o2(mlp())
    with scale_loss(model(torch.randn(4, 4)).sum(), optimizer) as scaled:
        scaled.backward()
    optimizer.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())
    assert all(p.grad is None for p in master_params(optimizer))


def test_closure_is_rejected():
    model, optimizer = o2(exact_linear())
    with pytest.raises(RuntimeError, match="^Currently, Amp does not support closure use with "
                                           "optimizers.$"):
        optimizer.step(lambda: 0.)


def test_add_param_group_gets_masters():
    model, optimizer = o2(exact_linear())
    extra = torch.nn.Parameter(torch.ones(2, dtype=HALF))
    optimizer.add_param_group({"params": extra, "lr": 0.5})
    master = optimizer.param_groups[1]["params"][0]
    assert master.dtype == torch.float32 and optimizer._amp_stash.all_fp16_params[-1] is extra
    with pytest.raises(TypeError, match="ordered collections"):
        optimizer.add_param_group({"params": {torch.nn.Parameter(torch.ones(1))}})
    with scale_loss(extra.float().sum() * 3, optimizer) as scaled:
        scaled.backward()
    assert torch.equal(master.grad, torch.full((2,), 3.))
    optimizer.step()
    assert extra.dtype == HALF and torch.equal(extra, torch.full((2,), -0.5, dtype=HALF))


def test_add_param_group_without_master_weights():
    model = exact_linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model, optimizer = initialize(model, optimizer, opt_level="O0", loss_scale="dynamic",
                                  verbosity=0)
    extra = torch.nn.Parameter(torch.ones(2))
    optimizer.add_param_group({"params": [extra]})
    assert optimizer._amp_stash.all_fp32_params[-1] is extra
    with scale_loss(extra.sum() * 3, optimizer) as scaled:
        scaled.backward()
    assert torch.equal(extra.grad, torch.full((2,), 3.))
    with pytest.raises(TypeError, match="float32 or half-precision"):
        optimizer.add_param_group({"params": [torch.nn.Parameter(torch.ones(1).double())]})


def test_o2_training_reduces_the_loss():
    torch.manual_seed(0)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = o2(model, optimizer)
    inputs = torch.randn(64, 4)
    targets = inputs[:, :2] * 2 - inputs[:, 2:]
    losses = []
    for _ in range(60):
        optimizer.zero_grad()
        out = model(inputs)
        assert out.dtype == torch.float32
        loss = torch.nn.functional.mse_loss(out, targets)
        with scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        torch.nn.utils.clip_grad_norm_(master_params(optimizer), 5.0)
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_step_copy_back_is_one_fused_copy(monkeypatch):
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)])
    model, optimizer = o2(model)
    with scale_loss(model(torch.randn(2, 4)).sum(), optimizer) as scaled:
        scaled.backward()
    calls = []
    original = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda *a, **k: (calls.append(len(a[0])),
                                                                  original(*a, **k)))
    monkeypatch.setattr(torch.Tensor, "copy_", lambda *a, **k: pytest.fail("per-tensor copy"))
    optimizer.step()
    assert calls == [10]



def test_canonical_checkpoint_resume():
    def build():
        model = mlp()
        return o2(model, torch.optim.Adam(model.parameters(), lr=1e-2))

    model, optimizer = build()
    inputs = torch.randn(16, 4)
    for _ in range(3):
        optimizer.zero_grad()
        with scale_loss(model(inputs).pow(2).mean(), optimizer) as scaled:
            scaled.backward()
        optimizer.step()
    _amp_state.loss_scalers[0]._loss_scale = 1024.0
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "amp": state_dict()}, buffer)
    buffer.seek(0)

    resumed, resumed_optimizer = build()
    checkpoint = torch.load(buffer, weights_only=True)
    resumed.load_state_dict(checkpoint["model"])
    resumed_optimizer.load_state_dict(checkpoint["optimizer"])
    load_state_dict(checkpoint["amp"])
    assert _amp_state.loss_scalers[0].loss_scale() == 1024.0
    assert torch.equal(resumed[0].weight, model[0].weight) and resumed[0].weight.dtype == HALF
    saved = optimizer.state[optimizer.param_groups[0]["params"][0]]["exp_avg_sq"]
    loaded = resumed_optimizer.state[resumed_optimizer.param_groups[0]["params"][0]]
    assert loaded["exp_avg_sq"].dtype == torch.float32
    assert torch.equal(loaded["exp_avg_sq"], saved)
    assert torch.equal(resumed(inputs), model(inputs))
