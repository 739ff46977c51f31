import pytest
import torch

from _amp_testing import exact_linear, fresh_amp_state, int_batch, quiet  # noqa: F401
from ampshim.initialize import initialize
from ampshim.scale_loss import _ScaleLoss, scale_loss
from ampshim.scaler import LossScaler
from ampshim.state import _amp_state, master_params

pytestmark = quiet

OVERFLOW_MESSAGE = "Gradient overflow.  Skipping step, loss scaler {} reducing loss scale to {}\n"


def setup(opt_level="O0", num_models=1, **kwargs):
    models = [exact_linear() for _ in range(num_models)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=1.0) for m in models]
    models, optimizers = initialize(models, optimizers, opt_level=opt_level, verbosity=0,
                                    **kwargs)
    _amp_state.verbosity = 1  # quiet initialize, but print overflow messages
    return models, optimizers


def backward(model, optimizer, value, **kwargs):
    loss = model(int_batch(value)).sum()
    with scale_loss(loss, optimizer, **kwargs) as scaled:
        scaled.backward()
    return loss


def grad_of(value):
    """d/dW of exact_linear()(int_batch(value)).sum(): every entry is rows * value."""
    return torch.full((3, 2), 2. * value)


def test_requires_initialize():
    with pytest.raises(RuntimeError) as info:
        with scale_loss(torch.ones(()), []):
            pass
    assert str(info.value) == (
        "Invoked 'with amp.scale_loss`, but internal Amp state has not been initialized. "
        "model, optimizer = amp.initialize(model, optimizer, opt_level=...) must be called "
        "before `with amp.scale_loss`.")


def test_disabled_yields_the_raw_loss():
    model = exact_linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    initialize(model, optimizer, enabled=False)
    loss = model(int_batch(1)).sum()
    with scale_loss(loss, optimizer) as scaled:
        assert scaled is loss
        scaled.backward()
    assert torch.equal(model.weight.grad, grad_of(1))


def test_yields_scaled_fp32_tensor_and_unscales_at_exit(capsys):
    [model], [optimizer] = setup(loss_scale="dynamic")
    loss = model(int_batch(1)).sum().to(torch.bfloat16)
    with scale_loss(loss, optimizer) as scaled:
        assert isinstance(scaled, torch.Tensor) and scaled.dtype == torch.float32
        assert scaled.item() == loss.float().item() * 2.**16
        scaled.backward()
    assert torch.equal(model.weight.grad, grad_of(1))
    assert _amp_state.loss_scalers[0]._unskipped == 1


def test_non_scalar_loss_and_explicit_gradient():
    [model], [optimizer] = setup(loss_scale="dynamic")
    loss = model(int_batch(1))
    with scale_loss(loss, optimizer) as scaled:
        scaled.backward(torch.ones_like(scaled))
    assert torch.equal(model.weight.grad, grad_of(1))


@pytest.mark.parametrize("opt_level", ["O0", "O3"])
def test_static_scale_one_short_circuits(opt_level):
    [model], [optimizer] = setup(opt_level)
    model.weight.grad = torch.ones(3, 2, dtype=model.weight.dtype)
    loss = model(int_batch(1)).sum()
    with scale_loss(loss, optimizer) as scaled:
        assert scaled.dtype == torch.float32 and scaled.item() == loss.float().item()
        scaled.backward()
    assert not hasattr(optimizer._amp_stash, "all_fp32_params")  # nothing was prepared
    assert torch.equal(model.weight.grad.float(), grad_of(1) + 1)
    assert _amp_state.loss_scalers[0]._unskipped == 0


