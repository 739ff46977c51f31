"""O1 on native autocast: the process-wide autocast switch and the casts the user asked for.

apex's O1 patched torch functions for the whole process. ampshim keeps that scope with native
autocast instead: initialization turns autocast on for the calling thread and leaves it on, so
losses and metrics computed outside the model follow autocast's policies, as they followed apex's.

On CUDA, native autocast already carries a policy for every function in apex's default cast
lists; the shipped entries are left to it (no Python on the default path; the differences are
documented). On the CPU the native lists differ widely from apex's (softmax, sum, pow,
layer_norm and the RNN cells stay in bfloat16, ``nn.LSTM`` fails on float32 inputs), so a
script written for CUDA would run in other precisions than under apex: there apex's lists are
enforced with wrappers wherever the native policy differs (:func:`follows_apex_lists`).
Beyond that, wrappers are installed only where the user asked for something native autocast
does not do: an edited ``amp.lists`` entry, a ``register_*_function`` call. Two apex behaviours
are kept as fidelity patches: ``F.binary_cross_entropy`` (banned for half inputs, usable for
float32 ones) and the error for in-place float32-list functions on half tensors.

apex's decorators for the user's own functions and ``disable_casts`` are in
:mod:`ampshim.cast_decorators`. The handle (:mod:`ampshim.handle`) owns one activation: it calls :func:`_enable_autocast` and
:func:`_install_casts` and undoes both at ``_deactivate()``.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from ampshim.casts_setting import CASTS_ENV_VAR, follows_apex_lists
from ampshim.lists import functional_overrides, tensor_overrides, torch_overrides
from ampshim.lists._native import native_policy

__all__ = [
    "follows_apex_lists",
    "CASTS_ENV_VAR",
    "register_half_function",
    "register_float_function",
    "register_promote_function",
]

# List name -> policy. A name in several lists takes the first policy, as apex's innermost
# wrapper (FP16 inside FP32 inside the promotes) decided the final cast.
_LIST_POLICIES = (
    ("FP16_FUNCS", "half"),
    ("FP32_FUNCS", "float"),
    ("CASTS", "promote"),
    ("SEQUENCE_CASTS", "promote"),
)
_LIST_MODULES = (functional_overrides, torch_overrides, tensor_overrides)

# register_*_function calls waiting for the next initialization: (owner, name, policy).
_USER_REGISTRY: list[tuple[object, str, str]] = []

# apex ran every recurrent layer and cell in half precision (its RNN patches, not its lists).
# nn.RNN, nn.LSTM, nn.GRU and the cells all call these functions of torch._VF.
_APEX_HALF_RNN_FUNCTIONS = (
    "rnn_tanh", "rnn_relu", "lstm", "gru", "rnn_tanh_cell", "rnn_relu_cell", "lstm_cell", "gru_cell",
)

_MISSING = object()


# --- the autocast switch --------------------------------------------------------------------

class _AutocastState(NamedTuple):
    enabled: bool
    dtype: torch.dtype
    cache_enabled: bool


def _enable_autocast(device_type: str, dtype: torch.dtype) -> _AutocastState:
    """Turn autocast on for ``device_type`` in this thread; return the state to restore later."""
    saved = _AutocastState(
        torch.is_autocast_enabled(device_type),
        torch.get_autocast_dtype(device_type),
        torch.is_autocast_cache_enabled(),
    )
    torch.set_autocast_dtype(device_type, dtype)
    torch.set_autocast_enabled(device_type, True)
    # The weight-cast cache stays off while O1 is active. It lives until the outermost autocast
    # exits, which here is "never": a cached cast would outlive optimizer.step(),
    # load_state_dict() and in-place edits, and one made under no_grad has no grad_fn and would
    # silently stop gradients later. Ordinary models use each weight once per forward, so the
    # cache saves nothing measurable. A weight reused many times per forward (an RNN cell stepped
    # in a Python loop) is recast on each use; a nested `torch.autocast(..., cache_enabled=True)`
    # around such a loop caches within it and clears on exit, because O1 does not count itself
    # in autocast's nesting depth.
    torch.set_autocast_cache_enabled(False)
    torch.clear_autocast_cache()
    return saved


def _restore_autocast(device_type: str, saved: _AutocastState) -> None:
    torch.clear_autocast_cache()
    torch.set_autocast_enabled(device_type, saved.enabled)
    torch.set_autocast_dtype(device_type, saved.dtype)
    torch.set_autocast_cache_enabled(saved.cache_enabled)


def _call_without_autocast(fn, device_type, args, kwargs):
    torch.set_autocast_enabled(device_type, False)
    try:
        return fn(*args, **kwargs)
    finally:
        torch.set_autocast_enabled(device_type, True)


# --- casting arguments ----------------------------------------------------------------------

def _castable(value, device_type) -> bool:
    # float64 is left alone, as native autocast leaves it.
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype is not torch.float64
        and value.device.type == device_type
    )


def _cast(value, dtype, device_type):
    """``value`` with its castable tensors (also inside plain lists and tuples) cast to ``dtype``."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if _castable(value, device_type) and value.dtype != dtype else value
    if type(value) in (list, tuple):
        return type(value)(_cast(item, dtype, device_type) for item in value)
    return value


