"""apex's loss scaler (``apex.amp.scaler.LossScaler``) on native fused kernels.

Semantics are apex's, which differ from ``torch.amp.GradScaler``: the scale is updated once per
backward pass (each non-delayed ``scale_loss`` exit), starts at ``min(2**16, max_loss_scale)``,
doubles after ``scale_window`` clean passes up to ``max_loss_scale``, halves on overflow (never
below ``min_loss_scale`` when one is set), and a static scale never detects overflow.

Unscaling and the inf/NaN check run in ``torch._amp_foreach_non_finite_check_and_unscale_``, one
launch per (device, dtype) group; the overflow flag stays on the device until
:meth:`LossScaler.update_scale` reads it, the one host synchronisation per backward pass.

A loss that stays non-finite never crashes the scaler: the dynamic scale stops halving at
:data:`SCALE_FLOOR`, and one warning says how long the gradients have overflowed.

What ampshim saves is :meth:`LossScaler.state_dict`, plain numbers (loads under ``torch.load``'s
default ``weights_only=True``). Objects pickled by real apex (inside ``FP16_Optimizer``
checkpoints) unpickle into this class: their ``__dict__`` holds exactly the attribute names kept
here.
"""
from __future__ import annotations

import math
import numbers
import warnings

import torch

__all__ = ["LossScaler", "SCALE_FLOOR", "OVERFLOW_STREAK_WARNING", "checked_scale",
           "checked_count"]

# The smallest normal float32. Unscaling multiplies by 1/scale in float32: below 2**-127 that
# reciprocal overflows (and a subnormal scale may be flushed to zero on GPUs), so halving stops
# here. Native GradScaler keeps halving on the device instead, down to a scale of 0.
SCALE_FLOOR = 2.**-126

# After this many consecutive overflowing backward passes, say (once) that the loss itself is
# non-finite: no loss scale can fix that.
OVERFLOW_STREAK_WARNING = 50

# The attribute set apex pickled; kept in this order for objects this class pickles.
_APEX_ATTRIBUTES = ("dynamic", "_loss_scale", "_max_loss_scale", "_min_loss_scale",
                    "_scale_seq_len", "_unskipped", "_has_overflow", "_overflow_buf")


