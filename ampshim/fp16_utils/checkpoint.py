"""Loss scalers saved by every generation of apex, loaded safely and trained on.

* What ampshim saves is plain numbers (:meth:`ampshim.scaler.LossScaler.state_dict`).
* ``FP16_Optimizer`` checkpoints written by real apex pickle a scaler OBJECT: amp's
  ``apex.amp.scaler.LossScaler`` (2019 on), or, in 2018-2019, fp16_utils' own
  ``apex.fp16_utils.loss_scaler.LossScaler`` / ``DynamicLossScaler``; earlier ampshim versions
  pickled ``ampshim.scaler.LossScaler``. :func:`register_safe_globals` lets ``torch.load``'s
  default weights-only unpickler build them, under apex's names, as ampshim's classes (plain
  attribute dicts: nothing runs while loading). Importing this module (``import apex`` or
  ``ampshim.fp16_utils`` does) registers them.
* :func:`loss_scaler_from_checkpoint` turns any of these into the scaler ``FP16_Optimizer``
  trains with; the 2018 scaler's counters are converted, not half-adopted.
"""
from __future__ import annotations

import warnings

import torch

from ampshim.fp16_utils.loss_scaler import DynamicLossScaler
from ampshim.fp16_utils.loss_scaler import LossScaler as StaticFp16LossScaler
from ampshim.scaler import LossScaler, checked_count, checked_scale

__all__ = ["register_safe_globals", "loss_scaler_from_checkpoint"]

# The class paths pickled in checkpoints -> the classes that unpickle them.
_PICKLED_CLASSES = {
    "apex.amp.scaler.LossScaler": LossScaler,
    "apex.fp16_utils.loss_scaler.LossScaler": StaticFp16LossScaler,
    "apex.fp16_utils.loss_scaler.DynamicLossScaler": DynamicLossScaler,
    "ampshim.scaler.LossScaler": LossScaler,
    "ampshim.fp16_utils.loss_scaler.LossScaler": StaticFp16LossScaler,
    "ampshim.fp16_utils.loss_scaler.DynamicLossScaler": DynamicLossScaler,
}

# amp's ceiling, which a converted 2018 scaler (unbounded, starting at 2**32) gets too.
_MAX_LOSS_SCALE = 2.**24


def register_safe_globals():
    """Allow the scaler classes of old checkpoints in ``torch.load(weights_only=True)``.

    Needs torch 2.6 or newer (the release that made ``weights_only=True`` the default and
    accepts a class registered under another path); older torch loads them with its default
    ``weights_only=False``.
    """
    if torch.torch_version.TorchVersion(torch.__version__) < (2, 6):
        return
    torch.serialization.add_safe_globals(
        [(cls, path) for path, cls in _PICKLED_CLASSES.items()])


register_safe_globals()


def loss_scaler_from_checkpoint(saved, name="loss_scaler"):
    """The amp :class:`~ampshim.scaler.LossScaler` for a scaler saved by any apex generation.

    Args:
        saved: ``LossScaler.state_dict()`` output, or a pickled amp ``LossScaler``, or a 2018
            fp16_utils ``LossScaler`` / ``DynamicLossScaler``.
        name (str, optional, default="loss_scaler"): how errors name the entry.
    """
    if isinstance(saved, dict):
        return LossScaler.from_state_dict(saved, name)
    if isinstance(saved, LossScaler):
        checked_scale(saved.loss_scale(), f"{name}._loss_scale")
        return saved
    if isinstance(saved, DynamicLossScaler):
        return _from_2018_dynamic(saved, name)
    if isinstance(saved, StaticFp16LossScaler):
        return LossScaler(checked_scale(saved.cur_scale, f"{name}.cur_scale"))
    raise TypeError(f"{name} is not a saved loss scaler: {saved!r}. Expected the output of "
                    "FP16_Optimizer.state_dict() (ampshim's or apex's).")


def _from_2018_dynamic(old, name):
    """fp16_utils' DynamicLossScaler as amp's scaler: same window, same floor (1), amp's ceiling.

    Both grow after ``scale_window`` clean iterations since the last overflow or growth, so the
    clean iterations already counted carry over as ``_unskipped``.
    """
    window = checked_count(getattr(old, "scale_window", 1000), f"{name}.scale_window", minimum=1)
    factor = getattr(old, "scale_factor", 2.)
    if factor != 2.:
        warnings.warn(f"{name} was saved with scale_factor={factor!r}; it is converted to amp's "
                      "loss scaler, which always doubles and halves the scale.", stacklevel=3)
    scale = checked_scale(old.cur_scale, f"{name}.cur_scale")
    cur_iter = checked_count(old.cur_iter, f"{name}.cur_iter")
    last_overflow_iter = checked_count(old.last_overflow_iter, f"{name}.last_overflow_iter",
                                       minimum=-1)  # -1: no overflow yet
    scaler = LossScaler("dynamic", init_scale=scale, scale_window=window, min_loss_scale=1.,
                        max_loss_scale=_MAX_LOSS_SCALE)
    scaler._unskipped = (cur_iter - last_overflow_iter - 1) % window
    return scaler