def _cast_all(args, kwargs, dtype, device_type):
    args = _cast(args, dtype, device_type)
    kwargs = {key: _cast(item, dtype, device_type) for key, item in kwargs.items()}
    return args, kwargs


def _floating_dtypes(value, device_type, found: set) -> set:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.device.type == device_type:
            found.add(value.dtype)
    elif type(value) in (list, tuple):
        for item in value:
            _floating_dtypes(item, device_type, found)
    elif type(value) is dict:
        for item in value.values():
            _floating_dtypes(item, device_type, found)
    return found


def _widest_dtype(args, kwargs, device_type):
    """The promoted dtype of mixed floating arguments, or None when they already agree."""
    dtypes = _floating_dtypes((args, kwargs), device_type, set())
    if len(dtypes) < 2:
        return None
    return functools.reduce(torch.promote_types, dtypes)


def _has_dtype(args, kwargs, dtype, device_type) -> bool:
    return dtype in _floating_dtypes((args, kwargs), device_type, set())


def _cast_for(policy, args, kwargs, dtype, device_type):
    """Apply ``policy`` ("half", "float", "promote" or None) to a call's arguments."""
    if policy == "half":
        return _cast_all(args, kwargs, dtype, device_type)
    if policy == "float":
        return _cast_all(args, kwargs, torch.float32, device_type)
    if policy == "promote":
        widest = _widest_dtype(args, kwargs, device_type)
        if widest is not None:
            return _cast_all(args, kwargs, widest, device_type)
    return args, kwargs


def _short_name(dtype) -> str:
    return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, str(dtype))


# --- wrappers installed at initialization ---------------------------------------------------

def _policy_wrapper(fn, policy, device_type, dtype):
    """Run ``fn`` with its arguments cast per ``policy`` and autocast off inside.

    ``policy=None`` (the name was taken out of every list) runs ``fn`` in its input dtypes.
    Outside autocast (``disable_casts``, a user's ``autocast(enabled=False)``) it is a plain call.
    """

    @functools.wraps(fn)
    def run_with_policy(*args, **kwargs):
        if not torch.is_autocast_enabled(device_type):
            return fn(*args, **kwargs)
        args, kwargs = _cast_for(policy, args, kwargs, dtype, device_type)
        return _call_without_autocast(fn, device_type, args, kwargs)

    return run_with_policy


def _banned_wrapper(fn, message, device_type, dtype, allow_banned):
    """apex's banned function: NotImplementedError for half inputs, float32 inputs just work."""

    @functools.wraps(fn)
    def run_banned(*args, **kwargs):
        if not torch.is_autocast_enabled(device_type):
            return fn(*args, **kwargs)
        if _has_dtype(args, kwargs, dtype, device_type):
            if not allow_banned:
                raise NotImplementedError(message)
            args, kwargs = _cast_all(args, kwargs, torch.float32, device_type)
        return _call_without_autocast(fn, device_type, args, kwargs)

    return run_banned