class LossScaler:
    """Loss scale of one loss, static or dynamic, with apex's update rule.

    Example::

        scaler = LossScaler("dynamic")
        (loss.float() * scaler.loss_scale()).backward()
        scaler.clear_overflow_state()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        scaler.unscale(grads, grads, scaler.loss_scale(), models_are_masters=True)
        if not scaler.update_scale():  # reads the overflow flag (one host sync)
            optimizer.step()

    Args:
        loss_scale (float or "dynamic"): a fixed scale, or ``"dynamic"``.
        init_scale (float, optional, default=2.**16): first dynamic scale (capped by
            ``max_loss_scale``).
        scale_factor (float, optional, default=2.): accepted and ignored, as in apex (the factor
            is always 2).
        scale_window (int, optional, default=2000): clean backward passes between doublings.
        min_loss_scale (float, optional, default=None): floor for halving (none if falsy).
        max_loss_scale (float, optional, default=2.**24): ceiling for doubling.
    """

    # apex exposed whether its fused (amp_C) path is used; here it always is.
    has_fused_kernel = True

    def __init__(self, loss_scale, init_scale=2.**16, scale_factor=2., scale_window=2000,
                 min_loss_scale=None, max_loss_scale=2.**24):
        if loss_scale == "dynamic":
            self.dynamic = True
            self._loss_scale = min(max_loss_scale, checked_scale(init_scale, "init_scale"))
        else:
            self.dynamic = False
            self._loss_scale = checked_scale(loss_scale, "loss_scale")
        self._max_loss_scale = max_loss_scale
        self._min_loss_scale = min_loss_scale
        self._scale_seq_len = scale_window
        self._unskipped = 0
        self._has_overflow = False
        self._found_inf_per_device = {}
        self._overflow_streak = 0

    def loss_scale(self):
        """The current scale (reads ``_loss_scale``, which scripts may overwrite)."""
        return self._loss_scale

    def unscale(self, model_grads, master_grads, unused_scale, models_are_masters=False,
                scale_override=None):
        """Write ``model_grads / scale`` into ``master_grads`` and flag non-finite values.

        ``master_grads`` may be the same tensors as ``model_grads`` (unscale in place) or separate,
        e.g. fp32 masters of half-precision grads (copied first, so the division happens in fp32).

        Args:
            model_grads (list of Tensor): scaled gradients from the last backward pass.
            master_grads (list of Tensor): destinations, same length.
            unused_scale: ignored; the scaler's own scale is used (apex's signature).
            models_are_masters (bool, optional, default=False): a static scale of 1.0 is then a
                no-op.
            scale_override (float, optional, default=None): divide by this instead.
        """
        if self._has_overflow:
            return
        scale = self._loss_scale if scale_override is None else scale_override
        if models_are_masters and not self.dynamic and scale == 1.0:
            return
        if not _same_tensors(model_grads, master_grads):
            _grouped_copy_(master_grads, model_grads)
        self._check_and_scale_(master_grads, 1.0 / scale)

    def unscale_with_stashed(self, model_grads, stashed_master_grads, master_grads,
                             scale_override=None):
        """``master = model / scale + stashed``: add fresh scaled grads to accumulated ones.

        Only ``model_grads`` (the new ones) are checked for overflow.

        Args:
            model_grads (list of Tensor): scaled gradients from the last backward pass.
            stashed_master_grads (list of Tensor): gradients accumulated before it (unscaled).
            master_grads (list of Tensor): destinations; may be ``model_grads`` or
                ``stashed_master_grads`` themselves.
            scale_override (tuple, optional, default=None): ``(grads_scale, stashed_scale,
                out_scale)``: ``master = out * (model / grads_scale + stashed / stashed_scale)``.
        """
        if self._has_overflow:
            return
        grads_scale, stashed_scale, out_scale = self._loss_scale, 1.0, 1.0
        if scale_override is not None:
            grads_scale, stashed_scale, out_scale = scale_override
        stashed_factor = out_scale / stashed_scale
        if _same_tensors(model_grads, master_grads):
            fresh = master_grads
        else:
            # Unscale in the destination's precision, never in the (half) model grads.
            fresh = [torch.empty_like(master) for master in master_grads]
            _grouped_copy_(fresh, model_grads)
        self._check_and_scale_(fresh, out_scale / grads_scale)
        if fresh is master_grads:
            _grouped_add_(master_grads, stashed_master_grads, alpha=stashed_factor)
        elif _same_tensors(stashed_master_grads, master_grads):
            if stashed_factor != 1.0:
                _grouped_mul_(master_grads, stashed_factor)
            _grouped_add_(master_grads, fresh)
        else:
            _grouped_copy_(master_grads, fresh)
            _grouped_add_(master_grads, stashed_master_grads, alpha=stashed_factor)

    def clear_overflow_state(self):
        """Forget overflows seen so far (called before each backward pass is unscaled)."""
        self._has_overflow = False
        for found_inf in self._found_inf_per_device.values():
            found_inf.zero_()

    def update_scale(self):
        """Apply apex's update rule once for this backward pass; True means skip the step.

        .. warning::
            For a dynamic scaler this reads the on-device overflow flag: one host
            synchronisation.
        """
        if self.dynamic and not self._has_overflow and self._found_inf_per_device:
            self._has_overflow = self._read_found_inf()
        if self._has_overflow and self.dynamic:
            should_skip = True
            floor = max(self._min_loss_scale or SCALE_FLOOR, SCALE_FLOOR)
            self._loss_scale = max(floor, self._loss_scale / 2.)
            self._unskipped = 0
            self._count_overflow()
        else:
            should_skip = False
            self._unskipped += 1
            self._overflow_streak = 0
        if self._unskipped == self._scale_seq_len and self.dynamic:
            self._loss_scale = min(self._max_loss_scale, self._loss_scale * 2.)
            self._unskipped = 0
        return should_skip

    def _count_overflow(self):
        self._overflow_streak += 1
        if self._overflow_streak == OVERFLOW_STREAK_WARNING:
            warnings.warn(
                f"The gradients have been inf/NaN in {OVERFLOW_STREAK_WARNING} consecutive "
                f"backward passes; every step was skipped and the loss scale is down to "
                f"{self._loss_scale!r}. The loss itself is probably non-finite (check the inputs, "
                "the learning rate, a log or division of zero): lowering the scale cannot fix "
                "it. Training goes on, skipping steps.", RuntimeWarning, stacklevel=2)

    def state_dict(self):
        """Everything needed to resume, as plain numbers (``torch.load(weights_only=True)``).

        ``{'dynamic', 'loss_scale', 'unskipped', 'scale_window', 'min_loss_scale',
        'max_loss_scale'}``; :meth:`from_state_dict` rebuilds the scaler.
        """
        return {
            "dynamic": bool(self.dynamic),
            "loss_scale": float(self._loss_scale),
            "unskipped": int(self._unskipped),
            "scale_window": int(self._scale_seq_len),
            "min_loss_scale": None if self._min_loss_scale is None else float(self._min_loss_scale),
            "max_loss_scale": float(self._max_loss_scale),
        }

    @classmethod
    def from_state_dict(cls, state, name="loss_scaler"):
        """A scaler rebuilt from :meth:`state_dict`; every value is checked, named after ``name``.

        Args:
            state (dict): the output of :meth:`state_dict`.
            name (str, optional, default="loss_scaler"): how errors name the entry.
        """
        if not isinstance(state, dict):
            raise TypeError(f"{name} must be a dict from LossScaler.state_dict(), got {state!r}.")
        missing = {"dynamic", "loss_scale", "unskipped"} - set(state)
        if missing:
            raise ValueError(f"{name} lacks {sorted(missing)!r}; it is not a saved loss scaler: "
                             f"{state!r}.")
        scale = checked_scale(state["loss_scale"], f"{name}.loss_scale")
        min_scale = state.get("min_loss_scale")
        scaler = cls("dynamic" if state["dynamic"] else scale,
                     scale_window=checked_count(state.get("scale_window", 2000),
                                                f"{name}.scale_window", minimum=1),
                     min_loss_scale=None if min_scale is None else checked_scale(
                         min_scale, f"{name}.min_loss_scale"),
                     max_loss_scale=checked_scale(state.get("max_loss_scale", 2.**24),
                                                  f"{name}.max_loss_scale"))
        scaler._loss_scale = scale
        scaler._unskipped = checked_count(state["unskipped"], f"{name}.unskipped")
        return scaler

    @property
    def _overflow_buf(self):
        """The on-device overflow flag (non-zero after an overflow), as apex named it."""
        if not self._found_inf_per_device:
            return self._found_inf(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        return next(iter(self._found_inf_per_device.values()))

    def _found_inf(self, device):
        found_inf = self._found_inf_per_device.get(device)
        if found_inf is None:
            found_inf = torch.zeros(1, dtype=torch.float32, device=device)
            self._found_inf_per_device[device] = found_inf
        return found_inf

    def _read_found_inf(self):
        flags = list(self._found_inf_per_device.values())
        total = flags[0] if len(flags) == 1 else sum(f.to(flags[0].device) for f in flags)
        return bool(total.item())

    def _check_and_scale_(self, tensors, inv_scale):
        """Multiply in place by ``inv_scale``; a dynamic scaler also records non-finite values."""
        # a sparse gradient (`nn.Embedding(sparse=True)`) is its values: the kernels take dense tensors
        tensors = [t._values() if t.is_sparse else t for t in tensors]
        if not self.dynamic:
            if inv_scale != 1.0:
                _grouped_mul_(tensors, inv_scale)
            return
        inv_scale_on = {}
        for (device, _dtype), (group, _) in _groups(tensors).items():
            if device not in inv_scale_on:
                inv_scale_on[device] = torch.full((1,), inv_scale, dtype=torch.float32,
                                                  device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(
                group, self._found_inf(device), inv_scale_on[device])

    def __getstate__(self):
        state = {name: self.__dict__[name] for name in _APEX_ATTRIBUTES if name in self.__dict__}
        state["_overflow_buf"] = torch.zeros(1, dtype=torch.int32)
        return state

    def __setstate__(self, state):
        state = dict(state)
        state.pop("_overflow_buf", None)  # apex's CUDA int flag; rebuilt on demand per device
        state.setdefault("_min_loss_scale", None)  # absent in pickles older than mid-2019
        state.setdefault("_max_loss_scale", 2.**24)
        state.setdefault("_has_overflow", False)
        self.__dict__.update(state)
        self._has_overflow = bool(self._has_overflow)
        self._found_inf_per_device = {}
        self._overflow_streak = 0

    def __repr__(self):
        kind = "dynamic" if self.dynamic else "static"
        return (f"LossScaler({kind}, loss_scale={self._loss_scale!r}, "
                f"unskipped={self._unskipped!r})")


def checked_scale(value, name):
    """``value`` as a positive, finite float, or an error naming ``name`` (a loaded or given scale).

    Numbers, numeric strings (argparse) and one-element tensors are accepted.
    """
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a single number, got a tensor of shape "
                             f"{tuple(value.shape)}.")
        value = value.item()
    if isinstance(value, bool) or value is None:
        raise TypeError(f"{name} must be a positive number, got {value!r}.")
    try:
        number = float(value)
    except (TypeError, ValueError):
        # float()'s own split: a string that is not a number is a bad value, anything else a
        # bad type.
        error = ValueError if isinstance(value, str) else TypeError
        raise error(f"{name} must be a positive number (or \"dynamic\" where a dynamic "
                    f"scale is allowed), got {value!r}.") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{name} must be a positive, finite number, got {value!r}: a loss "
                         "scale of zero, below zero or not finite makes every gradient useless.")
    return number


def checked_count(value, name, minimum=0):
    """``value`` as an int >= ``minimum`` (a step counter), or an error naming ``name``."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value!r}.")
    return int(value)


def _same_tensors(a, b):
    return a is b or (len(a) == len(b) and all(x is y for x, y in zip(a, b)))


def _groups(tensors):
    """``{(device, dtype): (tensors of that group, their indices)}``: the unit a foreach kernel
    fuses over (grouped in C++ by the helper torch's own optimizers use)."""
    if not tensors:
        return {}
    grouped = torch._C._group_tensors_by_device_and_dtype([tensors], True)
    return {key: (lists[0], indices) for key, (lists, indices) in grouped.items()}


def _grouped_copy_(destinations, sources):
    for group, indices in _groups(destinations).values():
        torch._foreach_copy_(group, [sources[i] for i in indices])


def _grouped_add_(destinations, others, alpha=1.0):
    for group, indices in _groups(destinations).values():
        torch._foreach_add_(group, [others[i] for i in indices], alpha=alpha)


def _grouped_mul_(tensors, factor):
    for group, _ in _groups(tensors).values():
        torch._foreach_mul_(group, factor)