def test_forced_overflow_skips_the_next_step_once_and_halves(capsys):
    [model], [optimizer] = setup(loss_scale="dynamic")
    before = model.weight.detach().clone()
    backward(model, optimizer, float("inf"))
    assert _amp_state.loss_scalers[0].loss_scale() == 2.**15
    assert capsys.readouterr().out == ""
    assert optimizer._amp_stash.already_patched  # apex's name for "next step is skipped"
    assert optimizer.step() is None
    assert capsys.readouterr().out == OVERFLOW_MESSAGE.format(0, 32768.0)
    assert torch.equal(model.weight, before)
    assert not optimizer._amp_stash.already_patched
    optimizer.zero_grad()
    backward(model, optimizer, 1)
    optimizer.step()
    assert torch.equal(model.weight, before - grad_of(1))
    assert capsys.readouterr().out == ""


def test_overflow_message_respects_verbosity(capsys):
    [model], [optimizer] = setup(loss_scale="dynamic")
    _amp_state.verbosity = 0
    backward(model, optimizer, float("nan"))
    optimizer.step()
    assert capsys.readouterr().out == ""


def test_only_optimizers_of_the_overflowing_call_skip(capsys):
    (m0, m1), (o0, o1) = setup(num_models=2, loss_scale="dynamic")
    before0, before1 = m0.weight.detach().clone(), m1.weight.detach().clone()
    backward(m0, o0, float("inf"))
    backward(m1, o1, 1)
    o0.step()
    o1.step()
    assert torch.equal(m0.weight, before0)
    assert torch.equal(m1.weight, before1 - grad_of(1))


def test_several_overflows_one_skip_scale_halves_each_time(capsys):
    [model], [optimizer] = setup(loss_scale="dynamic")
    before = model.weight.detach().clone()
    backward(model, optimizer, float("inf"))
    backward(model, optimizer, float("inf"))
    optimizer.step()
    assert capsys.readouterr().out == OVERFLOW_MESSAGE.format(0, 16384.0)
    assert torch.equal(model.weight, before)
    optimizer.zero_grad()
    backward(model, optimizer, 1)
    optimizer.step()
    assert torch.equal(model.weight, before - grad_of(1))


def test_list_of_optimizers_all_skip(capsys):
    (m0, m1), (o0, o1) = setup(num_models=2, loss_scale="dynamic")
    loss = m0(int_batch(float("inf"))).sum() + m1(int_batch(1)).sum()
    with scale_loss(loss, [o0, o1]) as scaled:
        scaled.backward()
    o0.step()
    o1.step()
    assert capsys.readouterr().out == OVERFLOW_MESSAGE.format(0, 32768.0) * 2


def test_growth_after_2000_clean_backward_passes():
    [model], [optimizer] = setup(loss_scale="dynamic")
    scaler = _amp_state.loss_scalers[0]
    scaler._unskipped = 1998  # scripts poke this, as apex's own tests did
    backward(model, optimizer, 1)
    assert scaler.loss_scale() == 2.**16
    backward(model, optimizer, 1)
    assert scaler.loss_scale() == 2.**17 and scaler._unskipped == 0


def test_min_and_max_loss_scale_from_initialize():
    [model], [optimizer] = setup(loss_scale="dynamic", min_loss_scale=2.**15,
                                 max_loss_scale=2.**16)
    scaler = _amp_state.loss_scalers[0]
    for _ in range(3):
        backward(model, optimizer, float("inf"))
    assert scaler.loss_scale() == 2.**15
    scaler._unskipped = 1999
    backward(model, optimizer, 1)
    scaler._unskipped = 1999
    backward(model, optimizer, 1)
    assert scaler.loss_scale() == 2.**16


def test_static_scale_never_skips(capsys):
    [model], [optimizer] = setup(loss_scale=128.0)
    with scale_loss(model(int_batch(1)).sum(), optimizer) as scaled:
        assert scaled.item() == model(int_batch(1)).sum().item() * 128.0
        scaled.backward()
    assert torch.equal(model.weight.grad, grad_of(1))
    backward(model, optimizer, float("inf"))
    before = model.weight.detach().clone()
    optimizer.step()
    assert not torch.equal(model.weight, before)  # the step ran
    assert _amp_state.loss_scalers[0].loss_scale() == 128.0
    assert capsys.readouterr().out.count("Gradient overflow") == 0


