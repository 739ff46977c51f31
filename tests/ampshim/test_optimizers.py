import copy
import math

import pytest
import torch

from ampshim.optimizers import (
    FusedAdagrad,
    FusedAdam,
    FusedLAMB,
    FusedMixedPrecisionLamb,
    FusedNovoGrad,
    FusedSGD,
)


def _params(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g).to(dtype)) for shape in [(4, 3), (3,), (2, 2, 2)]]


def _grads(step, params):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g) for p in params]


def _run(optimizer, params, steps=4, grad_scale=1.0):
    """Feed the same deterministic gradients to ``params`` for ``steps`` steps."""
    for step in range(steps):
        for p, g in zip(params, _grads(step, params)):
            p.grad = (g * grad_scale).to(p.device, p.dtype)
        optimizer.step()
    return [p.detach().float().clone() for p in params]


def _assert_all_close(got, want, **tol):
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **tol)


# --- FusedAdam ----------------------------------------------------------------------------------


def test_fused_adam_defaults_to_adamw():
    kwargs = dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    ours, ref = _params(), _params()
    _assert_all_close(_run(FusedAdam(ours, **kwargs), ours), _run(torch.optim.AdamW(ref, **kwargs), ref))


def test_fused_adam_l2_mode_is_torch_adam():
    kwargs = dict(lr=1e-2, weight_decay=0.1)
    ours, ref = _params(), _params()
    _assert_all_close(_run(FusedAdam(ours, adam_w_mode=False, **kwargs), ours),
                      _run(torch.optim.Adam(ref, **kwargs), ref))


def test_fused_adam_without_bias_correction_by_hand():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = FusedAdam([p], lr=0.1, bias_correction=False, betas=(0.5, 0.75), eps=0.0, weight_decay=0.0)
    p.grad = torch.tensor([2.0, 4.0])
    opt.step()
    m, v = 0.5 * torch.tensor([2.0, 4.0]), 0.25 * torch.tensor([4.0, 16.0])
    torch.testing.assert_close(p.detach(), torch.tensor([1.0, -2.0]) - 0.1 * m / v.sqrt())


def test_fused_adam_reduced_precision_params_keep_fp32_state():
    ours, ref = _params(torch.bfloat16), [p.detach().float().requires_grad_() for p in _params(torch.bfloat16)]
    opt = FusedAdam(ours, lr=1e-2)
    got = _run(opt, ours, steps=1)
    want = _run(torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.0), ref, steps=1)
    _assert_all_close(got, want, atol=2e-2, rtol=2e-2)
    assert {s["exp_avg"].dtype for s in opt.state.values()} == {torch.float32}
    assert {p.dtype for p in ours} == {torch.bfloat16}


def test_fused_adam_master_weights_accumulate_small_updates():
    p = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt = FusedAdam([p], lr=1e-4, capturable=True, master_weights=True)
    for _ in range(10):
        p.grad = torch.ones_like(p)
        opt.step()
    master = opt.state[p]["master_param"]
    torch.testing.assert_close(master, torch.full((4,), 1 - 1e-3), atol=1e-6, rtol=0)
    assert p.dtype == torch.bfloat16
    opt.load_state_dict(opt.state_dict())  # torch casts state to the param dtype on load
    p.grad = torch.ones_like(p)
    opt.step()
    assert opt.state[p]["master_param"].dtype == torch.float32


def test_fused_adam_step_count_lives_in_the_param_group_and_reloads():
    a = _params()
    opt_a = FusedAdam(a, lr=1e-2)
    _run(opt_a, a, steps=3)
    saved = copy.deepcopy(opt_a.state_dict())  # as a checkpoint file would hold it
    assert saved["param_groups"][0]["step"] == 3
    assert set(saved["state"][0]) == {"exp_avg", "exp_avg_sq"}
    b = [p.detach().clone().requires_grad_() for p in a]
    opt_b = FusedAdam(b, lr=1e-2)
    opt_b.load_state_dict(saved)
    for p, q, g in zip(a, b, _grads(7, a)):
        p.grad, q.grad = g, g.clone()
    opt_a.step()
    opt_b.step()
    _assert_all_close(list(b), list(a))


