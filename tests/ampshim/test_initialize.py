import inspect

import pytest
import torch

from _amp_testing import exact_linear, fresh_amp_state, int_batch, mlp, quiet  # noqa: F401
from ampshim import amp
from ampshim.initialize import initialize
from ampshim.opt_levels import Properties
from ampshim.scale_loss import scale_loss
from ampshim.scaler import LossScaler
from ampshim.state import _amp_state

pytestmark = quiet


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def test_signature_is_apexs():
    parameters = inspect.signature(initialize).parameters
    assert [(p.name, p.default) for p in parameters.values()] == [
        ("models", inspect.Parameter.empty), ("optimizers", None), ("enabled", True),
        ("opt_level", "O1"), ("cast_model_type", None), ("patch_torch_functions", None),
        ("keep_batchnorm_fp32", None), ("master_weights", None), ("loss_scale", None),
        ("cast_model_outputs", None), ("num_losses", 1), ("verbosity", 1),
        ("min_loss_scale", None), ("max_loss_scale", 2.**24)]


def test_deprecation_warning_even_when_disabled():
    with pytest.warns(FutureWarning, match="apex.amp.initialize is deprecated: use torch.autocast"):
        initialize(exact_linear(), enabled=False)


def test_disabled_returns_inputs_untouched():
    model = mlp()
    optimizer = sgd(model)
    assert initialize(model, enabled=False) is model
    returned = initialize(model, optimizer, enabled=False, opt_level="O2")
    assert returned[0] is model and returned[1] is optimizer
    assert model[0].weight.dtype == torch.float32
    assert "forward" not in vars(model) and not hasattr(optimizer, "_amp_stash")
    assert not hasattr(_amp_state, "loss_scalers")
    assert _amp_state.opt_properties.enabled is False


@pytest.mark.parametrize("level", [None, "01", "O4", "o2"])
def test_unknown_opt_level(level):
    with pytest.raises(RuntimeError) as info:
        initialize(exact_linear(), opt_level=level)
    assert str(info.value) == (
        f"Unexpected optimization level {level}. Options are 'O0', 'O1', 'O2', 'O3'. Note that "
        "in `O0`, `O1`, etc., the prefix O is the letter O, not the number zero.")


def test_printing(capsys):
    initialize(mlp(), opt_level="O2", loss_scale="128.0")
    assert capsys.readouterr().out.splitlines() == [
        "Selected optimization level O2:  FP16 training with FP32 batchnorm and FP32 master "
        "weights.",
        "",
        "Defaults for this optimization level are:",
        "enabled                : True",
        "opt_level              : O2",
        "cast_model_type        : torch.float16",
        "patch_torch_functions  : False",
        "keep_batchnorm_fp32    : True",
        "master_weights         : True",
        "loss_scale             : dynamic",
        "Processing user overrides (additional kwargs that are not None)...",
        "After processing overrides, optimization options are:",
        "enabled                : True",
        "opt_level              : O2",
        "cast_model_type        : torch.float16",
        "patch_torch_functions  : False",
        "keep_batchnorm_fp32    : True",
        "master_weights         : True",
        "loss_scale             : 128.0",
    ]


def test_verbosity_zero_is_silent(capsys):
    initialize(mlp(), opt_level="O2", verbosity=0)
    assert capsys.readouterr().out == ""
    assert _amp_state.verbosity == 0


def test_overrides_are_validated():
    with pytest.raises(RuntimeError, match="keep_batchnorm_fp32 should be None"):
        initialize(mlp(), opt_level="O1", keep_batchnorm_fp32=True, verbosity=0)
    with pytest.raises(RuntimeError, match="should only be set by selecting opt_level='O1'"):
        initialize(mlp(), opt_level="O2", patch_torch_functions=True, verbosity=0)


@pytest.mark.parametrize("option, value, error, message", [
    ("loss_scale", "big", ValueError, "loss_scale must be a positive number .*got 'big'"),
    ("loss_scale", [2.0], TypeError, r"loss_scale must be a positive number .*got \[2.0\]"),
    ("loss_scale", 0, ValueError, "loss_scale must be a positive, finite number, got 0"),
    ("loss_scale", -8.0, ValueError, "loss_scale must be a positive, finite number, got -8.0"),
    ("loss_scale", "nan", ValueError, "loss_scale must be a positive, finite number, got 'nan'"),
    ("keep_batchnorm_fp32", "yes", ValueError, "got keep_batchnorm_fp32='yes'"),
    ("num_losses", 0, ValueError, "num_losses must be at least 1, got 0"),
    ("num_losses", 2.5, TypeError, "num_losses must be an integer, got 2.5"),
])
def test_bad_arguments_are_named_before_anything_changes(option, value, error, message):
    model = mlp()
    optimizer = sgd(model)
    with pytest.raises(error, match=message):
        initialize(model, optimizer, opt_level="O2", verbosity=0, **{option: value})
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not hasattr(optimizer, "_amp_stash")