def test_accumulation_is_exact_across_scale_changes_and_delay_unscale():
    [model], [optimizer] = setup(loss_scale="dynamic", num_losses=2)
    _amp_state.loss_scalers[1]._loss_scale = 2.**3
    backward(model, optimizer, 1)                                     # scale 2**16
    backward(model, optimizer, 2, loss_id=1)                          # scale 2**3
    _amp_state.loss_scalers[0]._loss_scale = 2.**5                    # a new scale mid-way
    backward(model, optimizer, 3, delay_unscale=True)                 # left scaled...
    assert torch.equal(model.weight.grad, grad_of(3) * 2.**5)  # (earlier grads are stashed)
    backward(model, optimizer, 4, delay_unscale=True)
    backward(model, optimizer, 5)                                     # ...unscaled here
    assert torch.equal(model.weight.grad, sum(grad_of(v) for v in (1, 2, 3, 4, 5)))
    assert optimizer._amp_stash.params_have_scaled_gradients is False


def test_delayed_pass_does_not_check_or_update(capsys):
    [model], [optimizer] = setup(loss_scale="dynamic")
    backward(model, optimizer, float("inf"), delay_unscale=True)
    scaler = _amp_state.loss_scalers[0]
    assert scaler._unskipped == 0 and scaler.loss_scale() == 2.**16
    assert optimizer._amp_stash.params_have_scaled_gradients
    assert torch.isinf(model.weight.grad).all()
    backward(model, optimizer, 1)  # the window's overflow is caught when it is unscaled
    assert scaler.loss_scale() == 2.**15
    optimizer.step()
    assert "Gradient overflow" in capsys.readouterr().out


def test_loss_id_uses_its_own_scaler(capsys):
    [model], [optimizer] = setup(loss_scale="dynamic", num_losses=2)
    backward(model, optimizer, float("inf"), loss_id=1)
    assert [s.loss_scale() for s in _amp_state.loss_scalers] == [2.**16, 2.**15]
    optimizer.step()
    assert capsys.readouterr().out == OVERFLOW_MESSAGE.format(1, 32768.0)


def test_out_of_range_loss_id_and_zero_losses_are_named():
    [model], [optimizer] = setup(loss_scale="dynamic")
    with pytest.raises(IndexError, match=r"loss_id=1 is out of range: .*num_losses=1"):
        backward(model, optimizer, 1, loss_id=1)
    with pytest.raises(ValueError, match=r"loss_id must be at least 0, got -1"):
        backward(model, optimizer, 1, loss_id=-1)
    with pytest.raises(TypeError, match=r"loss_id must be an integer, got 'gen'"):
        backward(model, optimizer, 1, loss_id="gen")
    assert model.weight.grad is None  # nothing was half-done
    with pytest.raises(ValueError, match=r"num_losses must be at least 1, got 0"):
        setup(loss_scale="dynamic", num_losses=0)


def test_a_number_instead_of_the_loss_tensor_is_named():
    [model], [optimizer] = setup(loss_scale="dynamic")
    with pytest.raises(TypeError, match=r"expects the loss as a tensor, got 1.5 \(float\)"):
        with scale_loss(1.5, optimizer):
            pass
    assert not optimizer._amp_stash.params_have_scaled_gradients


def test_delay_overflow_check_unscales_without_update(capsys):
    [model], [optimizer] = setup(loss_scale="dynamic")
    backward(model, optimizer, 1, delay_overflow_check=True)
    assert torch.equal(model.weight.grad, grad_of(1))
    optimizer.zero_grad()
    backward(model, optimizer, float("inf"), delay_overflow_check=True)
    scaler = _amp_state.loss_scalers[0]
    assert scaler.loss_scale() == 2.**16 and scaler._unskipped == 0
    assert not optimizer._amp_stash.already_patched


