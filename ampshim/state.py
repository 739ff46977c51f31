"""The process-wide amp state (``apex.amp._amp_state``) and the functions that read it.

Real scripts poke these names directly, so they keep apex's meaning:
``_amp_state.opt_properties`` (absent until ``amp.initialize`` runs),
``loss_scalers[i]._loss_scale`` and ``._unskipped``, ``verbosity``,
``allow_incoming_model_not_fp32``, ``hard_override``, ``handle`` (the O1 handle, None without
one), ``min_loss_scale`` / ``max_loss_scale``.

This module is also served as ``apex.amp._amp_state``. In apex that name resolved to the state
OBJECT, so attribute reads and writes on this module are forwarded to ``_amp_state``
(``apex.amp._amp_state.loss_scalers`` works whichever way it was reached).
"""
from __future__ import annotations

import sys
import types
from collections import OrderedDict
from collections.abc import Mapping

import torch

from ampshim.scaler import checked_count, checked_scale

__all__ = ["AmpState", "_amp_state", "maybe_print", "master_params", "state_dict",
           "load_state_dict"]


class AmpState:
    """Holder of the settings and loss scalers that ``amp.initialize`` creates."""

    def __init__(self):
        self.hard_override = False
        self.allow_incoming_model_not_fp32 = False
        self.verbosity = 1
        self.handle = None


_amp_state = AmpState()


def maybe_print(msg, rank0=False):
    """Print ``msg`` if ``verbosity > 0``; with ``rank0=True`` only on rank 0 of a process group."""
    if _amp_state.verbosity <= 0:
        return
    if rank0 and _is_distributed() and torch.distributed.get_rank() != 0:
        return
    print(msg)


def _is_distributed() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def master_params(optimizer):
    """Yield the parameters the optimizer updates: the fp32 masters under O2.

    Use it to clip gradients after the ``scale_loss`` block, where they are already unscaled.
    Under O2 the masters exist after the first backward (or ``zero_grad``); before that this
    yields the model's half-precision parameters, as apex did.

    Example::

        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), max_norm=1.0)
        optimizer.step()

    Args:
        optimizer (torch.optim.Optimizer): an optimizer returned by ``amp.initialize``
            (anything with ``param_groups``, e.g. LARC, works too).
    """
    for group in optimizer.param_groups:
        for param in group["params"]:
            yield param


def _loss_scalers():
    try:
        return _amp_state.loss_scalers
    except AttributeError:
        raise AttributeError(
            "amp has no loss scalers yet: amp.initialize(...) with enabled=True has not run in "
            "this process. Call amp.initialize(model, optimizer, opt_level=...) before "
            "amp.state_dict() or amp.load_state_dict().") from None


def state_dict(destination=None):
    """Return the loss-scaler state in apex's format.

    ``{'loss_scaler0': {'loss_scale': 65536.0, 'unskipped': 0}, ...}``, one entry per loss
    scaler, holding only Python scalars (it loads with ``torch.load(weights_only=True)``).

    Example::

        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "amp": amp.state_dict()}, path)

    Args:
        destination (dict, optional, default=None): filled and returned; a new ``OrderedDict``
            if None.
    """
    if destination is None:
        destination = OrderedDict()
    for index, scaler in enumerate(_loss_scalers()):
        destination["loss_scaler%d" % index] = {
            "loss_scale": float(scaler.loss_scale()),
            "unskipped": int(scaler._unskipped),
        }
    return destination


def load_state_dict(state_dict):
    """Restore loss scalers from :func:`state_dict` output (apex's or ampshim's).

    Entries are matched to scalers by ORDER, not by the number in their key, as apex did. Call it
    after ``amp.initialize`` with the same ``num_losses``. Every value is checked before any
    scaler changes: a scale that is not a positive, finite number (NaN, 0, a string, None, a
    tensor of several values) is an error naming its key. A ``torch.amp.GradScaler`` state
    (what a migrated script saves) is loaded into every scaler.

    Example::

        model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
        checkpoint = torch.load(path)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        amp.load_state_dict(checkpoint["amp"])

    Args:
        state_dict (dict): ``{'loss_scalerN': {'loss_scale': float, 'unskipped': int}, ...}``,
            or ``GradScaler.state_dict()``.
    """
    scalers = _loss_scalers()
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"amp.load_state_dict expects the dict amp.state_dict() returned, got "
                        f"{state_dict!r}.")
    if _GRAD_SCALER_KEYS <= set(state_dict):
        _load_grad_scaler_state(state_dict, scalers)
        return
    if len(state_dict) != len(scalers):
        print("Warning: state_dict contains {} entries, while {} loss_scalers are used".format(
            len(state_dict), len(scalers)))
    unexpected_keys = [key for key in state_dict if "loss_scaler" not in key]
    if unexpected_keys:
        raise RuntimeError(
            "Error(s) in loading state_dict. Unexpected key(s) in state_dict: {}. ".format(
                ", ".join('"{}"'.format(key) for key in unexpected_keys)))
    loaded = []
    for key in state_dict:
        if len(loaded) >= len(scalers):
            print("Skipping loss_scaler[{}], since num_losses was set to {}".format(
                len(loaded), len(scalers)))
            break
        loaded.append(_checked_entry(state_dict[key], key))
    for scaler, (scale, unskipped) in zip(scalers, loaded):
        scaler._loss_scale, scaler._unskipped = scale, unskipped


# What torch.amp.GradScaler.state_dict() holds (an enabled scaler).
_GRAD_SCALER_KEYS = {"scale", "growth_factor", "backoff_factor", "growth_interval",
                     "_growth_tracker"}


def _checked_entry(entry, key):
    if not isinstance(entry, Mapping):
        raise TypeError(f"{key} must be a dict {{'loss_scale': float, 'unskipped': int}}, got "
                        f"{entry!r}.")
    for field in ("loss_scale", "unskipped"):
        if field not in entry:
            raise ValueError(f"{key} has no {field!r}: {entry!r}. Pass what amp.state_dict() "
                             "returned.")
    return (checked_scale(entry["loss_scale"], f"{key}.loss_scale"),
            checked_count(entry["unskipped"], f"{key}.unskipped"))


def _load_grad_scaler_state(state, scalers):
    """A GradScaler's scale and growth counter, into each amp scaler (same rule: x2 / x0.5)."""
    if state["growth_factor"] != 2.0 or state["backoff_factor"] != 0.5:
        raise ValueError(
            "This is a torch.amp.GradScaler state with growth_factor="
            f"{state['growth_factor']!r} and backoff_factor={state['backoff_factor']!r}; amp's "
            "loss scaler can only double and halve. Keep training with torch.amp.GradScaler "
            "(ampmigrate rewrites the script to use it) and load it with "
            "scaler.load_state_dict(...).")
    scale = checked_scale(state["scale"], "scale")
    unskipped = checked_count(state["_growth_tracker"], "_growth_tracker")
    window = checked_count(state["growth_interval"], "growth_interval", minimum=1)
    for scaler in scalers:
        scaler._loss_scale, scaler._unskipped, scaler._scale_seq_len = scale, unskipped, window


class _StateModule(types.ModuleType):
    """Forwards attribute access this module lacks to the ``_amp_state`` object."""

    def __getattr__(self, name):
        try:
            return getattr(_amp_state, name)
        except AttributeError:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}") from None

    def __setattr__(self, name, value):
        if name in self.__dict__ or name.startswith("__"):
            super().__setattr__(name, value)
        else:
            setattr(_amp_state, name, value)


sys.modules[__name__].__class__ = _StateModule