def test_overrides_reach_the_properties():
    initialize(mlp(), opt_level="O2", master_weights=False, keep_batchnorm_fp32="False",
               loss_scale=64, verbosity=0)
    props = _amp_state.opt_properties
    assert isinstance(props, Properties)
    assert (props.master_weights, props.keep_batchnorm_fp32, props.loss_scale) == (
        False, False, 64.0)
    assert _amp_state.loss_scalers[0].dynamic is False


def test_return_shapes():
    def fresh():
        model = exact_linear()
        return model, sgd(model)

    m, o = fresh()
    assert initialize(m, opt_level="O0", verbosity=0) is m
    m, o = fresh()
    assert initialize(m, o, opt_level="O0", verbosity=0) == (m, o)
    m, o = fresh()
    assert initialize(m, [o], opt_level="O0", verbosity=0) == (m, [o])
    m, o = fresh()
    assert initialize(m, [], opt_level="O0", verbosity=0) == (m, [])
    m, o = fresh()
    assert initialize([m], opt_level="O0", verbosity=0) == [m]
    m, o = fresh()
    assert initialize([m], o, opt_level="O0", verbosity=0) == ([m], o)
    m, o = fresh()
    returned = initialize([m], [o], opt_level="O0", verbosity=0)
    assert returned == ([m], [o]) and returned[0][0] is m and returned[1][0] is o
    m, o = fresh()
    assert initialize(models=m, optimizers=o, opt_level="O0", verbosity=0)[1] is o


def test_bad_container_types():
    model = exact_linear()
    with pytest.raises(TypeError, match="optimizers must be either a single optimizer or a list"):
        initialize(model, (sgd(model),), opt_level="O0", verbosity=0)
    with pytest.raises(TypeError, match="models must be either a single model or a list"):
        initialize((model,), opt_level="O0", verbosity=0)


def test_fp16_optimizer_is_rejected():
    class FP16_Optimizer:  # noqa: N801 - apex's class name, as the check sees it
        param_groups = []

        def step(self):
            pass

    FP16_Optimizer.__module__ = "apex.fp16_utils.fp16_optimizer"
    with pytest.raises(RuntimeError, match="An incoming optimizer is an instance of "
                                           "FP16_Optimizer"):
        initialize(exact_linear(), [FP16_Optimizer()], opt_level="O0", verbosity=0)
    with pytest.raises(RuntimeError, match="must be bare"):
        initialize(exact_linear(), FP16_Optimizer(), opt_level="O0", verbosity=0)


def test_parallel_wrappers_are_rejected():
    with pytest.raises(RuntimeError) as info:
        initialize(torch.nn.DataParallel(exact_linear()), opt_level="O0", verbosity=0)
    assert "Incoming model is an instance of DataParallel. Parallel wrappers should only be " \
           "applied to the model(s) AFTER the model(s) have been returned from " \
           "amp.initialize." in str(info.value)


def test_half_model_is_rejected_unless_allowed():
    model = exact_linear().to(torch.bfloat16)
    with pytest.raises(RuntimeError) as info:
        initialize(model, opt_level="O2", verbosity=0)
    assert str(info.value).startswith(
        "Found param weight with type torch.BFloat16Tensor, expected torch.FloatTensor.\n"
        "When using amp.initialize, you do not need to call .half() on your model")
    _amp_state.allow_incoming_model_not_fp32 = True
    assert initialize(model, opt_level="O2", verbosity=0) is model


def test_half_buffer_is_rejected():
    model = mlp()
    model[1].running_mean = model[1].running_mean.half()
    with pytest.raises(RuntimeError, match="Found buffer 1.running_mean with type "
                                           "torch.HalfTensor"):
        initialize(model, opt_level="O0", verbosity=0)


def test_cudnn_must_be_enabled_on_cuda(monkeypatch):
    monkeypatch.setattr("ampshim.initialize.device_type_of", lambda models: "cuda")
    monkeypatch.setattr(torch.backends.cudnn, "enabled", False)
    with pytest.raises(RuntimeError, match=r"Amp requires torch.backends.cudnn.enabled = True"):
        initialize(exact_linear(), opt_level="O0", verbosity=0)


