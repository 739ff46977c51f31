"""fp16_utils' own loss scalers (not amp's): static ``LossScaler`` and ``DynamicLossScaler``.

Their constants differ from amp's scaler: the dynamic one starts at 2**32, grows every 1000
iterations without overflow, and never goes below 1.
"""
import torch

__all__ = ["LossScaler", "DynamicLossScaler"]


class _ScaledBackward:
    """What both scalers share: the scale as a property, scaled backward, a scaling hook."""

    @property
    def loss_scale(self):
        return self.cur_scale

    def scale_gradient(self, module, grad_in, grad_out):
        """A backward hook multiplying the incoming gradients by the scale."""
        return tuple(self.loss_scale * g for g in grad_in)

    def backward(self, loss, retain_graph=False):
        """``(loss * loss_scale).backward(retain_graph=retain_graph)``."""
        scaled_loss = loss * self.loss_scale
        scaled_loss.backward(retain_graph=retain_graph)


class LossScaler(_ScaledBackward):
    """A static loss scale: multiplies the loss before backward; never detects overflow.

    Example::

        >>> scaler = LossScaler(128.0)
        >>> scaler.backward(loss)  # (loss * 128).backward()

    Args:
        scale (float, optional, default=1): the scale.
    """

    def __init__(self, scale=1):
        self.cur_scale = scale

    def has_overflow(self, params):
        """Always False: a static scale does not look for overflow."""
        return False

    @staticmethod
    def _has_inf_or_nan(x):
        return False

    def update_scale(self, overflow):
        """No-op for a static scale."""


class DynamicLossScaler(_ScaledBackward):
    """A loss scale that halves on overflow (not below 1) and doubles after a clean window.

    ``update_scale(overflow)`` is called once per iteration: on overflow the scale is divided by
    ``scale_factor`` (floored at 1); otherwise it is multiplied by ``scale_factor`` whenever
    ``scale_window`` iterations have passed since the last overflow.

    Example::

        >>> scaler = DynamicLossScaler()
        >>> scaler.backward(loss)
        >>> overflow = scaler.has_overflow(model.parameters())
        >>> scaler.update_scale(overflow)
        >>> if not overflow:
        ...     optimizer.step()

    Args:
        init_scale (float, optional, default=2**32): the first scale.
        scale_factor (float, optional, default=2.): growth and shrink factor.
        scale_window (int, optional, default=1000): iterations without overflow between growths.
    """

    def __init__(self, init_scale=2 ** 32, scale_factor=2., scale_window=1000):
        self.cur_scale = init_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window

    def has_overflow(self, params):
        """True if any parameter's gradient holds inf or NaN."""
        return any(p.grad is not None and self._has_inf_or_nan(p.grad) for p in params)

    @staticmethod
    def _has_inf_or_nan(x):
        return not bool(torch.isfinite(x).all())

    def update_scale(self, overflow):
        """Halve on ``overflow`` (floor 1); otherwise grow once every ``scale_window`` iterations."""
        if overflow:
            self.cur_scale = max(self.cur_scale / self.scale_factor, 1)
            self.last_overflow_iter = self.cur_iter
        elif (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
            self.cur_scale *= self.scale_factor
        self.cur_iter += 1
