"""O1 cast lists for the ``torch`` namespace (apex's ``amp.lists.torch_overrides``).

Plain, mutable lists of attribute names, honoured at the next ``amp.initialize`` (O1) or
``amp.init()``. ``tensor_overrides`` copied the names that exist on ``torch.Tensor`` when it was
imported, so later edits here affect ``torch.<name>`` only, as in apex.
"""
import torch

MODULE = torch

# Run in the autocast's lower precision (float16 on CUDA, bfloat16 on CPU).
FP16_FUNCS = [
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "conv_tbc",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "mm",
    "mv",
    # apex placed the batched products here when CUDA >= 9.1, i.e. on every CUDA torch supports.
    "addbmm",
    "baddbmm",
    "bmm",
]

# Run in float32.
FP32_FUNCS = [
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow",
    "cumprod",
    "cumsum",
    "dist",
    "norm",
    "prod",
    "std",
    "sum",
    "var",
    "renorm",
]

# Mixed floating arguments are promoted to the widest type.
CASTS = [
    "addcdiv",
    "addcmul",
    "atan2",
    "cross",
    "bilinear",
    "dot",
    "add",
    "div",
    "mul",
    "eq",
    "equal",
    "ge",
    "gt",
    "le",
    "lt",
    "ne",
]

# Like CASTS, for functions taking a sequence of tensors.
SEQUENCE_CASTS = [
    "cat",
    "stack",
]

# The shipped lists, to tell the user's edits from the defaults at initialization.
_DEFAULTS = {
    "FP16_FUNCS": tuple(FP16_FUNCS),
    "FP32_FUNCS": tuple(FP32_FUNCS),
    "CASTS": tuple(CASTS),
    "SEQUENCE_CASTS": tuple(SEQUENCE_CASTS),
}