def test_manual_enter_exit_is_falsy():
    [model], [optimizer] = setup(loss_scale="dynamic")
    context = scale_loss(model(int_batch(1)).sum(), optimizer)
    scaled = context.__enter__()
    scaled.backward()
    assert not context.__exit__(None, None, None)
    assert torch.equal(model.weight.grad, grad_of(1))


@pytest.mark.parametrize("opt_level", ["O0", "O2"])
def test_exception_in_body_propagates_and_restores_earlier_grads(opt_level):
    [model], [optimizer] = setup(opt_level, loss_scale="dynamic")
    backward(model, optimizer, 1)
    with pytest.raises(ValueError):
        with scale_loss(model(int_batch(2)).sum(), optimizer) as scaled:
            scaled.backward()
            raise ValueError("e.g. out of memory; the caller skips this batch")
    assert _amp_state.loss_scalers[0]._unskipped == 1
    backward(model, optimizer, 3)
    [accumulated] = [p.grad for p in master_params(optimizer)]
    assert torch.equal(accumulated, grad_of(1) + grad_of(3))


def test_wrapper_with_param_groups_and_step_is_accepted(capsys):
    class Wrapper:  # LARC's shape: not an Optimizer, proxies param_groups/state/step
        def __init__(self, inner):
            self.optim = inner

        param_groups = property(lambda self: self.optim.param_groups)
        state = property(lambda self: self.optim.state)

        def step(self):
            return self.optim.step()

        def add_param_group(self, group):
            self.optim.add_param_group(group)

        def state_dict(self):
            return self.optim.state_dict()

        def load_state_dict(self, state_dict):
            self.optim.load_state_dict(state_dict)

    model = exact_linear()
    wrapper = Wrapper(torch.optim.SGD(model.parameters(), lr=1.0))
    model, returned = initialize(model, wrapper, opt_level="O2", verbosity=0)
    assert returned is wrapper
    before = model.weight.detach().clone()
    backward(model, wrapper, float("inf"))
    wrapper.step()
    assert torch.equal(model.weight, before)
    backward(model, wrapper, 1)
    wrapper.step()
    assert torch.equal(model.weight.float(), (before.float() - grad_of(1)))


def test_o2_optimizer_not_from_initialize_is_a_clear_error():
    setup("O2")
    stranger = torch.optim.SGD(exact_linear().parameters(), lr=1.0)
    with pytest.raises(RuntimeError, match="never saw"):
        with scale_loss(torch.ones(()), stranger):
            pass


def test_o0_optimizer_not_from_initialize_is_equipped_on_use():
    setup("O0", loss_scale="dynamic")
    model = exact_linear()
    stranger = torch.optim.SGD(model.parameters(), lr=1.0)
    backward(model, stranger, 1)
    assert torch.equal(model.weight.grad, grad_of(1))


def test_internal_entry_works_without_initialize(capsys):
    assert not hasattr(_amp_state, "opt_properties")
    model = exact_linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = LossScaler("dynamic")
    cleared = []
    with _ScaleLoss(model(int_batch(1)).sum(), optimizer, scaler, loss_id=3,
                    clear_cache=lambda: cleared.append(True)) as scaled:
        scaled.backward()
    assert torch.equal(model.weight.grad, grad_of(1)) and cleared == [True]
    with _ScaleLoss(model(int_batch(float("inf"))).sum(), [optimizer], scaler) as scaled:
        scaled.backward()
    optimizer.step()
    assert "loss scaler 0 reducing loss scale to 32768.0" in capsys.readouterr().out


class _SyncCounter:
    """Counts host reads of tensor values (the CPU analogue of a device synchronisation)."""

    METHODS = ("item", "tolist", "__bool__", "__float__", "__int__")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.METHODS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(original))

    def _counting(self, original):
        def counted(tensor, *args, **kwargs):
            self.count += 1
            return original(tensor, *args, **kwargs)

        return counted