def _inplace_guard(fn, message, device_type, dtype, self_only):
    """Refuse an in-place float32-list function on half tensors, as apex did.

    Costs one Python call (about 0.3 us for methods) per call of a guarded in-place function,
    and nothing for any other op.
    """
    if self_only:
        @functools.wraps(fn)
        def run_inplace_method(self, *args, **kwargs):
            if (self.dtype is dtype and torch.is_autocast_enabled(device_type)
                    and self.device.type == device_type):
                raise NotImplementedError(message)
            return fn(self, *args, **kwargs)

        return run_inplace_method

    @functools.wraps(fn)
    def run_inplace(*args, **kwargs):
        if torch.is_autocast_enabled(device_type) and _has_dtype(args, kwargs, dtype, device_type):
            raise NotImplementedError(message)
        return fn(*args, **kwargs)

    return run_inplace


class _Patch(NamedTuple):
    owner: object
    name: str
    saved: object  # the owner's own attribute before patching, or _MISSING if it was inherited


def _install(owner, name, make_wrapper, patches: list) -> None:
    saved = vars(owner).get(name, _MISSING)
    original = getattr(owner, name)
    if isinstance(saved, staticmethod):
        wrapper = staticmethod(make_wrapper(saved.__func__))
    else:
        wrapper = make_wrapper(original)
    setattr(owner, name, wrapper)
    patches.append(_Patch(owner, name, saved))


def _remove_casts(patches: list) -> None:
    """Undo :func:`_install_casts`, newest first."""
    while patches:
        patch = patches.pop()
        if patch.saved is _MISSING:
            delattr(patch.owner, patch.name)
        else:
            setattr(patch.owner, patch.name, patch.saved)


def _list_policies(lists: dict) -> dict:
    """name -> policy for one list module's lists (current or default)."""
    policies = {}
    for list_name, policy in _LIST_POLICIES:
        for name in lists.get(list_name, ()):
            policies.setdefault(name, policy)
    for name, _message in lists.get("BANNED_FUNCS", ()):
        policies.setdefault(name, "banned")
    return policies


def _current_lists(lists_module) -> dict:
    names = [name for name, _policy in _LIST_POLICIES] + ["BANNED_FUNCS"]
    return {name: getattr(lists_module, name) for name in names if hasattr(lists_module, name)}


def _is_inplace(name: str) -> bool:
    # A cast wrapper would write into a copy; native autocast leaves in-place ops alone.
    return (name.endswith("_") and not name.endswith("__")) or name.startswith("__i")


def _planned_policies(device_type, registrations, apex_lists=False) -> dict:
    """(owner, name) -> policy for every function that needs a wrapper.

    ``apex_lists``: the default entries are planned too (see :func:`follows_apex_lists`).
    """
    planned = {}
    known_owners = set()
    for lists_module in _LIST_MODULES:
        owner = lists_module.MODULE
        known_owners.add(owner)
        current = _list_policies(_current_lists(lists_module))
        default = _list_policies(lists_module._DEFAULTS)
        for name in current.keys() | default.keys():
            policy = current.get(name)
            edited = policy != default.get(name)
            if edited or policy == "banned" or (apex_lists and not _is_inplace(name)):
                planned[(owner, name)] = policy
    if apex_lists:
        for name in _APEX_HALF_RNN_FUNCTIONS:
            planned[(torch._VF, name)] = "half"
    for owner, name, policy in registrations:  # a registration wins over a list entry
        planned[(owner, name)] = policy
    return {
        (owner, name): policy
        for (owner, name), policy in planned.items()
        if hasattr(owner, name)
        and (
            policy == "banned"
            or owner not in known_owners
            or policy != native_policy(device_type, name)
        )
    }


