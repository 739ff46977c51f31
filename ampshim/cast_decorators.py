"""apex's cast decorators (``half_function``, ``float_function``, ``promote_function``) and
``disable_casts``: the user's own functions under O1's casts, and blocks taken out of them.

The decorators work whenever they are applied (typically at import, before ``initialize``): the
casts are decided at each call, from the O1 handle active then (:mod:`ampshim.casting` casts the
arguments as the lists' wrappers do).
"""
from __future__ import annotations

import contextlib
import functools

import torch

from ampshim.casting import _cast_for
from ampshim.deprecation import warn_deprecated
from ampshim.state import _amp_state

__all__ = ["half_function", "float_function", "promote_function", "disable_casts"]


# --- decorators -----------------------------------------------------------------------------

def _active_handle():
    """The O1 handle if casts are on right now (not inside ``disable_casts``), else None."""
    handle = _amp_state.handle
    if handle is None or not handle.is_active():
        return None
    if not torch.is_autocast_enabled(handle.device_type):
        return None
    return handle


def _cast_decorator(fn, policy):
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(_cast_decorator(fn.__func__, policy))
    if not callable(fn):
        raise TypeError(
            f"amp.{policy}_function expects a function to wrap, got {fn!r}. Use it as a "
            f"decorator (@amp.{policy}_function) or call it on a function.")

    @functools.wraps(fn)
    def run_with_casts(*args, **kwargs):
        handle = _active_handle()
        if handle is not None:
            # Like apex, the function's own ops stay under O1's casts (autocast is left on).
            args, kwargs = _cast_for(policy, args, kwargs, handle.dtype, handle.device_type)
        return fn(*args, **kwargs)

    return run_with_casts


# What native PyTorch offers instead of each decorator.
_NATIVE_DECORATOR = {
    "half": "@torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float16)",
    "float": "@torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float32)",
    "promote": "torch.autocast, which promotes mixed-precision inputs itself",
}


def _decorator_deprecation(policy):
    warn_deprecated(f"apex.amp.{policy}_function", _NATIVE_DECORATOR[policy],
                    rewritten=policy != "promote")


def half_function(fn):
    """Decorator: cast floating arguments to half precision while O1 casts are active.

    Usable before or after ``amp.initialize`` (typically at import); without an active O1 handle
    the function is called unchanged. Works on plain callables and on autograd.Function
    staticmethods.

    Example::

        >>> class MyFn(torch.autograd.Function):
        ...     @staticmethod
        ...     @amp.half_function
        ...     def forward(ctx, x, weight):
        ...         return x @ weight
        >>> nms = amp.float_function(_C.nms)

    Args:
        fn (callable): the function to wrap.
    """
    _decorator_deprecation("half")
    return _cast_decorator(fn, "half")


def float_function(fn):
    """Decorator: cast floating arguments to float32 while O1 casts are active.

    Example::

        >>> nms = amp.float_function(torchvision_ops.nms)

    Args:
        fn (callable): the function to wrap.
    """
    _decorator_deprecation("float")
    return _cast_decorator(fn, "float")


def promote_function(fn):
    """Decorator: promote mixed floating arguments to the widest type while O1 casts are active.

    Example::

        >>> @amp.promote_function
        ... def blend(a, b):
        ...     return a * 0.5 + b * 0.5

    Args:
        fn (callable): the function to wrap.
    """
    _decorator_deprecation("promote")
    return _cast_decorator(fn, "promote")


# --- disable_casts --------------------------------------------------------------------------

@contextlib.contextmanager
def disable_casts():
    """Context manager: run the block without O1's casts (native autocast off), then restore them.

    Example::

        >>> with amp.disable_casts():
        ...     loss = criterion(output.float(), target)

    apex raised AttributeError when no O1 handle existed; ampshim raises a RuntimeError that says
    what to call instead.
    """
    handle = _amp_state.handle
    if handle is None:
        raise RuntimeError(
            "amp.disable_casts() was used, but O1 casts were never set up in this process. "
            "They exist after amp.initialize(model, optimizer, opt_level='O1') or amp.init(); "
            "call one of them first, or remove the disable_casts() block.")
    with handle._disable_casts():
        yield
