"""Deprecation warnings for the apex features that native PyTorch replaced.

Each is one line naming the native replacement and ``ampmigrate``, attributed to the user's line
(the first caller outside ampshim), so Python's default filter shows it once per call site, not
once per step or per layer.
"""
import os
import sys
import warnings

__all__ = ["DeprecatedFeatureWarning", "deprecated_warning", "warn_deprecated"]

_AMPSHIM_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class DeprecatedFeatureWarning(FutureWarning):
    """Emitted by apex features that have a native PyTorch replacement (amp, DDP, SyncBatchNorm...)."""


def warn_deprecated(feature: str, replacement: str, rewritten: bool = True) -> None:
    """Warn that ``feature`` is deprecated, naming ``replacement`` and the ampmigrate command.

    Example::

        >>> warn_deprecated("apex.parallel.SyncBatchNorm", "torch.nn.SyncBatchNorm")
        train.py:12: DeprecatedFeatureWarning: apex.parallel.SyncBatchNorm is deprecated: use
        torch.nn.SyncBatchNorm; `ampmigrate train.py` rewrites it (--diff to preview)

    Args:
        feature (str): the apex name the user called.
        replacement (str): what native PyTorch offers instead.
        rewritten (bool, optional, default=True): whether ampmigrate rewrites this feature (or
            only reports it with the manual steps).
    """
    script = _user_file(user_stacklevel())
    command = (f"`ampmigrate {script}` rewrites it (--diff to preview)" if rewritten else
               f"`ampmigrate --check {script}` lists the manual steps")
    deprecated_warning(f"{feature} is deprecated: use {replacement}; {command}")


def deprecated_warning(msg: str) -> None:
    """Warn with :class:`DeprecatedFeatureWarning` at the user's line; only rank 0 warns when
    distributed (apex's function, still public as ``apex.deprecated_warning``).

    Example::

        >>> deprecated_warning("apex.thing is deprecated: use torch.amp")

    Args:
        msg (str): the text of the warning.
    """
    import torch.distributed as dist  # deferred: importing this module must not import torch

    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return
    warnings.warn(msg, DeprecatedFeatureWarning, stacklevel=user_stacklevel())


def user_stacklevel():
    """The ``stacklevel`` that makes a warning issued by this module's caller point at the first
    frame outside ampshim (and outside the import system, for decorators run at import)."""
    frame, level = sys._getframe(2), 2  # the caller of the function that called this one
    while frame.f_back is not None and _is_internal(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


def _is_internal(filename):
    return filename.startswith(_AMPSHIM_DIR) or filename.startswith("<frozen importlib")


def _user_file(stacklevel):
    filename = sys._getframe(stacklevel).f_code.co_filename
    if not os.path.isfile(filename):
        return "YOUR_SCRIPT.py"  # python -c, a notebook cell
    relative = os.path.relpath(filename)
    return relative if not relative.startswith("..") else filename