def _banned_messages() -> dict:
    return dict(getattr(functional_overrides, "BANNED_FUNCS", ()))


def _install_casts(device_type, dtype, allow_banned=False, registrations=(), apex_lists=False,
                   verbose=False):
    """Install the wrappers O1 needs on top of native autocast; return the patches to undo.

    ``apex_lists``: enforce apex's default lists too (see :func:`follows_apex_lists`).
    """
    patches: list = []
    messages = _banned_messages()
    planned = _planned_policies(device_type, registrations, apex_lists)
    for (owner, name), policy in sorted(planned.items(), key=lambda item: item[0][1]):
        if policy == "banned":
            message = messages.get(name, f"{name} is banned under amp O1 for half inputs.")
            make = functools.partial(
                _banned_wrapper, message=message, device_type=device_type, dtype=dtype,
                allow_banned=allow_banned)
        else:
            make = functools.partial(
                _policy_wrapper, policy=policy, device_type=device_type, dtype=dtype)
        _install(owner, name, make, patches)
        if verbose:
            print(f"amp O1: {_owner_name(owner)}.{name} -> {policy or 'input dtype'}")

    hint = "; use the out-of-place form, or cast the tensor to float32 first"
    for name in torch_overrides.FP32_FUNCS:
        if hasattr(torch, name + "_"):
            message = (f"Cannot call in-place function {name}_ with {_short_name(dtype)} "
                       f"arguments{hint}.")
            _install(torch, name + "_", functools.partial(
                _inplace_guard, message=message, device_type=device_type, dtype=dtype,
                self_only=False), patches)
    for name in tensor_overrides.FP32_FUNCS:
        if hasattr(torch.Tensor, name + "_"):
            message = (f"Cannot call in-place method {name}_ on {_short_name(dtype)} "
                       f"Tensors{hint}.")
            _install(torch.Tensor, name + "_", functools.partial(
                _inplace_guard, message=message, device_type=device_type, dtype=dtype,
                self_only=True), patches)
    return patches


def _owner_name(owner) -> str:
    return {torch: "torch", torch.nn.functional: "F", torch.Tensor: "Tensor", torch._VF: "_VF"}.get(
        owner, getattr(owner, "__name__", repr(owner)))


# --- registration ---------------------------------------------------------------------------

def _register(module, name, policy):
    if not hasattr(module, name):
        raise ValueError(f"No function named {name} in module {module}.")
    _USER_REGISTRY.append((module, name, policy))


def _take_registrations() -> list:
    """Hand the pending registrations to an initialization, which consumes them."""
    taken = list(_USER_REGISTRY)
    _USER_REGISTRY.clear()
    return taken


def register_half_function(module, name):
    """Run ``module.<name>`` in half precision under O1 (float16 on CUDA, bfloat16 on CPU).

    Must be called before ``amp.initialize`` / ``amp.init()``; later calls have no effect, as in
    apex. Floating arguments are cast and the function runs with autocast off inside.

    Example::

        >>> amp.register_half_function(torch, "einsum")
        >>> model, optimizer = amp.initialize(model, optimizer, opt_level="O1")

    Args:
        module (module or class): where the function lives (``torch``, ``torch.nn.functional``...).
        name (str): the attribute name of the function.
    """
    _register(module, name, "half")


def register_float_function(module, name):
    """Run ``module.<name>`` in float32 under O1. Call it before ``amp.initialize``.

    Example::

        >>> amp.register_float_function(torch, "sigmoid")

    Args:
        module (module or class): where the function lives.
        name (str): the attribute name of the function.
    """
    _register(module, name, "float")


def register_promote_function(module, name):
    """Under O1, promote mixed floating arguments of ``module.<name>`` to the widest type.

    Call it before ``amp.initialize``.

    Example::

        >>> amp.register_promote_function(torch, "where")

    Args:
        module (module or class): where the function lives.
        name (str): the attribute name of the function.
    """
    _register(module, name, "promote")
