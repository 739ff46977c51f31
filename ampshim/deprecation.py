"""apex's deprecation warning for the features it retired in favour of native PyTorch."""
import warnings

__all__ = ["DeprecatedFeatureWarning", "deprecated_warning"]


class DeprecatedFeatureWarning(FutureWarning):
    """Emitted by apex features that have a native PyTorch replacement (amp, DDP, SyncBatchNorm...)."""


def deprecated_warning(msg: str) -> None:
    """Warn with :class:`DeprecatedFeatureWarning`, once per job: only rank 0 warns when distributed.

    Example::

        >>> deprecated_warning("apex.fp16_utils is deprecated. Use torch.amp.")

    Args:
        msg (str): the text of the warning.
    """
    import torch.distributed as dist  # deferred: importing this module must not import torch

    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return
    warnings.warn(msg, DeprecatedFeatureWarning, stacklevel=3)
