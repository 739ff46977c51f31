"""The O1 handle: ``amp.init()``, the ``AmpHandle``/``NoOpHandle`` it returns, ``OptimWrapper``.

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
from ampshim.optimizer import _stash_grads, _unscale_and_restore_stash
from ampshim.scale_loss import _as_optimizer_list, _ScaleLoss
from ampshim.scaler import LossScaler
from ampshim.state import _amp_state, maybe_print

__all__ = ["init", "AmpHandle", "NoOpHandle", "OptimWrapper"]


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

    .. warning::
        Autocast state belongs to a thread: threads your code starts later do not run under O1
        (``nn.DataParallel`` replicas do). Call ``backward()`` inside ``scale_loss`` (as apex
        required) or inside ``amp.disable_casts()``: native autocast would also apply to the ops
        that backward runs.

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
        self._apex_lists = casting.follows_apex_lists(device_type)  # a bad setting fails here
        self._default_scaler = LossScaler(loss_scale)
        self._is_active = False
        self._saved_autocast = None
        self._patches = []

    def _activate(self):
        if self._saved_autocast is not None:
            return
        self._saved_autocast = casting._enable_autocast(self.device_type, self.dtype)
        self._patches = casting._install_casts(
            self.device_type, self.dtype, allow_banned=self._allow_banned,
            registrations=self._registrations, apex_lists=self._apex_lists, verbose=self._verbose)
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
        if self._saved_autocast is None:  # deactivated: nothing of ours to turn off
            yield
            return
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

    def scale_loss(self, loss, optimizer):
        """The 2018 API's loss scaling: ``with handle.scale_loss(loss, optimizer) as scaled_loss``.

        apex's last releases raised "The old Amp API is no longer supported" here; ampshim runs
        the old code instead, with ``amp.scale_loss``'s semantics and the handle's own scaler
        (``loss_scale`` of :func:`init`): the block yields ``loss.float() * scale`` and runs with
        casts disabled; at exit the gradients are unscaled (added to any accumulated before) and
        on overflow the optimizer's next ``step()`` is skipped and the scale halved. The
        optimizer's ``step()`` is made to run with casts disabled too.

        Example::

            >>> amp_handle = amp.init()
            >>> with amp_handle.scale_loss(loss, optimizer) as scaled_loss:
            ...     scaled_loss.backward()
            >>> optimizer.step()

        Args:
            loss (Tensor): the loss to backpropagate.
            optimizer (torch.optim.Optimizer or list): the optimizer(s) stepping after backward.
        """
        if not self.is_active():
            return contextlib.nullcontext(loss)
        if self._default_scaler is None:
            raise RuntimeError(
                "handle.scale_loss() was called after handle.wrap_optimizer(); the wrapped "
                "optimizer scales its own losses: use `with optimizer.scale_loss(loss) as "
                "scaled_loss:` with the optimizer wrap_optimizer() returned.")
        for each in _as_optimizer_list(optimizer):
            if not hasattr(each, "_amp_stash"):  # first use: not through amp.initialize
                _run_step_without_casts(each)
        return _ScaleLoss(loss, optimizer, self._default_scaler, clear_cache=self._clear_cache)

    def wrap_optimizer(self, optimizer, num_loss=1):
        """Wrap ``optimizer`` in the legacy :class:`OptimWrapper` (one dynamic scaler per loss).

        Afterwards use ``optimizer.scale_loss(loss)`` instead of ``handle.scale_loss``.

        Args:
            optimizer (torch.optim.Optimizer): the optimizer to wrap.
            num_loss (int, optional, default=1): backward passes per ``step()``.
        """
        self._default_scaler = None
        return OptimWrapper(optimizer, self, num_loss)

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

    def wrap_optimizer(self, optimizer, num_loss=1):
        return OptimWrapper(optimizer, self, num_loss)

    def scale_loss(self, loss, optimizer):
        return contextlib.nullcontext(loss)

    def _clear_cache(self):
        pass

    def _deactivate(self):
        pass

    def __repr__(self):
        return "NoOpHandle()"


def _run_step_without_casts(optimizer):
    """Make ``optimizer.step`` run with O1 casts disabled (whichever handle is current then)."""
    step = optimizer.step

    def step_without_casts(*args, **kwargs):
        handle = _amp_state.handle
        casts_off = handle._disable_casts() if handle is not None else contextlib.nullcontext()
        with casts_off:
            return step(*args, **kwargs)

    optimizer.step = step_without_casts


class OptimWrapper:
    """The 2018 optimizer wrapper returned by ``handle.wrap_optimizer`` (apex's ``amp.opt``).

    Each of the ``num_loss`` backward passes between two ``step()`` calls has its own dynamic
    loss scaler, in call order. After each ``scale_loss`` block the gradients are unscaled and
    added to those of the earlier losses; ``step()`` is skipped if any of them overflowed.
    Everything else is forwarded to the wrapped optimizer.

    Example::

        >>> amp_handle = amp.init()
        >>> optimizer = amp_handle.wrap_optimizer(optimizer, num_loss=2)
        >>> for loss in (loss_a, loss_b):
        ...     with optimizer.scale_loss(loss) as scaled_loss:
        ...         scaled_loss.backward()
        >>> optimizer.step()

    Args:
        optimizer (torch.optim.Optimizer): the optimizer to wrap.
        amp_handle (AmpHandle or NoOpHandle): the handle from ``amp.init()``.
        num_loss (int): backward passes per ``step()``.
    """

    def __init__(self, optimizer, amp_handle, num_loss):
        self._optimizer = optimizer
        self._amp_handle = amp_handle
        self._num_loss = num_loss
        self._loss_idx = 0
        self._skip_next = [False] * num_loss
        self._loss_scaler = [LossScaler("dynamic") for _ in range(num_loss)]

    @contextlib.contextmanager
    def scale_loss(self, loss):
        """Yield ``loss`` times the current loss's scale; unscale and accumulate at exit."""
        if not self._amp_handle.is_active():
            yield loss
            return
        if self._loss_idx >= self._num_loss:
            raise RuntimeError(
                f"scale_loss() was called {self._loss_idx + 1} times since the last step(), but "
                f"the optimizer was wrapped with num_loss={self._num_loss}. Pass the number of "
                f"backward passes per step: handle.wrap_optimizer(optimizer, "
                f"num_loss={self._loss_idx + 1}).")
        scaler = self._loss_scaler[self._loss_idx]
        params = [param for group in self._optimizer.param_groups for param in group["params"]]
        stash = [None] * len(params)
        _stash_grads(params, stash)  # grads of earlier losses are already unscaled
        with self._amp_handle._disable_casts():  # backward runs outside autocast
            yield loss.float() * scaler.loss_scale()
        scaler.clear_overflow_state()
        _unscale_and_restore_stash(scaler, params, stash)
        self._skip_next[self._loss_idx] = scaler.update_scale()
        self._loss_idx += 1

    def step(self, closure=None):
        """Step the wrapped optimizer with casts disabled, unless a loss overflowed since the last step."""
        if not self._amp_handle.is_active():
            return self._optimizer.step(closure=closure)
        self._loss_idx = 0
        if closure is not None:
            raise NotImplementedError(
                "The `closure` argument is unsupported by the amp optimizer wrapper.")
        if any(self._skip_next):
            maybe_print("Gradient overflow, skipping update")
            self._skip_next = [False] * self._num_loss
            return None
        with self._amp_handle._disable_casts():
            return self._optimizer.step()

    def state_dict(self):
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict):
        return self._optimizer.load_state_dict(state_dict)

    def zero_grad(self, *args, **kwargs):
        return self._optimizer.zero_grad(*args, **kwargs)

    def add_param_group(self, param_group):
        return self._optimizer.add_param_group(param_group)

    def __getattr__(self, name):
        if name == "_optimizer":  # not set yet (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __repr__(self):
        return f"OptimWrapper({self._optimizer!r}, num_loss={self._num_loss})"
