"""Which device and which half-precision dtype apex's behaviour maps to.

apex assumed CUDA and float16. ampshim follows the models' parameters instead: on CUDA "half" is
float16 (apex's choice), anywhere else it is bfloat16, because float16 arithmetic on the CPU is
slow and poorly covered while bfloat16 is what CPU autocast supports. The environment variable
``AMPSHIM_DTYPE`` chooses on every device: ``bfloat16`` on CUDA too (the ROCm fork's O4/O5 idea),
``float16`` elsewhere too.
"""
from __future__ import annotations

import os
import sys
import warnings

import torch

from ampshim.deprecation import user_stacklevel

__all__ = ["device_type_of", "half_dtype", "resolve_dtype", "DTYPE_ENV_VAR"]

DTYPE_ENV_VAR = "AMPSHIM_DTYPE"

_ENV_DTYPES = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
               "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}

_warned_cpu = False


def device_type_of(models) -> str:
    """The device type (``"cuda"``, ``"cpu"``, ...) of the first floating parameter or buffer.

    A model without floating tensors follows the machine: CUDA when available, else the CPU (also
    where CUDA is mapped to the CPU by ``python -m ampshim --device cpu``).

    Args:
        models (nn.Module or list of nn.Module): the models passed to ``amp.initialize``.
    """
    if isinstance(models, torch.nn.Module):
        models = [models]
    for model in models:
        for tensor in _floating_tensors(model):
            return tensor.device.type
    cpu_mapping = sys.modules.get("ampshim.cuda_on_cpu")
    if cpu_mapping is not None and cpu_mapping.is_enabled():
        return "cpu"  # torch.cuda.is_available() says True there, and CUDA's autocast does nothing
    return "cuda" if torch.cuda.is_available() else "cpu"


def half_dtype(device_type: str) -> torch.dtype:
    """The dtype that stands in for apex's float16 on ``device_type``.

    ``AMPSHIM_DTYPE`` when set (an unknown value is an error on every device); otherwise float16
    on CUDA, and bfloat16 on any other device, with a one-time warning per process saying so.

    Args:
        device_type (str): ``"cuda"``, ``"cpu"``, ... (a ``torch.device`` is accepted too).
    """
    device_type = torch.device(device_type).type
    requested = _requested_dtype()
    if requested is not None:
        return requested
    if device_type == "cuda":
        return torch.float16
    _warn_cpu_bfloat16_once(device_type)
    return torch.bfloat16


def resolve_dtype(dtype, device_type: str):
    """Map a dtype requested in apex terms to the one used on ``device_type``.

    ``torch.float16`` becomes :func:`half_dtype` of the device; every other value (float32,
    bfloat16, None, False) is returned unchanged.
    """
    if dtype is torch.float16:
        return half_dtype(device_type)
    return dtype


def _requested_dtype() -> torch.dtype | None:
    requested = os.environ.get(DTYPE_ENV_VAR, "").strip().lower()
    if not requested:
        return None
    if requested not in _ENV_DTYPES:
        raise ValueError(
            f"{DTYPE_ENV_VAR}={requested!r} is not a half-precision dtype ampshim knows. "
            f"Use one of {', '.join(sorted(_ENV_DTYPES))}, or unset it to get float16 on CUDA "
            "and bfloat16 elsewhere.")
    return _ENV_DTYPES[requested]


def _warn_cpu_bfloat16_once(device_type: str) -> None:
    global _warned_cpu
    if _warned_cpu:
        return
    _warned_cpu = True
    warnings.warn(
        f"ampshim: the model is on {device_type!r}, not CUDA; apex's float16 is replaced by "
        "bfloat16 there (float16 is slow and poorly supported off CUDA). Loss scaling still "
        "follows apex's rules.", UserWarning, stacklevel=user_stacklevel())


def _floating_tensors(model):
    for tensor in model.parameters():
        if tensor.is_floating_point():
            yield tensor
    for tensor in model.buffers():
        if tensor.is_floating_point():
            yield tensor