def test_fused_adam_apexs_errors():
    with pytest.raises(RuntimeError, match="AMSGrad"):
        FusedAdam(_params(), amsgrad=True)
    with pytest.raises(TypeError, match="clip_grad_norm_"):
        FusedAdam(_params(), bias_correction=False, max_grad_norm=1.0)  # the pre-2019 signature
    with pytest.raises(RuntimeError, match="capturable"):
        FusedAdam(_params(), master_weights=True)
    opt = FusedAdam(_params())
    with pytest.raises(RuntimeError, match="FusedAdam has been updated"):
        opt.step(grads=[torch.zeros(1)])
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    p.grad = torch.ones_like(p)
    with pytest.raises(RuntimeError, match="float64"):
        FusedAdam([p]).step()
    emb = torch.nn.Embedding(4, 2, sparse=True)
    emb(torch.tensor([1])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse"):
        FusedAdam(emb.parameters()).step()


def test_set_grad_none_chooses_none_or_zeros():
    params = _params()
    for p in params:
        p.grad = torch.ones_like(p)
    FusedAdam(params).zero_grad()
    assert all(p.grad is None for p in params)
    for p in params:
        p.grad = torch.ones_like(p)
    FusedSGD(params, lr=0.1).zero_grad()  # apex's FusedSGD default: set_grad_none=False
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in params)
    FusedAdam(params, set_grad_none=False).zero_grad()
    assert all(p.grad is not None for p in params)


def test_closure_is_evaluated_with_grad_enabled():
    p = torch.nn.Parameter(torch.tensor([3.0]))
    opt = FusedSGD([p], lr=0.5)

    def closure():
        opt.zero_grad()
        loss = (p ** 2).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 9.0
    assert p.item() == 0.0


# --- FusedSGD / FusedAdagrad ---------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9, weight_decay=0.01),
    dict(lr=0.1, momentum=0.9, dampening=0.3),
    dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
])
def test_fused_sgd_is_torch_sgd(kwargs):
    ours, ref = _params(), _params()
    opt = FusedSGD(ours, **kwargs)
    _assert_all_close(_run(opt, ours), _run(torch.optim.SGD(ref, **kwargs), ref))
    if kwargs.get("momentum"):
        assert set(opt.state_dict()["state"][0]) == {"momentum_buffer"}


def test_fused_sgd_weight_decay_after_momentum_by_hand():
    p = torch.nn.Parameter(torch.tensor([1.0]))
    opt = FusedSGD([p], lr=0.1, momentum=0.5, weight_decay=0.2, wd_after_momentum=True)
    p.grad = torch.tensor([2.0])
    opt.step()  # buf = 2; d = 2 + 0.2*1 = 2.2; p = 1 - 0.22
    torch.testing.assert_close(p.detach(), torch.tensor([0.78]))
    p.grad = torch.tensor([2.0])
    opt.step()  # buf = 0.5*2 + 2 = 3; d = 3 + 0.2*0.78
    torch.testing.assert_close(p.detach(), torch.tensor([0.78 - 0.1 * (3 + 0.2 * 0.78)]))


def test_fused_sgd_validates_like_torch():
    with pytest.raises(ValueError, match="Nesterov"):
        FusedSGD(_params(), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="learning rate: -1"):
        FusedSGD(_params(), lr=-1)
    with pytest.raises(ValueError, match="momentum"):
        FusedSGD(_params(), lr=0.1, momentum=-0.5)


def test_fused_adagrad_is_torch_adagrad():
    ours, ref = _params(), _params()
    kwargs = dict(lr=0.1, weight_decay=0.05, eps=1e-10)
    opt = FusedAdagrad(ours, **kwargs)
    _assert_all_close(_run(opt, ours), _run(torch.optim.Adagrad(ref, **kwargs), ref))
    assert "sum" in opt.state_dict()["state"][0]


def test_fused_adagrad_decoupled_weight_decay_by_hand():
    p = torch.nn.Parameter(torch.tensor([1.0]))
    opt = FusedAdagrad([p], lr=0.1, eps=0.0, weight_decay=0.5, adagrad_w_mode=True)
    p.grad = torch.tensor([3.0])
    opt.step()  # sum = 9; p = 1 - 0.1 * (3/3 + 0.5*1)
    torch.testing.assert_close(p.detach(), torch.tensor([0.85]))


# --- FusedLAMB / FusedMixedPrecisionLamb --------------------------------------------------------


