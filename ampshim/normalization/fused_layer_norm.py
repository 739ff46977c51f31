"""apex's fused LayerNorm and RMSNorm, on PyTorch's own kernels, for any device.

Statistics are always accumulated in float32 (float64 inputs stay float64), as apex's CUDA kernels do,
and the output dtype follows apex:

* ``FusedLayerNorm`` / ``FusedRMSNorm`` and their functions: the input's dtype;
* ``MixedFused*`` and the ``mixed_dtype_*`` functions: the weight's dtype (an fp16 input with fp32
  parameters gives an fp32 output);
* under autocast, input and parameters are first cast to the autocast dtype, so the output is in
  the autocast dtype (native ``torch.nn.LayerNorm`` would give float32 there).

Parameters are named and shaped as in ``torch.nn.LayerNorm`` / ``torch.nn.RMSNorm`` (the modules
subclass them), so checkpoints interchange.
"""
import numbers
import warnings

import torch

__all__ = [
    "FusedLayerNorm", "MixedFusedLayerNorm", "FusedRMSNorm", "MixedFusedRMSNorm",
    "FusedLayerNormAffineFunction", "FusedLayerNormAffineMixedDtypesFunction", "FusedLayerNormFunction",
    "FusedRMSNormAffineFunction", "FusedRMSNormAffineMixedDtypesFunction", "FusedRMSNormFunction",
    "fused_layer_norm_affine", "fused_layer_norm", "mixed_dtype_fused_layer_norm_affine",
    "fused_rms_norm_affine", "fused_rms_norm", "mixed_dtype_fused_rms_norm_affine", "manual_rms_norm",
]


def _shape(normalized_shape):
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(normalized_shape)


def _accumulate_dtype(*tensors):
    dtype = torch.float32
    for t in tensors:
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _to(t, dtype):
    return None if t is None else t.to(dtype)


# --- the math, shared by every autograd Function below ---------------------------------------


def _layer_norm_forward(ctx, x, weight, bias, normalized_shape, eps, out_dtype):
    shape = _shape(normalized_shape)
    acc = _accumulate_dtype(x, weight, bias)
    y, mean, rstd = torch.native_layer_norm(
        x.to(acc).contiguous(), shape, _to(weight, acc), _to(bias, acc), eps)
    ctx.save_for_backward(x, weight, bias, mean, rstd)
    ctx.shape = shape
    return y.to(out_dtype)


def _layer_norm_backward(ctx, grad):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    acc = _accumulate_dtype(x, weight, bias)
    mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1],
            bias is not None and ctx.needs_input_grad[2]]
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(
        grad.to(acc).contiguous(), x.to(acc).contiguous(), ctx.shape, mean, rstd,
        _to(weight, acc), _to(bias, acc), mask)
    return (_to(dx, x.dtype), _to(dw, None if weight is None else weight.dtype),
            _to(db, None if bias is None else bias.dtype))


def _rms_norm_forward(ctx, x, weight, normalized_shape, eps, out_dtype):
    shape = _shape(normalized_shape)
    acc = _accumulate_dtype(x, weight)
    dims = tuple(range(-len(shape), 0))
    x_acc = x.to(acc)
    rstd = torch.rsqrt(x_acc.pow(2).mean(dims, keepdim=True) + eps)
    y = x_acc * rstd
    if weight is not None:
        y = y * weight.to(acc)
    ctx.save_for_backward(x, weight, rstd)
    ctx.dims = dims
    return y.to(out_dtype)


def _rms_norm_backward(ctx, grad):
    x, weight, rstd = ctx.saved_tensors
    acc = _accumulate_dtype(x, weight)
    x_hat = x.to(acc) * rstd
    grad = grad.to(acc)
    dw = None
    if weight is not None and ctx.needs_input_grad[1]:
        batch_dims = tuple(range(x.dim() - len(ctx.dims)))
        dw = (grad * x_hat).sum(batch_dims).to(weight.dtype)
    grad_x_hat = grad if weight is None else grad * weight.to(acc)
    dx = rstd * (grad_x_hat - x_hat * (grad_x_hat * x_hat).mean(ctx.dims, keepdim=True))
    return dx.to(x.dtype), dw


# --- apex's autograd Functions (same names and argument orders) ------------------------------


