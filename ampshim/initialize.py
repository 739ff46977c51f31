"""``amp.initialize``: apply an optimization level to models and optimizers (apex's frontend).

The order of events is apex's: deprecation warning, state reset, ``enabled=False`` short cut,
opt_level defaults (printed), user overrides (validated, printed), then models are validated and
cast, forward patched, optimizers equipped, loss scalers created and, for O1, process-wide casts
turned on. Differences from apex: parameters may live on any device (they must be fp32, not
CUDA); "half" means bfloat16 off CUDA (see ``ampshim.device``).
"""
from __future__ import annotations

import sys
import types

import torch

from ampshim import handle
from ampshim.deprecation import warn_deprecated
from ampshim.device import device_type_of, resolve_dtype
from ampshim.model import cast_models, patch_forward_outputs
from ampshim.opt_levels import Properties, opt_levels
from ampshim.optimizer import _process_optimizer
from ampshim.scaler import LossScaler, checked_count
from ampshim.state import _amp_state, maybe_print

__all__ = ["initialize"]


# Overridable options, in the order apex applies (and prints) them.
_OVERRIDES = ("enabled", "opt_level", "cast_model_type", "patch_torch_functions",
              "keep_batchnorm_fp32", "master_weights", "loss_scale")

_HALF_DTYPES = (torch.float16, torch.bfloat16)


def initialize(models, optimizers=None, enabled=True, opt_level="O1", cast_model_type=None,
               patch_torch_functions=None, keep_batchnorm_fp32=None, master_weights=None,
               loss_scale=None, cast_model_outputs=None, num_losses=1, verbosity=1,
               min_loss_scale=None, max_loss_scale=2.**24):
    """Prepare models and optimizers for mixed-precision training at ``opt_level``.

    * ``O0``: fp32 training; ``O1``: autocast around torch functions (weights stay fp32);
      ``O2``: half-precision model except affine batch norm, fp32 master weights in the
      optimizer; ``O3``: pure half precision. Half is float16 on CUDA and bfloat16 elsewhere.
    * Models and optimizers are changed in place and returned in the shape they came in.
    * Call it once per model/optimizer, before wrapping the model in DistributedDataParallel.

    Example::

        model = Net().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        loss = criterion(model(inputs), targets)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()

    Args:
        models (nn.Module or list of nn.Module): models with fp32 parameters.
        optimizers (Optimizer or list of Optimizer, optional, default=None): their optimizers.
        enabled (bool, optional, default=True): False returns the inputs untouched and makes
            ``scale_loss`` yield the raw loss.
        opt_level (str, optional, default="O1"): ``"O0"``, ``"O1"``, ``"O2"`` or ``"O3"``
            (the letter O).
        cast_model_type (torch.dtype, optional, default=None): override the weights' dtype.
        patch_torch_functions (bool, optional, default=None): override O1's autocast.
        keep_batchnorm_fp32 (bool or str, optional, default=None): override; "True"/"False" ok.
        master_weights (bool, optional, default=None): override fp32 master weights.
        loss_scale (float, str or "dynamic", optional, default=None): override the loss scale.
        cast_model_outputs (torch.dtype, optional, default=None): dtype of the models' floating
            outputs (float32 when the model is cast).
        num_losses (int, optional, default=1): number of loss scalers (``loss_id`` picks one).
        verbosity (int, optional, default=1): 0 silences amp's messages.
        min_loss_scale (float, optional, default=None): floor of the dynamic loss scale.
        max_loss_scale (float, optional, default=2.**24): ceiling of the dynamic loss scale.
    """
    warn_deprecated("apex.amp.initialize", "torch.autocast and torch.amp.GradScaler")
    _amp_state.opt_properties = Properties()
    _amp_state.verbosity = verbosity
    if not enabled:
        return models if optimizers is None else (models, optimizers)

    num_losses = checked_count(num_losses, "num_losses", minimum=1)
    device_type = device_type_of(_modules_in(models))
    if device_type == "cuda" and not torch.backends.cudnn.enabled:
        raise RuntimeError("Amp requires torch.backends.cudnn.enabled = True")
    if not isinstance(opt_level, str) or opt_level not in opt_levels:
        raise RuntimeError(
            "Unexpected optimization level {}. Options are 'O0', 'O1', 'O2', 'O3'. Note that "
            "in `O0`, `O1`, etc., the prefix O is the letter O, not the number zero."
            .format(opt_level))
    properties = opt_levels[opt_level](_amp_state.opt_properties)
    _amp_state.opt_properties = properties
    maybe_print("Selected optimization level {}".format(opt_levels[opt_level].brief), True)
    maybe_print("Defaults for this optimization level are:", True)
    _print_options(properties)
    _amp_state.min_loss_scale = min_loss_scale
    _amp_state.max_loss_scale = max_loss_scale

    maybe_print("Processing user overrides (additional kwargs that are not None)...", True)
    overrides = dict(enabled=enabled, opt_level=opt_level, cast_model_type=cast_model_type,
                     patch_torch_functions=patch_torch_functions,
                     keep_batchnorm_fp32=keep_batchnorm_fp32, master_weights=master_weights,
                     loss_scale=loss_scale)
    for name in _OVERRIDES:
        if overrides[name] is not None:
            setattr(properties, name, overrides[name])
    maybe_print("After processing overrides, optimization options are:", True)
    _print_options(properties)

    return _initialize(models, optimizers, properties, num_losses, cast_model_outputs,
                       device_type)


def _print_options(properties):
    for name, value in properties.options.items():
        maybe_print("{:22} : {}".format(name, value), True)