def _reference_lamb(params, steps, lr, betas, eps, wd, adam_w_mode=True, grad_averaging=True,
                    max_grad_norm=1.0, use_nvlamb=False, grad_scale=1.0):
    """LAMB written out tensor by tensor from apex's description."""
    beta1, beta2 = betas
    params = [p.detach().clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for step in range(steps):
        grads = [g * grad_scale for g in _grads(step, params)]
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
        if norm > max_grad_norm:
            grads = [g / (norm / max_grad_norm) for g in grads]
        t = step + 1
        for i, p in enumerate(params):
            g = grads[i] + wd * p if not adam_w_mode else grads[i]
            m[i] = beta1 * m[i] + ((1 - beta1) if grad_averaging else 1.0) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            update = (m[i] / (1 - beta1 ** t)) / ((v[i] / (1 - beta2 ** t)).sqrt() + eps)
            if adam_w_mode:
                update = update + wd * p
            ratio = lr
            if wd != 0 or use_nvlamb:
                pn, un = float(p.norm()), float(update.norm())
                if pn != 0 and un != 0:
                    ratio = lr * pn / un
            params[i] = p - ratio * update
    return params


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(adam_w_mode=False),
    dict(weight_decay=0.0),
    dict(weight_decay=0.0, use_nvlamb=True),
    dict(grad_averaging=False, max_grad_norm=100.0),
])
def test_fused_lamb_matches_the_reference(kwargs):
    settings = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01) | kwargs
    ours = _params()
    want = _reference_lamb(_params(), 4, settings.pop("lr"), settings.pop("betas"), settings.pop("eps"),
                           settings.pop("weight_decay"), **settings)
    opt = FusedLAMB(ours, lr=1e-2, betas=(0.9, 0.99), eps=1e-6,
                    weight_decay=kwargs.get("weight_decay", 0.01),
                    **{k: v for k, v in kwargs.items() if k != "weight_decay"})
    _assert_all_close(_run(opt, ours), want)
    assert opt.param_groups[0]["step"] == 4


def test_fused_lamb_clips_all_gradients_together_without_touching_them():
    ours = _params()
    want = _reference_lamb(_params(), 2, 1e-2, (0.9, 0.999), 1e-6, 0.01, grad_scale=50.0)
    _assert_all_close(_run(FusedLAMB(ours, lr=1e-2), ours, steps=2, grad_scale=50.0), want)
    assert torch.equal(ours[1].grad, _grads(1, ours)[1] * 50.0)


def test_fused_mixed_precision_lamb_tracks_fp32_masters():
    low = _params(torch.bfloat16)
    full = [p.detach().float().requires_grad_() for p in low]
    opt = FusedMixedPrecisionLamb(low, lr=1e-2, reduced_precision_dtype=torch.bfloat16)
    ref = FusedLAMB(full, lr=1e-2)
    for step in range(3):
        for p, q, g in zip(low, full, _grads(step, low)):
            p.grad = g.to(torch.bfloat16)
            q.grad = p.grad.float()
        opt.step()
        ref.step()
    masters = opt.param_groups_full_precision[0]["params"]
    _assert_all_close(masters, [q.detach() for q in full])
    _assert_all_close([p.detach() for p in low], [m.to(torch.bfloat16) for m in masters])
    assert int(opt.param_groups[0]["step"]) == 3
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)


def test_fused_mixed_precision_lamb_gives_added_param_groups_masters():
    opt = FusedMixedPrecisionLamb(_params(torch.bfloat16)[:1], reduced_precision_dtype=torch.bfloat16)
    extra = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    opt.add_param_group({"params": [extra], "lr": 0.1})
    assert opt.param_groups_full_precision[1]["params"][0].dtype == torch.float32
    extra.grad = torch.ones_like(extra)
    opt.step()
    assert not torch.equal(extra.detach(), torch.ones(3, dtype=torch.bfloat16))


def test_fused_mixed_precision_lamb_steps_through_grad_scaler_and_skips_overflow():
    model = torch.nn.Linear(3, 1)
    opt = FusedMixedPrecisionLamb(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    before = [p.detach().clone() for p in model.parameters()]
    scaler.scale(model(torch.ones(2, 3)).sum()).backward()
    with pytest.warns(FutureWarning):  # GradScaler's notice about the `grad_scaler` keyword
        scaler.step(opt)
    scaler.update()
    assert int(opt.param_groups[0]["step"]) == 1
    assert not torch.equal(model.weight.detach(), before[0])

    after_first = model.weight.detach().clone()
    opt.zero_grad()
    scaler.scale(model(torch.full((2, 3), float("inf"))).sum()).backward()
    with pytest.warns(FutureWarning):
        scaler.step(opt)
    scaler.update()
    assert torch.equal(model.weight.detach(), after_first)
    assert int(opt.param_groups[0]["step"]) == 1
    assert scaler.get_scale() == 512.0


# --- FusedNovoGrad -----------------------------------------------------------------------------


def _reference_novograd(params, steps, lr, betas, eps, wd, reg_inside_moment=False, norm_type=2,
                        init_zero=False):
    beta1, beta2 = betas
    params = [p.detach().clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [None] * len(params)
    for step in range(steps):
        t = step + 1
        for i, (p, g) in enumerate(zip(params, _grads(step, params))):
            n = float(g.abs().max()) if norm_type == 0 else float(g.norm())
            if v[i] is None:
                v[i] = 0.0 if init_zero else n
            v[i] = beta2 * v[i] + (1 - beta2) * n if norm_type == 0 else \
                math.sqrt(beta2 * v[i] ** 2 + (1 - beta2) * n ** 2)
            denom = v[i] / math.sqrt(1 - beta2 ** t) + eps
            if reg_inside_moment:
                m[i] = beta1 * m[i] + (1 - beta1) * (g / denom + wd * p)
                params[i] = p - lr * m[i] / (1 - beta1 ** t)
            else:
                m[i] = beta1 * m[i] + (1 - beta1) * g
                params[i] = p - lr * (m[i] / (1 - beta1 ** t) / denom + wd * p)
    return params


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(reg_inside_moment=True),
    dict(norm_type=0),
    dict(init_zero=True),
])
def test_fused_novograd_matches_the_reference(kwargs):
    ours = _params()
    opt = FusedNovoGrad(ours, lr=1e-2, betas=(0.9, 0.98), weight_decay=0.01, **kwargs)
    want = _reference_novograd(_params(), 3, 1e-2, (0.9, 0.98), 1e-8, 0.01, **kwargs)
    _assert_all_close(_run(opt, ours, steps=3), want)
    fp16_norms, fp32_norms = opt.param_groups[0]["exp_avg_sq"]
    assert fp16_norms is None and fp32_norms.shape == (3,)


