"""The O1 handle: ``amp.init()`` and the ``AmpHandle``/``NoOpHandle`` it returns.

``amp.initialize(..., opt_level="O1")`` calls :func:`init`; 2018-era scripts call ``amp.init()``
themselves and use the returned handle's ``scale_loss``. The handle owns one activation of O1:
native autocast switched on for the calling thread (the whole process in effect, as apex's
patching was), plus the wrappers the user's list edits and registrations ask for
(:mod:`ampshim.casting`). ``_deactivate()`` restores what was there before.

This module is also served as ``apex.amp.handle`` and ``apex.amp.opt``.
"""
from __future__ import annotations

import contextlib

import torch

from ampshim import casting
from ampshim.device import device_type_of, half_dtype
from ampshim.state import _amp_state, maybe_print

__all__ = ["init", "AmpHandle", "NoOpHandle"]


def init(enabled=True, loss_scale="dynamic", enable_caching=True, verbose=False,
         allow_banned=False, device_type=None):
    """Turn on O1 casts for the process and return the handle (apex's ``amp.init``).

    Native autocast is enabled for ``device_type`` in the calling thread and stays on until
    ``handle._deactivate()``: code outside the model (losses, metrics) runs under it too, as under
    apex's global patching. Edits to ``amp.lists`` and pending ``register_*_function`` calls are
    applied now. A handle from an earlier call is deactivated first (its registrations carry over).

    Example::

        >>> amp_handle = amp.init()
        >>> loss = criterion(model(x), y)
        >>> with amp_handle.scale_loss(loss, optimizer) as scaled_loss:
        ...     scaled_loss.backward()
        >>> optimizer.step()

    Args:
        enabled (bool, optional, default=True): False returns a :class:`NoOpHandle`.
        loss_scale (float or "dynamic", optional, default="dynamic"): the scale used by
            ``handle.scale_loss`` (``amp.scale_loss`` has its own scalers).
        enable_caching (bool, optional, default=True): accepted for compatibility; the autocast
            weight cache is always off under O1, so a stale cast can never be used.
        verbose (bool, optional, default=False): print each function wrapped.
        allow_banned (bool, optional, default=False): let banned functions
            (``F.binary_cross_entropy``) take half inputs, cast to float32.
        device_type (str, optional, default=None): ``"cuda"``, ``"cpu"``...; None means CUDA when
            available, else the CPU. Half precision is float16 on CUDA, bfloat16 elsewhere.
    """
    previous = _amp_state.handle
    registrations = []
    if isinstance(previous, AmpHandle):
        registrations = list(previous._registrations)
        previous._deactivate()
    if not enabled:
        handle = NoOpHandle()
    else:
        device_type = torch.device(device_type).type if device_type else device_type_of([])
        handle = AmpHandle(
            loss_scale=loss_scale, enable_caching=enable_caching, verbose=verbose,
            allow_banned=allow_banned, device_type=device_type,
            registrations=registrations + casting._take_registrations())
        handle._activate()
    _amp_state.handle = handle
    return handle


class AmpHandle:
    """One activation of O1: autocast on, the user's extra casts installed.

    Made by :func:`init`; ``_deactivate()`` undoes it.
    """

    def __init__(self, loss_scale="dynamic", enable_caching=True, verbose=False,
                 allow_banned=False, device_type="cuda", registrations=()):
        self.device_type = device_type
        self.dtype = half_dtype(device_type)
        self._loss_scale = loss_scale
        self._enable_caching = enable_caching
        self._verbose = verbose
        self._allow_banned = allow_banned
        self._registrations = tuple(registrations)
        self._default_scaler = None
        self._is_active = False
        self._saved_autocast = None
        self._patches = []

    def _activate(self):
        if self._saved_autocast is not None:
            return
        self._saved_autocast = casting._enable_autocast(self.device_type, self.dtype)
        self._patches = casting._install_casts(
            self.device_type, self.dtype, allow_banned=self._allow_banned,
            registrations=self._registrations, verbose=self._verbose)
        self._is_active = True

    def is_active(self):
        """True while O1 casts are on (False inside ``disable_casts`` and after ``_deactivate``)."""
        return self._is_active

    def _deactivate(self):
        """Remove the wrappers and restore the autocast state from before :func:`init`."""
        if self._saved_autocast is None:
            return
        casting._remove_casts(self._patches)
        casting._restore_autocast(self.device_type, self._saved_autocast)
        self._saved_autocast = None
        self._is_active = False

    @contextlib.contextmanager
    def _disable_casts(self):
        """Run the block with autocast off; restore it on exit, even on an exception."""
        was_active = self._is_active
        was_enabled = torch.is_autocast_enabled(self.device_type)
        self._is_active = False
        torch.set_autocast_enabled(self.device_type, False)
        try:
            yield
        finally:
            if self._saved_autocast is not None:  # not deactivated inside the block
                torch.set_autocast_enabled(self.device_type, was_enabled)
                self._is_active = was_active

    def _clear_cache(self):
        """Drop autocast's cached weight casts (there are none: the cache is off under O1)."""
        torch.clear_autocast_cache()

    @property
    def has_cache(self):
        return False

    @property
    def verbose(self):
        return self._verbose

    def __repr__(self):
        state = "active" if self._is_active else "inactive"
        return f"AmpHandle({state}, device_type={self.device_type!r}, dtype={self.dtype})"


class NoOpHandle:
    """What ``amp.init(enabled=False)`` returns: every method is a plain pass-through."""

    device_type = None
    dtype = None
    has_cache = False
    verbose = False

    def is_active(self):
        return False

    @contextlib.contextmanager
    def _disable_casts(self):
        yield

    @contextlib.contextmanager
    def scale_loss(self, loss, optimizer):
        yield loss

    def _clear_cache(self):
        pass

    def _deactivate(self):
        pass

    def __repr__(self):
        return "NoOpHandle()"