def _modules_in(models):
    if isinstance(models, torch.nn.Module):
        return [models]
    if isinstance(models, list):
        return [model for model in models if isinstance(model, torch.nn.Module)]
    return []


def _initialize(models, optimizers, properties, num_losses, cast_model_outputs, device_type):
    optimizers, optimizers_was_list = _check_optimizers(optimizers)
    models_was_list = isinstance(models, list)
    if isinstance(models, torch.nn.Module):
        models = [models]
    elif not models_was_list:
        raise TypeError("models must be either a single model or a list of models.")
    _check_models(models)
    if not _amp_state.allow_incoming_model_not_fp32:
        _check_params_fp32(models, device_type)
    for optimizer in optimizers:
        _check_not_processed(optimizer)

    if properties.cast_model_type:
        output_dtype = resolve_dtype(cast_model_outputs, device_type) or torch.float32
        cast_models(models, resolve_dtype(properties.cast_model_type, device_type),
                    properties.keep_batchnorm_fp32, output_dtype, device_type)
        for optimizer in optimizers:
            # Recast per-parameter state to the new dtypes. With master weights the state is
            # recast when the fp32 masters are created instead: a detour through half precision
            # (as in apex) would lose precision, or underflow Adam's second moments in float16.
            if not properties.master_weights:
                optimizer.load_state_dict(optimizer.state_dict())
    elif cast_model_outputs is not None:
        patch_forward_outputs(models, resolve_dtype(cast_model_outputs, device_type),
                              device_type)

    for optimizer in optimizers:
        _process_optimizer(optimizer, properties)

    _amp_state.loss_scalers = [
        LossScaler(properties.loss_scale, min_loss_scale=_amp_state.min_loss_scale,
                   max_loss_scale=_amp_state.max_loss_scale)
        for _ in range(num_losses)]

    if properties.patch_torch_functions:
        handle.init(loss_scale=properties.loss_scale, verbose=(_amp_state.verbosity == 2),
                    device_type=device_type)
        for optimizer in optimizers:
            optimizer.step = types.MethodType(_step_without_casts(optimizer.step), optimizer)

    return _result(models, models_was_list, optimizers, optimizers_was_list)


def _step_without_casts(original_step):
    # The update must not run under autocast (it would cast fp32 weights and optimizer state).
    def step(self, *args, **kwargs):
        with _amp_state.handle._disable_casts():
            return original_step(*args, **kwargs)

    return step


def _result(models, models_was_list, optimizers, optimizers_was_list):
    returned_models = models if models_was_list else models[0]
    if optimizers_was_list:
        return returned_models, optimizers
    if not optimizers:
        return returned_models
    return returned_models, optimizers[0]


def _check_optimizers(optimizers):
    """Return ``(list of optimizers, whether a list was given)`` or raise apex's errors."""
    candidates = optimizers if isinstance(optimizers, list) else [optimizers]
    for optimizer in candidates:
        if _is_fp16_optimizer(optimizer):
            raise RuntimeError(
                "An incoming optimizer is an instance of {}. The optimizer(s) passed to "
                "amp.initialize() must be bare instances of either ordinary Pytorch optimizers, "
                "or Apex fused optimizers. FP16_Optimizer does its own loss scaling and master "
                "weights: pass the optimizer it wraps instead.".format(type(optimizer).__name__))
    if optimizers is None:
        return [], False
    if isinstance(optimizers, list):
        return optimizers, True
    if _is_optimizer(optimizers):
        return [optimizers], False
    raise TypeError("optimizers must be either a single optimizer or a list of optimizers.")


def _is_optimizer(candidate):
    # torch optimizers, and wrappers such as apex.parallel.LARC that proxy param_groups/step
    return isinstance(candidate, torch.optim.Optimizer) or (
        hasattr(candidate, "param_groups") and hasattr(candidate, "step")
        and not isinstance(candidate, (tuple, list, dict)))


def _is_fp16_optimizer(candidate):
    return any(cls.__name__ == "FP16_Optimizer" and cls.__module__.startswith(("ampshim", "apex"))
               for cls in type(candidate).__mro__)


def _check_not_processed(optimizer):
    if hasattr(optimizer, "_amp_stash"):
        raise RuntimeError("A given optimizer should only be passed through amp.initialize once.")


def _parallel_wrapper_types():
    wrappers = [torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel]
    for module_name in ("ampshim.parallel", "apex.parallel"):
        module = sys.modules.get(module_name)
        wrapper = getattr(module, "DistributedDataParallel", None)
        if isinstance(wrapper, type):
            wrappers.append(wrapper)
    return tuple(wrappers)


def _check_models(models):
    wrappers = _parallel_wrapper_types()
    for model in models:
        if not isinstance(model, torch.nn.Module):
            raise TypeError("models must be either a single model or a list of models.")
        if isinstance(model, wrappers):
            raise RuntimeError(
                "Incoming model is an instance of {}. Parallel wrappers should only be applied "
                "to the model(s) AFTER the model(s) have been returned from amp.initialize."
                .format(type(model).__name__))


def _check_params_fp32(models, device_type):
    expected = "torch.cuda.FloatTensor" if device_type == "cuda" else "torch.FloatTensor"
    for model in models:
        for kind, named in (("param", model.named_parameters()), ("buffer", model.named_buffers())):
            for name, tensor in named:
                if tensor.dtype in _HALF_DTYPES:
                    raise RuntimeError(
                        "Found {} {} with type {}, expected {}.\n"
                        "When using amp.initialize, you do not need to call .half() on your "
                        "model\nbefore passing it, no matter what optimization level you choose."
                        .format(kind, name, tensor.type(), expected))
