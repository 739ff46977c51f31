"""O1 casts: list edits, register_*, decorators, disable_casts, BCE and in-place fidelity patches.

Everything runs on the CPU, where O1 means native autocast with bfloat16.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from _amp_testing import fresh_amp_state, quiet  # noqa: F401
from ampshim import cast_decorators, casting
from ampshim.deprecation import DeprecatedFeatureWarning
from ampshim.handle import init
from ampshim.lists import functional_overrides, tensor_overrides, torch_overrides

pytestmark = quiet
LOW = torch.bfloat16
_LIST_MODULES = (functional_overrides, torch_overrides, tensor_overrides)


@pytest.fixture(autouse=True)
def restore_lists():
    """Leave the cast lists and pending registrations as they were."""
    saved = [(lst, list(lst)) for module in _LIST_MODULES for lst in vars(module).values()
             if type(lst) is list]
    yield
    for lst, contents in saved:
        lst[:] = contents
    casting._USER_REGISTRY.clear()


def o1():
    return init(device_type="cpu")


def x(*shape):
    return torch.randn(*shape or (4, 4))


# --- list edits -----------------------------------------------------------------------------

def test_tacotron_softmax_edit_is_honoured_at_init():
    original = F.softmax
    functional_overrides.FP32_FUNCS.remove("softmax")
    functional_overrides.FP16_FUNCS.append("softmax")
    handle = o1()
    assert F.softmax(x(), dim=-1).dtype == LOW
    assert nn.Softmax(dim=-1)(x()).dtype == LOW  # modules call F.softmax
    handle._deactivate()
    assert F.softmax is original
    assert F.softmax(x(), dim=-1).dtype == torch.float32


def test_unchanged_lists_install_no_wrapper_on_ordinary_functions(monkeypatch):
    # Under the native policy (CUDA's default; off CUDA apex's lists are enforced instead:
    # test_apex_lists_on_cpu.py).
    monkeypatch.setenv(casting.CASTS_ENV_VAR, "native")
    originals = {name: getattr(F, name) for name in ("softmax", "linear", "gelu", "layer_norm")}
    originals_torch = {name: getattr(torch, name) for name in ("mm", "exp", "add", "cat")}
    tensor_methods = {name: torch.Tensor.__dict__.get(name) for name in ("__matmul__", "__add__")}
    o1()
    assert {name: getattr(F, name) for name in originals} == originals
    assert {name: getattr(torch, name) for name in originals_torch} == originals_torch
    assert {name: torch.Tensor.__dict__.get(name) for name in tensor_methods} == tensor_methods
    assert torch.mm(x(), x()).dtype == LOW  # native autocast does the casting


def test_edits_after_init_wait_for_the_next_init():
    o1()
    functional_overrides.FP32_FUNCS.remove("softmax")
    functional_overrides.FP16_FUNCS.append("softmax")
    assert F.softmax(x(), dim=-1).dtype == torch.float32
    o1()
    assert F.softmax(x(), dim=-1).dtype == LOW


def test_moving_a_half_function_to_fp32():
    functional_overrides.FP16_FUNCS.remove("linear")
    functional_overrides.FP32_FUNCS.append("linear")
    o1()
    assert F.linear(x(), x()).dtype == torch.float32
    assert nn.Linear(4, 4)(x()).dtype == torch.float32
    assert torch.mm(x(), x()).dtype == LOW  # only the edited function changes


def test_removing_a_name_from_every_list_runs_it_in_the_input_dtype():
    # Native CPU autocast runs mse_loss in float32; taken out of the lists it follows its inputs.
    functional_overrides.FP32_FUNCS.remove("mse_loss")
    o1()
    a, b = x().to(LOW), x().to(LOW)
    assert F.mse_loss(a, b).dtype == LOW
    assert F.mse_loss(x(), x()).dtype == torch.float32


def test_tensor_method_edit():
    tensor_overrides.FP16_FUNCS.append("softmax")
    o1()
    assert x().softmax(-1).dtype == LOW
    assert torch.softmax(x(), -1).dtype == torch.float32  # torch.softmax is not Tensor.softmax


def test_promote_edit_casts_to_the_widest_type():
    tensor_overrides.CASTS.append("where")
    o1()
    cond = torch.ones(4, 4, dtype=torch.bool)
    assert x().to(LOW).where(cond, x()).dtype == torch.float32


def test_wrappers_pass_through_outside_autocast():
    functional_overrides.FP32_FUNCS.remove("softmax")
    functional_overrides.FP16_FUNCS.append("softmax")
    o1()
    with cast_decorators.disable_casts():
        assert F.softmax(x(), dim=-1).dtype == torch.float32
    with torch.autocast("cpu", enabled=False):
        assert F.softmax(x(), dim=-1).dtype == torch.float32


def test_wrapped_functions_keep_gradients():
    functional_overrides.FP32_FUNCS.remove("softmax")
    functional_overrides.FP16_FUNCS.append("softmax")
    o1()
    leaf = x().requires_grad_()
    F.softmax(leaf, dim=-1)[:, 0].float().sum().backward()
    assert leaf.grad is not None and leaf.grad.dtype == torch.float32


# --- register_* -----------------------------------------------------------------------------

class _Ops:
    """A user module with functions to register."""

    @staticmethod
    def dtypes(*tensors):
        return [t.dtype for t in tensors]


def test_register_before_init_is_honoured():
    casting.register_float_function(torch, "sigmoid")
    casting.register_half_function(_Ops, "dtypes")
    o1()
    assert torch.sigmoid(x().to(LOW)).dtype == torch.float32
    assert _Ops.dtypes(x(), x().double()) == [LOW, torch.float64]  # float64 is never cast


def test_register_promote():
    casting.register_promote_function(_Ops, "dtypes")
    o1()
    assert _Ops.dtypes(x().to(LOW), x()) == [torch.float32, torch.float32]
    assert _Ops.dtypes(x().to(LOW), x().to(LOW)) == [LOW, LOW]


def test_register_after_init_is_ignored_until_the_next_init():
    o1()
    casting.register_float_function(torch, "sigmoid")
    assert torch.sigmoid(x().to(LOW)).dtype == LOW
    o1()
    assert torch.sigmoid(x().to(LOW)).dtype == torch.float32


def test_registrations_survive_a_second_init():
    casting.register_float_function(torch, "sigmoid")
    o1()
    o1()
    assert torch.sigmoid(x().to(LOW)).dtype == torch.float32


def test_register_missing_name_raises_apex_error():
    with pytest.raises(ValueError, match=r"^No function named not_there in module <module 'torch'"):
        casting.register_half_function(torch, "not_there")
    assert casting._USER_REGISTRY == []


def test_register_einsum_matching_native_needs_no_wrapper():
    original = torch.einsum
    casting.register_half_function(torch, "einsum")
    o1()
    assert torch.einsum is original  # native autocast already runs einsum in half
    assert torch.einsum("ij,jk->ik", x(), x()).dtype == LOW


# --- decorators -----------------------------------------------------------------------------

def _decorate(decorator, fn):
    with pytest.warns(DeprecatedFeatureWarning):
        return decorator(fn)


def test_half_function_decorated_before_init_casts_only_while_active():
    dtypes = _decorate(cast_decorators.half_function, lambda *tensors: [t.dtype for t in tensors])
    assert dtypes(x()) == [torch.float32]
    handle = o1()
    assert dtypes(x(), x().to(LOW)) == [LOW, LOW]
    with cast_decorators.disable_casts():
        assert dtypes(x()) == [torch.float32]
    handle._deactivate()
    assert dtypes(x()) == [torch.float32]


def test_float_function_on_a_builtin_callable():
    mm = _decorate(cast_decorators.float_function, torch.mm)  # like `nms = amp.float_function(_C.nms)`
    o1()
    assert mm(x().to(LOW), x().to(LOW)).dtype == LOW  # inner ops stay under O1, as in apex
    with cast_decorators.disable_casts():
        assert mm(x().to(LOW), x().to(LOW)).dtype == LOW
    assert mm.__name__ == "mm"


def test_promote_function_decorator_after_init():
    o1()
    add = _decorate(cast_decorators.promote_function, lambda a, b: (a.dtype, b.dtype))
    assert add(x().to(LOW), x()) == (torch.float32, torch.float32)


def test_decorators_on_autograd_function_staticmethods():
    with pytest.warns(DeprecatedFeatureWarning):
        class Scale(torch.autograd.Function):
            @staticmethod
            @cast_decorators.half_function
            def forward(ctx, tensor, factor):
                ctx.save_for_backward(factor)
                return tensor * factor

            @cast_decorators.float_function
            @staticmethod
            def backward(ctx, grad):
                factor, = ctx.saved_tensors
                return grad * factor, None

    o1()
    leaf = x().requires_grad_()
    out = Scale.apply(leaf, torch.full((4, 4), 2.0))
    assert out.dtype == LOW
    out.float().sum().backward()
    assert torch.allclose(leaf.grad, torch.full((4, 4), 2.0))


def test_decorating_a_non_callable_is_a_clear_error():
    with pytest.raises(TypeError, match="expects a function"):
        _decorate(cast_decorators.half_function, 3)


# --- disable_casts --------------------------------------------------------------------------

def test_disable_casts_turns_autocast_off_for_the_block_only():
    handle = o1()
    with cast_decorators.disable_casts():
        assert torch.mm(x(), x()).dtype == torch.float32
        assert not handle.is_active()
    assert torch.mm(x(), x()).dtype == LOW
    assert handle.is_active()


def test_disable_casts_restores_on_exception():
    handle = o1()
    with pytest.raises(KeyError):
        with cast_decorators.disable_casts():
            raise KeyError("boom")
    assert torch.is_autocast_enabled("cpu") and handle.is_active()


def test_disable_casts_without_o1_names_the_fix():
    with pytest.raises(RuntimeError, match=r"opt_level='O1'"):
        with cast_decorators.disable_casts():
            pass


def test_disable_casts_with_a_disabled_handle_is_a_no_op():
    init(enabled=False)
    with cast_decorators.disable_casts():
        assert torch.mm(x(), x()).dtype == torch.float32


# --- binary_cross_entropy -------------------------------------------------------------------

def test_bce_with_float32_inputs_works_under_o1():
    o1()
    logits = x().requires_grad_()
    probs = torch.sigmoid(logits)
    target = torch.rand(4, 4)
    loss = F.binary_cross_entropy(probs, target)
    assert loss.dtype == torch.float32
    assert nn.BCELoss()(probs, target).dtype == torch.float32
    loss.backward()
    assert logits.grad is not None


def test_bce_with_a_half_input_raises_apex_banned_error():
    o1()
    probs = torch.sigmoid(x()).to(LOW)
    with pytest.raises(NotImplementedError, match="BCEWithLogitsLoss"):
        F.binary_cross_entropy(probs, torch.rand(4, 4))
    with pytest.raises(NotImplementedError, match="register_float_function"):
        nn.BCELoss()(probs, torch.rand(4, 4))


def test_bce_allow_banned_casts_to_float32():
    init(device_type="cpu", allow_banned=True)
    probs = torch.sigmoid(x()).to(LOW)
    assert F.binary_cross_entropy(probs, torch.rand(4, 4)).dtype == torch.float32


def test_bce_after_register_float_sigmoid():
    casting.register_float_function(torch, "sigmoid")
    o1()
    hidden = torch.mm(x(), x())  # half under O1
    assert F.binary_cross_entropy(torch.sigmoid(hidden), torch.rand(4, 4)).dtype == torch.float32


# --- in-place float32-list functions --------------------------------------------------------

def test_inplace_fp32_method_on_half_tensor_raises():
    o1()
    with pytest.raises(NotImplementedError, match=r"^Cannot call in-place method exp_ on bf16"):
        x().to(LOW).exp_()
    with pytest.raises(NotImplementedError, match=r"^Cannot call in-place function log_ with bf16"):
        torch.log_(x().abs().to(LOW))
    assert x().exp_().dtype == torch.float32  # float32 tensors are fine
    with cast_decorators.disable_casts():
        assert x().to(LOW).exp_().dtype == LOW


def test_inplace_guard_follows_the_lists_and_is_removed():
    tensor_overrides.FP32_FUNCS.remove("exp")
    handle = o1()
    assert x().to(LOW).exp_().dtype == LOW
    with pytest.raises(NotImplementedError):
        x().to(LOW).log_()
    handle._deactivate()
    assert "log_" not in torch.Tensor.__dict__
    assert x().to(LOW).log_().dtype == LOW


def test_verbose_init_names_each_wrapped_function(capsys):
    functional_overrides.FP32_FUNCS.remove("softmax")
    functional_overrides.FP16_FUNCS.append("softmax")
    init(device_type="cpu", verbose=True)
    out = capsys.readouterr().out
    assert "F.softmax -> half" in out and "F.binary_cross_entropy -> banned" in out