class FusedLayerNormAffineFunction(torch.autograd.Function):
    """LayerNorm with weight and bias; output in the input's dtype."""

    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps, memory_efficient=False):
        return _layer_norm_forward(ctx, input, weight, bias, normalized_shape, eps, input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        return *_layer_norm_backward(ctx, grad_output), None, None, None


class FusedLayerNormAffineMixedDtypesFunction(torch.autograd.Function):
    """LayerNorm with weight and bias; output in the weight's dtype."""

    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps, memory_efficient=False):
        return _layer_norm_forward(ctx, input, weight, bias, normalized_shape, eps, weight.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        return *_layer_norm_backward(ctx, grad_output), None, None, None


class FusedLayerNormFunction(torch.autograd.Function):
    """LayerNorm without affine parameters; output in the input's dtype."""

    @staticmethod
    def forward(ctx, input, normalized_shape, eps, memory_efficient=False):
        return _layer_norm_forward(ctx, input, None, None, normalized_shape, eps, input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        return _layer_norm_backward(ctx, grad_output)[0], None, None, None


class FusedRMSNormAffineFunction(torch.autograd.Function):
    """RMSNorm with weight; output in the input's dtype."""

    @staticmethod
    def forward(ctx, input, weight, normalized_shape, eps, memory_efficient=False):
        return _rms_norm_forward(ctx, input, weight, normalized_shape, eps, input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        return *_rms_norm_backward(ctx, grad_output), None, None, None


class FusedRMSNormAffineMixedDtypesFunction(torch.autograd.Function):
    """RMSNorm with weight; output in the weight's dtype."""

    @staticmethod
    def forward(ctx, input, weight, normalized_shape, eps, memory_efficient=False):
        return _rms_norm_forward(ctx, input, weight, normalized_shape, eps, weight.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        return *_rms_norm_backward(ctx, grad_output), None, None, None


class FusedRMSNormFunction(torch.autograd.Function):
    """RMSNorm without weight; output in the input's dtype."""

    @staticmethod
    def forward(ctx, input, normalized_shape, eps, memory_efficient=False):
        return _rms_norm_forward(ctx, input, None, normalized_shape, eps, input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        return _rms_norm_backward(ctx, grad_output)[0], None, None, None


# --- functional forms: apex casts every tensor argument to the autocast dtype, then runs with
# autocast off -----------------------------------------------------------------------------------


def _apply_under_autocast(function, input, *args):
    device_type = input.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        args = tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                     for a in args)
        input = input.to(dtype)
    with torch.autocast(device_type, enabled=False):
        return function.apply(input, *args)


def fused_layer_norm_affine(input, weight, bias, normalized_shape, eps=1e-6, memory_efficient=False):
    """Layer normalization with ``weight`` and ``bias``; output in the input's (or autocast) dtype.

    Example::

        >>> y = fused_layer_norm_affine(x, ln.weight, ln.bias, ln.normalized_shape)

    Args:
        input (Tensor): the tensor to normalize over its last ``len(normalized_shape)`` dims.
        weight (Tensor), bias (Tensor): affine parameters of shape ``normalized_shape``.
        normalized_shape (int or tuple): the trailing shape to normalize over.
        eps (float, optional, default=1e-6): added to the variance.
        memory_efficient (bool, optional, default=False): accepted for apex compatibility.
    """
    return _apply_under_autocast(FusedLayerNormAffineFunction, input, weight, bias,
                                 normalized_shape, eps, memory_efficient)


def fused_layer_norm(input, normalized_shape, eps=1e-6, memory_efficient=False):
    """Layer normalization without affine parameters; output in the input's (or autocast) dtype.

    Example::

        >>> y = fused_layer_norm(x, x.shape[-1:])

    Args:
        input (Tensor): the tensor to normalize over its last ``len(normalized_shape)`` dims.
        normalized_shape (int or tuple): the trailing shape to normalize over.
        eps (float, optional, default=1e-6): added to the variance.
        memory_efficient (bool, optional, default=False): accepted for apex compatibility.
    """
    return _apply_under_autocast(FusedLayerNormFunction, input, normalized_shape, eps, memory_efficient)


def mixed_dtype_fused_layer_norm_affine(input, weight, bias, normalized_shape, eps=1e-6,
                                        memory_efficient=False):
    """Layer normalization with ``weight`` and ``bias``; output in the weight's dtype.

    Example::

        >>> y = mixed_dtype_fused_layer_norm_affine(x.half(), ln.weight, ln.bias, 8)  # float32

    Args:
        input (Tensor): the tensor to normalize over its last ``len(normalized_shape)`` dims.
        weight (Tensor), bias (Tensor): affine parameters; their dtype is the output's.
        normalized_shape (int or tuple): the trailing shape to normalize over.
        eps (float, optional, default=1e-6): added to the variance.
        memory_efficient (bool, optional, default=False): accepted for apex compatibility.
    """
    return _apply_under_autocast(FusedLayerNormAffineMixedDtypesFunction, input, weight, bias,
                                 normalized_shape, eps, memory_efficient)


def fused_rms_norm_affine(input, weight, normalized_shape, eps=1e-6, memory_efficient=False):
    """RMS normalization ``x * rsqrt(mean(x**2) + eps) * weight``; output in the input's dtype.

    Example::

        >>> y = fused_rms_norm_affine(x, norm.weight, norm.normalized_shape)

    Args:
        input (Tensor): the tensor to normalize over its last ``len(normalized_shape)`` dims.
        weight (Tensor): scale of shape ``normalized_shape``.
        normalized_shape (int or tuple): the trailing shape to normalize over.
        eps (float, optional, default=1e-6): added to the mean square.
        memory_efficient (bool, optional, default=False): accepted for apex compatibility.
    """
    return _apply_under_autocast(FusedRMSNormAffineFunction, input, weight, normalized_shape, eps,
                                 memory_efficient)


def fused_rms_norm(input, normalized_shape, eps=1e-6, memory_efficient=False):
    """RMS normalization without weight; output in the input's (or autocast) dtype.

    Example::

        >>> y = fused_rms_norm(x, x.shape[-1:])

    Args:
        input (Tensor): the tensor to normalize over its last ``len(normalized_shape)`` dims.
        normalized_shape (int or tuple): the trailing shape to normalize over.
        eps (float, optional, default=1e-6): added to the mean square.
        memory_efficient (bool, optional, default=False): accepted for apex compatibility.
    """
    return _apply_under_autocast(FusedRMSNormFunction, input, normalized_shape, eps, memory_efficient)


def mixed_dtype_fused_rms_norm_affine(input, weight, normalized_shape, eps=1e-6, memory_efficient=False):
    """RMS normalization with ``weight``; output in the weight's dtype.

    Example::

        >>> y = mixed_dtype_fused_rms_norm_affine(x.half(), norm.weight, 8)  # float32

    Args:
        input (Tensor): the tensor to normalize over its last ``len(normalized_shape)`` dims.
        weight (Tensor): scale; its dtype is the output's.
        normalized_shape (int or tuple): the trailing shape to normalize over.
        eps (float, optional, default=1e-6): added to the mean square.
        memory_efficient (bool, optional, default=False): accepted for apex compatibility.
    """
    return _apply_under_autocast(FusedRMSNormAffineMixedDtypesFunction, input, weight,
                                 normalized_shape, eps, memory_efficient)


def manual_rms_norm(input, normalized_shape, weight, eps):
    """apex's pure-PyTorch RMSNorm: fp32 variance; cast to the weight's dtype if it is fp16/bf16.

    Example::

        >>> y = manual_rms_norm(x, (8,), weight, 1e-5)

    Args:
        input (Tensor): the tensor to normalize.
        normalized_shape (int or tuple): the trailing shape to normalize over.
        weight (Tensor or None): scale, or None for no scaling.
        eps (float): added to the mean square.
    """
    dims = tuple(range(-len(_shape(normalized_shape)), 0))
    variance = input.to(torch.float32).pow(2).mean(dims, keepdim=True)
    input = input * torch.rsqrt(variance + eps)
    if weight is None:
        return input
    if weight.dtype in (torch.float16, torch.bfloat16):
        input = input.to(weight.dtype)
    return weight * input


# --- modules --------------------------------------------------------------------------------


class FusedLayerNorm(torch.nn.LayerNorm):
    """apex's ``FusedLayerNorm``: ``torch.nn.LayerNorm`` with apex's autocast dtype behaviour.

    Under autocast the output is in the autocast dtype (apex casts input and parameters); outside
    it, the output has the input's dtype. Parameters ``weight``/``bias`` match ``torch.nn.LayerNorm``.

    Example::

        >>> norm = FusedLayerNorm(512)
        >>> with torch.autocast("cuda"):
        ...     y = norm(x)  # float16, where torch.nn.LayerNorm gives float32

    Args:
        normalized_shape (int or tuple): the trailing shape to normalize over.
        eps (float, optional, default=1e-5): added to the variance.
        elementwise_affine (bool, optional, default=True): learn ``weight`` and ``bias``.
        memory_efficient (bool, optional, default=False): accepted for apex compatibility.
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        self.memory_efficient = memory_efficient

    def forward(self, input):
        if self.elementwise_affine:
            return fused_layer_norm_affine(input, self.weight, self.bias, self.normalized_shape,
                                           self.eps, self.memory_efficient)
        return fused_layer_norm(input, self.normalized_shape, self.eps, self.memory_efficient)

    def extra_repr(self):
        # apex's repr, which native LayerNorm extends with `bias=...`
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class FusedRMSNorm(torch.nn.RMSNorm):
    """apex's ``FusedRMSNorm``: ``x * rsqrt(mean(x**2) + eps) * weight`` with an fp32 mean square.

    Output in the input's dtype (the autocast dtype under autocast). The ``weight`` parameter
    matches ``torch.nn.RMSNorm``; ``eps`` defaults to 1e-5 (native: ``finfo(dtype).eps``).

    Example::

        >>> norm = FusedRMSNorm(512)
        >>> y = norm(x)

    Args:
        normalized_shape (int or tuple): the trailing shape to normalize over.
        eps (float, optional, default=1e-5): added to the mean square.
        elementwise_affine (bool, optional, default=True): learn ``weight``.
        memory_efficient (bool, optional, default=False): accepted for apex compatibility.
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        self.memory_efficient = memory_efficient

    def forward(self, input):
        if self.elementwise_affine:
            return fused_rms_norm_affine(input, self.weight, self.normalized_shape, self.eps,
                                         self.memory_efficient)
        return fused_rms_norm(input, self.normalized_shape, self.eps, self.memory_efficient)


def _always_affine(cls_name, kwargs):
    """apex's Mixed* norms are always affine: ``elementwise_affine`` warns, and False is an error."""
    if "elementwise_affine" in kwargs:
        warnings.warn(f"{cls_name} does not support the `elementwise_affine` argument; it is always "
                      "affine.")
        if not kwargs.pop("elementwise_affine"):
            raise RuntimeError(f"{cls_name} does not support `elementwise_affine = False`: use "
                               f"{cls_name.replace('Mixed', '')} for a norm without parameters.")
    if kwargs:
        warnings.warn(f"{cls_name} ignores the unexpected keyword arguments {sorted(kwargs)!r}.")


class MixedFusedLayerNorm(FusedLayerNorm):
    """apex's ``MixedFusedLayerNorm``: always affine; the output takes the weight's dtype.

    With fp32 parameters and an fp16/bf16 input the output is fp32 (Megatron-style mixed precision).

    Example::

        >>> norm = MixedFusedLayerNorm(512)
        >>> norm(x.half()).dtype
        torch.float32

    Args:
        normalized_shape (int or tuple): the trailing shape to normalize over.
        eps (float, optional, default=1e-5): added to the variance.
        memory_efficient (bool, optional, default=False): accepted for apex compatibility.
    """

    def __init__(self, normalized_shape, eps=1e-5, *, memory_efficient=False, **kwargs):
        _always_affine(type(self).__name__, kwargs)
        super().__init__(normalized_shape, eps=eps, elementwise_affine=True,
                         memory_efficient=memory_efficient)

    def forward(self, input):
        return mixed_dtype_fused_layer_norm_affine(input, self.weight, self.bias, self.normalized_shape,
                                                   self.eps, self.memory_efficient)


class MixedFusedRMSNorm(FusedRMSNorm):
    """apex's ``MixedFusedRMSNorm``: always affine; the output takes the weight's dtype.

    Example::

        >>> norm = MixedFusedRMSNorm(512)
        >>> norm(x.half()).dtype
        torch.float32

    Args:
        normalized_shape (int or tuple): the trailing shape to normalize over.
        eps (float, optional, default=1e-5): added to the mean square.
        memory_efficient (bool, optional, default=False): accepted for apex compatibility.
    """

    def __init__(self, normalized_shape, eps=1e-5, *, memory_efficient=False, **kwargs):
        _always_affine(type(self).__name__, kwargs)
        super().__init__(normalized_shape, eps=eps, elementwise_affine=True,
                         memory_efficient=memory_efficient)

    def forward(self, input):
        return mixed_dtype_fused_rms_norm_affine(input, self.weight, self.normalized_shape, self.eps,
                                                 self.memory_efficient)
