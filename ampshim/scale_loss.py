"""``amp.scale_loss``: the context manager around ``backward()`` (apex's semantics).

On entry the gradients accumulated so far are stashed and the loss is scaled; on exit the fresh
gradients are unscaled and added to the stash, the loss scale is updated, and on overflow the
next ``step()`` of each optimizer given to THIS call is skipped once.

Internal entry point for other front ends (the legacy ``amp.init()`` handle)::

    _ScaleLoss(loss, optimizers, scaler, *, loss_id=0, delay_unscale=False,
               delay_overflow_check=False, master_weights=False, clear_cache=None)

works without ``amp.initialize``: optimizers not processed yet are equipped on first use
(without master weights); ``clear_cache`` is a callable run at exit (e.g. the O1 handle's
``_clear_cache``). Both classes are real context managers: ``__enter__`` returns the scaled loss
and ``__exit__`` returns False, so manual ``__enter__()`` / ``__exit__(None, None, None)`` works.
"""
from __future__ import annotations

import contextlib

import torch

from ampshim.optimizer import _process_optimizer, _restore_stashed_grads, _skip_next_step
from ampshim.opt_levels import Properties
from ampshim.scaler import checked_count
from ampshim.state import _amp_state

__all__ = ["scale_loss"]

_NOT_INITIALIZED = (
    "Invoked 'with amp.scale_loss`, but internal Amp state has not been initialized. "
    "model, optimizer = amp.initialize(model, optimizer, opt_level=...) must be called "
    "before `with amp.scale_loss`.")


class scale_loss:  # noqa: N801 - apex's name, used as `with amp.scale_loss(...)`
    """Scale the loss for ``backward()``; unscale and check the gradients when the block ends.

    * entering yields ``loss.float() * loss_scale`` (a real fp32 tensor: ``backward(gradient)``
      works; the raw ``loss`` when amp is disabled);
    * leaving unscales the gradients of the given optimizers, adding them to any gradients
      accumulated before the block, and updates the loss scale;
    * on overflow the next ``step()`` of each optimizer passed to this call is skipped and a
      message is printed.

    Example::

        model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = criterion(model(inputs), targets)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()

    .. warning::
        With a dynamic loss scale, leaving the block reads the overflow flag from the device:
        one host synchronisation per non-delayed block.

    Args:
        loss (Tensor): the loss to backpropagate (non-scalar losses work too).
        optimizers (Optimizer or list of Optimizer): every optimizer owning parameters that
            receive gradients in this backward.
        loss_id (int, optional, default=0): which loss scaler to use (``num_losses`` of
            ``initialize``).
        model (optional, default=None): unused, kept for apex's signature.
        delay_unscale (bool, optional, default=False): leave the gradients scaled (gradient
            accumulation); the next non-delayed block unscales them. Do not call ``step()`` in
            between.
        delay_overflow_check (bool, optional, default=False): unscale, but neither check for
            overflow nor update the scale.
    """

    def __init__(self, loss, optimizers, loss_id=0, model=None, delay_unscale=False,
                 delay_overflow_check=False):
        self._loss = loss
        self._optimizers = optimizers
        self._loss_id = loss_id
        self._delay_unscale = delay_unscale
        self._delay_overflow_check = delay_overflow_check
        self._active = None

    def __enter__(self):
        if not hasattr(_amp_state, "opt_properties"):
            raise RuntimeError(_NOT_INITIALIZED)
        properties = _amp_state.opt_properties
        if not properties.enabled:
            return self._loss
        optimizers = _as_optimizer_list(self._optimizers)
        if properties.master_weights:
            _require_processed(optimizers)
        handle = _amp_state.handle
        self._active = _ScaleLoss(
            self._loss, optimizers, _scaler_for(self._loss_id),
            loss_id=self._loss_id, delay_unscale=self._delay_unscale,
            delay_overflow_check=self._delay_overflow_check,
            master_weights=properties.master_weights,
            clear_cache=handle._clear_cache if properties.patch_torch_functions and handle
            else None)
        return self._active.__enter__()

    def __exit__(self, exc_type, exc_value, traceback):
        active, self._active = self._active, None
        if active is not None:
            active.__exit__(exc_type, exc_value, traceback)
        return False


