"""What ``amp.initialize`` does to models for O0/O2/O3 (and O1 with ``cast_model_outputs``).

* the weights are cast (``keep_batchnorm_fp32`` keeps affine batch norm in fp32), preserving the
  ``Parameter`` objects so optimizer references stay valid;
* ``model.forward`` becomes an instance attribute that casts floating inputs to the model's dtype
  and floating outputs to float32 (or ``cast_model_outputs``), recursively through containers;
* ``model.state_dict()`` returns fp32 tensors, so checkpoints look like fp32 training's.

As in apex, the replaced ``forward`` is a closure: such a model cannot be pickled whole (save its
``state_dict()`` instead) and should be wrapped in DistributedDataParallel only after
``amp.initialize``.
"""
from __future__ import annotations

import functools
import itertools
import warnings
from collections.abc import Iterable, Mapping

import torch

__all__ = ["cast_models", "patch_forward_outputs"]


def cast_models(models, dtype, keep_batchnorm_fp32, output_dtype, device_type):
    """Cast ``models`` to ``dtype``, patch their forward and make their state dicts fp32.

    Args:
        models (list of nn.Module): changed in place.
        dtype (torch.dtype): the weight and input dtype (already resolved for the device).
        keep_batchnorm_fp32 (bool): leave affine ``_BatchNorm`` modules in fp32.
        output_dtype (torch.dtype): floating outputs are cast to it (float32 unless
            ``cast_model_outputs`` was given).
        device_type (str): the models' device type; inputs elsewhere trigger a warning.
    """
    for model in models:
        if keep_batchnorm_fp32:
            _convert_network(model, dtype)
        else:
            model.to(dtype)
        input_caster = functools.partial(_to_type, dtype, device_type)
        output_caster = functools.partial(_to_type, output_dtype, device_type)
        model.forward = _casting_forward(model.forward, input_caster, output_caster)
        for module in model.modules():
            _register_state_dict_hook(module, functools.partial(_fp32_state_dict_hook, dtype))


def patch_forward_outputs(models, output_dtype, device_type):
    """Cast only the outputs of ``models`` (O1 with ``cast_model_outputs``)."""
    output_caster = functools.partial(_to_type, output_dtype, device_type)
    for model in models:
        model.forward = _casting_forward(model.forward, None, output_caster)


def _casting_forward(forward, input_caster, output_caster):
    @functools.wraps(forward)
    def cast_forward(*args, **kwargs):
        if input_caster is not None:
            args = _apply(args, input_caster)
            kwargs = _apply(kwargs, input_caster)
        return _apply(forward(*args, **kwargs), output_caster)

    return cast_forward


def _convert_network(model, dtype):
    """Cast every module except affine batch norm (non-affine batch norm IS cast, as in apex)."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.affine:
            continue
        for param in module.parameters(recurse=False):
            if param.is_floating_point():
                param.data = param.data.to(dtype)
            if param.grad is not None and param.grad.is_floating_point():
                param.grad.data = param.grad.data.to(dtype)
        for buffer in module.buffers(recurse=False):
            if buffer.is_floating_point():
                buffer.data = buffer.data.to(dtype)
        if isinstance(module, torch.nn.RNNBase):
            module.flatten_parameters()


def _to_type(dtype, device_type, value):
    if isinstance(value, torch.Tensor):
        if value.device.type != device_type:
            warnings.warn("An input tensor was not cuda." if device_type == "cuda" else
                          f"An input tensor was not on the model's device ({device_type}).")
        return value.to(dtype) if value.is_floating_point() else value
    return value.to(dtype)  # a custom batch type with its own .to(): trust it, as apex did


def _apply(value, caster):
    """Cast tensors (and objects with ``.to``) inside nested containers, apex's rules."""
    if isinstance(value, torch.Tensor):
        return caster(value)
    if isinstance(value, (str, bytes)) or _is_numpy_array(value):
        return value
    if hasattr(value, "to"):
        return caster(value)
    if isinstance(value, Mapping):
        return {_apply(key, caster): _apply(item, caster) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple (apex broke here)
        return type(value)(*(_apply(item, caster) for item in value))
    if isinstance(value, Iterable):
        return type(value)(_apply(item, caster) for item in value)
    return value


def _is_numpy_array(value):
    return type(value).__module__ == "numpy" and type(value).__name__ == "ndarray"


def _fp32_state_dict_hook(cast_dtype, module, state_dict, prefix, local_metadata):
    """Report this module's parameters and buffers of the cast dtype as float32."""
    for name in itertools.chain(module._parameters, module._buffers):
        key = prefix + name
        value = state_dict.get(key)
        if isinstance(value, torch.Tensor) and value.dtype == cast_dtype:
            state_dict[key] = value.float()


def _register_state_dict_hook(module, hook):
    register = getattr(module, "register_state_dict_post_hook", None)
    if register is None:  # torch < 2.5
        register = module._register_state_dict_hook
    register(hook)