def test_fused_novograd_keeps_reduced_precision_norms_first():
    params = [torch.nn.Parameter(torch.ones(2, dtype=torch.float16)), torch.nn.Parameter(torch.ones(3))]
    opt = FusedNovoGrad(params)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    reduced, full = opt.param_groups[0]["exp_avg_sq"]
    torch.testing.assert_close(reduced, torch.tensor([math.sqrt(2)]))
    torch.testing.assert_close(full, torch.tensor([math.sqrt(3)]))


def test_apex_import_path():
    from apex.optimizers import FusedAdam as ApexFusedAdam

    assert ApexFusedAdam is FusedAdam


def test_fused_adam_loads_a_state_dict_in_apexs_layout():
    # What apex wrote for a half parameter after 5 steps: fp32 moments, step in the param group.
    p = torch.nn.Parameter(torch.tensor([1.0, -1.0], dtype=torch.float16))
    opt = FusedAdam([p], lr=0.1, betas=(0.5, 0.5), eps=0.0)
    opt.load_state_dict({
        "state": {0: {"exp_avg": torch.tensor([0.2, 0.2]), "exp_avg_sq": torch.tensor([0.04, 0.16])}},
        "param_groups": [{"lr": 0.1, "bias_correction": True, "betas": (0.5, 0.5), "eps": 0.0,
                          "weight_decay": 0.0, "step": 5, "params": [0]}],
    })
    p.grad = torch.tensor([0.2, 0.4], dtype=torch.float16)
    opt.step()
    m = 0.5 * torch.tensor([0.2, 0.2]) + 0.5 * torch.tensor([0.2, 0.4])
    v = 0.5 * torch.tensor([0.04, 0.16]) + 0.5 * torch.tensor([0.04, 0.16])
    expected = torch.tensor([1.0, -1.0]) - 0.1 * (m / (1 - 0.5 ** 6)) / (v / (1 - 0.5 ** 6)).sqrt()
    torch.testing.assert_close(p.detach().float(), expected.half().float())
    assert opt.param_groups[0]["step"] == 6
    assert opt.state[p]["exp_avg"].dtype == torch.float32


@pytest.mark.cuda
def test_fused_adam_on_cuda_matches_adamw():
    ours = [p.detach().cuda().requires_grad_() for p in _params()]
    ref = [p.detach().cuda().requires_grad_() for p in _params()]
    got = _run(FusedAdam(ours, lr=1e-2, weight_decay=0.1), ours)
    want = _run(torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1), ref)
    _assert_all_close(got, want)


def test_fused_adam_keeps_the_step_count_per_group_as_apex_did_which_torchs_adam_cannot_load():
    """Why ``ampmigrate`` leaves FusedAdam where a project resumes optimizers (compatibility table)."""
    from ampshim.optimizers import FusedAdam

    weight = torch.nn.Parameter(torch.ones(3))
    fused = FusedAdam([weight], lr=1e-3)
    weight.grad = torch.ones(3)
    fused.step()
    state = fused.state_dict()
    assert state["param_groups"][0]["step"] == 1 and "step" not in state["state"][0]
    native = torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))], lr=1e-3)
    with pytest.raises(KeyError, match="step"):
        native.load_state_dict(state)
