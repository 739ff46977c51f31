"""O1 cast lists for ``torch.Tensor`` methods (apex's ``amp.lists.tensor_overrides``).

Plain, mutable lists of method names, honoured at the next ``amp.initialize`` (O1) or
``amp.init()``. At import each list is extended with the ``torch_overrides`` names that also
exist as ``torch.Tensor`` methods (a copy: later edits to ``torch_overrides`` do not reach here).
"""
import torch

from ampshim.lists import torch_overrides

MODULE = torch.Tensor

# Run in the autocast's lower precision (float16 on CUDA, bfloat16 on CPU).
FP16_FUNCS = [
    "__matmul__",
]

# Run in float32.
FP32_FUNCS = [
    "__ipow__",
    "__pow__",
    "__rpow__",
    # apex cast to float32 before copying to the host.
    "cpu",
]

# Mixed floating arguments are promoted to the widest type (names torch.Tensor lacks are dropped).
CASTS = [
    name
    for name in (
        "__add__", "__div__", "__eq__", "__ge__", "__gt__", "__iadd__", "__idiv__", "__imul__",
        "__isub__", "__itruediv__", "__le__", "__lt__", "__mul__", "__ne__", "__radd__",
        "__rdiv__", "__rmul__", "__rsub__", "__rtruediv__", "__sub__", "__truediv__",
    )
    if hasattr(MODULE, name)
]

SEQUENCE_CASTS = []

for _mine, _theirs in (
    (FP16_FUNCS, torch_overrides.FP16_FUNCS),
    (FP32_FUNCS, torch_overrides.FP32_FUNCS),
    (CASTS, torch_overrides.CASTS),
    (SEQUENCE_CASTS, torch_overrides.SEQUENCE_CASTS),
):
    _mine.extend(name for name in _theirs if hasattr(MODULE, name))
del _mine, _theirs

# The shipped lists, to tell the user's edits from the defaults at initialization.
_DEFAULTS = {
    "FP16_FUNCS": tuple(FP16_FUNCS),
    "FP32_FUNCS": tuple(FP32_FUNCS),
    "CASTS": tuple(CASTS),
    "SEQUENCE_CASTS": tuple(SEQUENCE_CASTS),
}
