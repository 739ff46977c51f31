"""The ``apex`` package itself, as served by ampshim: apex's root names, submodules on first use.

Importing it also lets ``torch.load(path)`` (``weights_only=True``) read the loss scalers that
real apex pickled into old checkpoints (see ``ampshim.fp16_utils.checkpoint``).
"""
import importlib
import importlib.util
import sys


class TorchMissingError(ModuleNotFoundError):
    """``import apex`` without torch installed; uncaught, it prints as one line, no traceback."""


def _torch_is_missing():
    try:
        return importlib.util.find_spec("torch") is None
    except (ImportError, ValueError):  # a broken or blocked torch
        return True


def _print_one_line(previous_hook):
    def hook(exc_type, exc, traceback):
        if isinstance(exc, TorchMissingError):
            print(f"{exc_type.__name__}: {exc}", file=sys.stderr)
        else:
            previous_hook(exc_type, exc, traceback)

    return hook


if _torch_is_missing():
    # `except ImportError` in the script still catches it; only the uncaught report is short.
    sys.excepthook = _print_one_line(sys.excepthook)
    raise TorchMissingError(
        "apex (provided by ampshim) needs PyTorch, which is not installed: install the torch "
        "build you train with (pip install torch; the CPU build: pip install torch "
        "--index-url https://download.pytorch.org/whl/cpu)", name="torch")

import ampshim.fp16_utils.checkpoint  # noqa: E402,F401 - registers old scalers with torch.load
from ampshim.deprecation import DeprecatedFeatureWarning, deprecated_warning  # noqa: E402

__all__ = ["DeprecatedFeatureWarning", "deprecated_warning", "check_cudnn_version_and_warn",
           "amp", "fp16_utils", "parallel", "optimizers", "normalization"]

# Submodules real apex imported eagerly in its __init__; here on first attribute access,
# so `import apex` stays cheap and `apex.amp` still works without `import apex.amp`.
_SUBMODULES = ("amp", "fp16_utils", "parallel", "optimizers", "normalization", "multi_tensor_apply")


def check_cudnn_version_and_warn(global_option: str, required_cudnn_version: int) -> bool:
    """True when cuDNN is available at ``required_cudnn_version`` or newer; warns otherwise."""
    import warnings

    import torch

    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if version is None or version < required_cudnn_version:
        warnings.warn(f"{global_option} needs cuDNN >= {required_cudnn_version}, found {version}")
        return False
    return True


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"apex.{name}")
    raise AttributeError(f"module 'apex' has no attribute {name!r}")