def test_same_optimizer_twice_is_rejected():
    model = exact_linear()
    optimizer = sgd(model)
    initialize(model, optimizer, opt_level="O0", verbosity=0)
    with pytest.raises(RuntimeError, match="should only be passed through amp.initialize once"):
        initialize(exact_linear(), optimizer, opt_level="O0", verbosity=0)


def test_optimizer_with_amp_methods_is_rejected():
    model = exact_linear()
    optimizer = sgd(model)
    optimizer._amp_lazy_init = lambda: None
    with pytest.raises(RuntimeError, match="Incoming optimizer already has _amp_lazy_init "
                                           "defined."):
        initialize(model, optimizer, opt_level="O0", verbosity=0)


def test_repeated_calls_with_fresh_models():
    first = exact_linear()
    first_optimizer = sgd(first)
    initialize(first, first_optimizer, opt_level="O0", loss_scale="dynamic", verbosity=0)
    first_scalers = _amp_state.loss_scalers
    second = exact_linear()
    initialize(second, sgd(second), opt_level="O2", num_losses=2, verbosity=0)
    assert _amp_state.loss_scalers is not first_scalers and len(_amp_state.loss_scalers) == 2
    assert _amp_state.opt_properties.opt_level == "O2"
    # the first optimizer keeps working, against the new global scalers
    with scale_loss(first(int_batch(1)).sum(), first_optimizer) as scaled:
        scaled.backward()
    first_optimizer.step()
    assert _amp_state.loss_scalers[0]._unskipped == 1


def test_num_losses_and_min_max():
    initialize(exact_linear(), opt_level="O2", num_losses=3, min_loss_scale=4.,
               max_loss_scale=2.**10, verbosity=0)
    scalers = _amp_state.loss_scalers
    assert len(scalers) == 3 and all(isinstance(s, LossScaler) for s in scalers)
    assert [s.loss_scale() for s in scalers] == [2.**10] * 3
    assert scalers[0]._min_loss_scale == 4. and _amp_state.min_loss_scale == 4.
    assert _amp_state.max_loss_scale == 2.**10


def test_o1_turns_on_casts_and_steps_without_them(capsys):
    pytest.importorskip("ampshim.handle")
    seen = []

    class Recording(torch.optim.SGD):
        def step(self, closure=None):
            seen.append(torch.is_autocast_enabled("cpu"))
            return super().step(closure)

    model = mlp()
    optimizer = Recording(model.parameters(), lr=0.1)
    model, optimizer = initialize(model, optimizer, opt_level="O1", verbosity=0)
    handle = _amp_state.handle
    assert handle.is_active() and torch.is_autocast_enabled("cpu")
    assert model[0].weight.dtype == torch.float32 and "forward" not in vars(model)
    cleared = []
    original_clear = handle._clear_cache
    handle._clear_cache = lambda: (cleared.append(True), original_clear())
    out = model(torch.randn(3, 4))
    assert out.dtype == torch.bfloat16  # O1: the final Linear runs in half precision
    with scale_loss(out.float().sum(), optimizer) as scaled:
        seen.append(torch.is_autocast_enabled("cpu"))
        scaled.backward()
    assert cleared == [True] and torch.is_autocast_enabled("cpu")
    optimizer.step()
    assert seen == [False, False] and torch.is_autocast_enabled("cpu")


def test_o1_cast_model_outputs_patches_outputs_only():
    pytest.importorskip("ampshim.handle")
    model = mlp()
    model = initialize(model, opt_level="O1", cast_model_outputs=torch.float32, verbosity=0)
    assert model(torch.randn(3, 4)).dtype == torch.float32
    assert model[0].weight.dtype == torch.float32


def test_amp_face_module():
    assert "state_dict" in amp.__dict__ and "initialize" in amp.__dict__
    assert set(amp.__all__) >= {
        "init", "half_function", "float_function", "promote_function", "register_half_function",
        "register_float_function", "register_promote_function", "scale_loss", "disable_casts",
        "initialize", "state_dict", "load_state_dict", "master_params", "_amp_state"}
    assert amp._amp_state is _amp_state and amp.initialize is initialize
    assert amp.__version__ == "0.1.0"
    assert amp.frontend.Properties is Properties and amp.scaler.LossScaler is LossScaler
    assert "softmax" in amp.lists.functional_overrides.FP32_FUNCS
    assert callable(amp._process_optimizer._process_optimizer)
    with pytest.raises(AttributeError):
        amp.no_such_name
