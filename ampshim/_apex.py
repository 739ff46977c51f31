"""The ``apex`` package itself, as served by ampshim: apex's root names, submodules on first use."""
import importlib
import importlib.util

if importlib.util.find_spec("torch") is None:
    raise ImportError(
        "apex (provided by ampshim) needs PyTorch, which is not installed: "
        "pip install 'ampshim[torch]' (or install the torch build you train with)")

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