class _ScaleLoss:
    """One ``scale_loss`` block with an explicit scaler (see the module docstring)."""

    def __init__(self, loss, optimizers, scaler, *, loss_id=0, delay_unscale=False,
                 delay_overflow_check=False, master_weights=False, clear_cache=None):
        self._loss = loss
        self._optimizers = _as_optimizer_list(optimizers)
        self._scaler = scaler
        self._loss_id = loss_id
        self._delay_unscale = delay_unscale
        self._delay_overflow_check = delay_overflow_check
        self._master_weights = master_weights
        self._clear_cache = clear_cache
        self._casts_off = None
        self._short_circuit = False
        self._prepared = []

    def __enter__(self):
        if not isinstance(self._loss, torch.Tensor):
            raise TypeError(
                f"amp.scale_loss expects the loss as a tensor, got {self._loss!r} "
                f"({type(self._loss).__name__}). Pass the tensor the loss function returned, "
                "not loss.item() or a Python number: backward() needs the graph.")
        for optimizer in self._optimizers:
            if not hasattr(optimizer, "_amp_stash"):
                _process_optimizer(optimizer, _WITHOUT_MASTER_WEIGHTS)
        scale = self._scaler.loss_scale()
        # A static scale of 1.0 without master weights (O0/O3 defaults) changes nothing.
        self._short_circuit = (not self._master_weights and not self._scaler.dynamic
                               and scale == 1.0)
        if not self._short_circuit:
            # Stash what was accumulated (unscaled) before this backward. Unlike apex, a delayed
            # pass opening an accumulation window stashes too, so earlier unscaled gradients are
            # not divided by the scale again when the window is unscaled.
            self._prepared = [optimizer for optimizer in self._optimizers
                              if not optimizer._amp_stash.params_have_scaled_gradients]
            for optimizer in self._prepared:
                optimizer._prepare_amp_backward()
        # backward() must run outside autocast; O1 keeps autocast on process-wide.
        self._casts_off = _casts_disabled()
        self._casts_off.__enter__()
        if self._short_circuit:
            return self._loss.float()
        return self._loss.float() * scale

    def __exit__(self, exc_type, exc_value, traceback):
        try:
            if exc_type is not None:
                # e.g. an out-of-memory error the caller skips: grads go back to what they
                # were before the block (apex left them stashed, and lost them).
                for optimizer in self._prepared:
                    _restore_stashed_grads(optimizer)
            elif not self._short_circuit:
                self._unscale_and_update()
        finally:
            casts_off, self._casts_off = self._casts_off, None
            try:
                if casts_off is not None:
                    casts_off.__exit__(None, None, None)
            finally:
                if self._clear_cache is not None:
                    self._clear_cache()
        return False

    def _unscale_and_update(self):
        if self._delay_unscale:
            for optimizer in self._optimizers:
                optimizer._amp_stash.params_have_scaled_gradients = True
            return
        scaler = self._scaler
        scaler.clear_overflow_state()
        for optimizer in self._optimizers:
            optimizer._post_amp_backward(scaler)
            optimizer._amp_stash.params_have_scaled_gradients = False
        should_skip = False if self._delay_overflow_check else scaler.update_scale()
        if should_skip:
            for optimizer in self._optimizers:
                _skip_next_step(optimizer, scaler, self._loss_id)


_WITHOUT_MASTER_WEIGHTS = Properties()


def _scaler_for(loss_id):
    scalers = _amp_state.loss_scalers
    if checked_count(loss_id, "loss_id") >= len(scalers):
        raise IndexError(  # apex's type, with a message
            f"loss_id={loss_id!r} is out of range: amp.initialize(..., num_losses={len(scalers)}) "
            f"made loss scalers 0 to {len(scalers) - 1}. Pass a larger num_losses to "
            "amp.initialize to give this loss its own scaler.")
    return scalers[loss_id]


def _as_optimizer_list(optimizers):
    if hasattr(optimizers, "param_groups"):  # an optimizer, or a wrapper such as LARC
        return [optimizers]
    return list(optimizers)


def _require_processed(optimizers):
    for optimizer in optimizers:
        if not hasattr(optimizer, "_amp_stash"):
            raise RuntimeError(
                f"amp.scale_loss got an optimizer that amp.initialize never saw: {optimizer!r}. "
                "With master weights (O2) the optimizer must own amp's fp32 master copies; pass "
                "it to amp.initialize(model, optimizer, ...) and use the returned optimizer.")


def _casts_disabled():
    handle = _amp_state.handle
    if handle is not None and handle.is_active():
        return handle._disable_casts()
    return contextlib.nullcontext()