@pytest.mark.parametrize("opt_level", ["O0", "O2"])
def test_one_host_read_per_exit_and_none_in_step(monkeypatch, opt_level):
    models = [torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))]
    optimizer = torch.optim.SGD(models[0].parameters(), lr=0.1, momentum=0.9)
    [model], optimizer = initialize(models, optimizer, opt_level=opt_level,
                                    loss_scale="dynamic", verbosity=0)
    for delay in (True, False, False):
        loss = model(torch.randn(3, 4)).float().sum()
        counter = _SyncCounter(monkeypatch)
        context = scale_loss(loss, optimizer, delay_unscale=delay)
        context.__enter__().backward()
        counter.count = 0
        context.__exit__(None, None, None)
        assert counter.count == (0 if delay else 1)
        monkeypatch.undo()
    counter = _SyncCounter(monkeypatch)
    optimizer.step()
    optimizer.zero_grad()
    assert counter.count == 0


def test_lr_scheduler_created_while_a_skip_is_pending_still_works(recwarn):
    [model], [optimizer] = setup(loss_scale="dynamic")
    backward(model, optimizer, float("inf"))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    optimizer.step()  # skipped
    scheduler.step()
    optimizer.zero_grad()
    backward(model, optimizer, 1)
    before = model.weight.detach().clone()
    optimizer.step()
    assert torch.equal(model.weight, before - 0.5 * grad_of(1))
    assert not [w for w in recwarn if "lr_scheduler" in str(w.message)]


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
def test_a_loss_that_stays_nan_for_200_steps_never_crashes(opt_level):
    [model], [optimizer] = setup(opt_level=opt_level)
    _amp_state.verbosity = 0
    weights = [p.detach().clone() for p in model.parameters()]
    with pytest.warns(RuntimeWarning, match="inf/NaN in 50 consecutive backward passes"):
        for _ in range(200):  # the scale reaches its floor after 142
            optimizer.zero_grad()
            backward(model, optimizer, float("nan"))
            optimizer.step()
    assert all(torch.equal(p.detach().float(), w.float())
               for p, w in zip(model.parameters(), weights))
    assert _amp_state.loss_scalers[0].loss_scale() == 2.**-126
    optimizer.zero_grad()
    backward(model, optimizer, 1)
    optimizer.step()  # the loss is finite again: the step happens
    assert not all(torch.equal(p.detach().float(), w.float())
                   for p, w in zip(model.parameters(), weights))


@pytest.mark.parametrize("loss_scale", ["dynamic", 128.0])
def test_sparse_gradients_are_unscaled_and_checked_for_overflow(loss_scale):
    # `nn.Embedding(sparse=True)` under O1: its gradient's values are unscaled, an inf among them skips the step
    embedding = torch.nn.Embedding(10, 2, sparse=True)
    torch.nn.init.zeros_(embedding.weight)  # whole numbers: the sparse step's sums are exact in any order
    optimizer = torch.optim.SGD(embedding.parameters(), lr=1.0)
    embedding, optimizer = initialize(embedding, optimizer, opt_level="O1", loss_scale=loss_scale, verbosity=0)
    before = embedding.weight.detach().clone()
    loss = embedding(torch.tensor([1, 2, 2])).float().sum()
    with scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    grad = embedding.weight.grad.coalesce().to_dense()
    assert torch.equal(grad[2], torch.full((2,), 2.0)) and torch.equal(grad[1], torch.ones(2))
    optimizer.step()
    assert torch.equal(embedding.weight.detach(), before - grad)
    if loss_scale == "dynamic":
        optimizer.zero_grad()
        with scale_loss(embedding(torch.tensor([3])).float().sum() * float("inf"), optimizer) as scaled:
            scaled.backward()
        assert _amp_state.loss_scalers[0].loss_scale() == 2.0**15
