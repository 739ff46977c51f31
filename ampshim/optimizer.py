"""How ``amp.initialize`` equips an optimizer (``apex.amp._process_optimizer``).

Every processed optimizer gets ``optimizer._amp_stash`` and the methods ``scale_loss`` drives:

* ``_prepare_amp_backward()`` before a backward pass stashes the gradients accumulated so far and
  clears ``.grad``, so the backward writes only fresh, scaled gradients;
* ``_post_amp_backward(scaler)`` after it unscales the fresh gradients and adds the stash back,
  so the optimizer always sees unscaled, correctly accumulated gradients, even when successive
  backward passes used different loss scales;
* ``_amp_lazy_init()`` sorts the parameters (and, with master weights, creates the masters) the
  first time any of the above, ``zero_grad``, ``add_param_group`` (or, with master weights,
  ``step`` or ``load_state_dict``) runs;
* ``step()`` is wrapped once: after an overflow, ``scale_loss`` sets
  ``_amp_stash.already_patched`` and the next ``step()`` only reports the skip.

With master weights (O2) every half-precision parameter is replaced IN ``param_group['params']``
by an fp32 master; ``step()`` updates the masters and copies them back into the model with one
fused ``torch._foreach_copy_`` per (device, dtype) group.

Half precision means float16 or bfloat16 on any device (apex required CUDA float16).
Deliberate deviations: the patched ``zero_grad`` accepts ``set_to_none=`` (apex's took no argument
and raised TypeError; without it, gradients are zeroed in place as apex did); with master weights,
optimizer state loaded or already present is kept in fp32 instead of passing through half
precision; the overflow skip is a flag, not a swapped-in ``step`` (wrappers added to ``step``
later, such as an LR scheduler's, keep working).
"""
from __future__ import annotations

import types

import torch

from ampshim.scaler import _grouped_copy_, _groups
from ampshim.state import maybe_print

__all__ = ["AmpOptimizerState", "_process_optimizer", "_skip_next_step"]

_HALF_DTYPES = (torch.float16, torch.bfloat16)

_AMP_METHODS = ("_lazy_init_maybe_master_weights", "_master_params_to_model_params",
                "_prepare_amp_backward", "_post_amp_backward", "_amp_lazy_init")

_CLOSURE_ERROR = "Currently, Amp does not support closure use with optimizers."


class AmpOptimizerState:
    """``optimizer._amp_stash``: flags, parameter lists and gradient stashes of one optimizer.

    ``already_patched`` (apex's name) is True while the next ``step()`` is to be skipped after an
    overflow; ``skip_reason`` then holds the ``(scaler, loss_id)`` that overflowed.
    """

    def __init__(self):
        self.lazy_init_called = False
        self.already_patched = False
        self.skip_reason = None
        self.params_have_scaled_gradients = False


def _process_optimizer(optimizer, properties):
    """Attach amp's stash and methods to ``optimizer`` (apex's ``_process_optimizer``).

    Args:
        optimizer: a ``torch.optim.Optimizer`` or a wrapper with ``param_groups`` and ``step``
            (e.g. LARC).
        properties: the options of ``amp.initialize``; only ``master_weights`` is read.
    """
    if hasattr(optimizer, "_amp_stash"):
        raise RuntimeError("A given optimizer should only be passed through amp.initialize once.")
    for name in _AMP_METHODS:
        if hasattr(optimizer, name):
            raise RuntimeError("Incoming optimizer already has {} defined.".format(name))
    optimizer._amp_stash = AmpOptimizerState()

    def bind(function, name):
        setattr(optimizer, name, types.MethodType(function, optimizer))

    if properties.master_weights:
        bind(_lazy_init_with_master_weights, "_lazy_init_maybe_master_weights")
        bind(_master_params_to_model_params, "_master_params_to_model_params")
        bind(_prepare_backward_with_master_weights, "_prepare_amp_backward")
        bind(_post_backward_with_master_weights, "_post_amp_backward")
        bind(_step_with_master_weights(optimizer.step), "step")
        bind(_zero_grad_with_master_weights, "zero_grad")
        bind(_load_state_dict_into_masters(optimizer.load_state_dict), "load_state_dict")
    else:
        bind(_lazy_init_no_master_weights, "_lazy_init_maybe_master_weights")
        bind(_prepare_backward_no_master_weights, "_prepare_amp_backward")
        bind(_post_backward_no_master_weights, "_post_amp_backward")
    bind(_amp_lazy_init, "_amp_lazy_init")
    bind(_add_param_group(optimizer.add_param_group, properties.master_weights),
         "add_param_group")
    bind(_step_unless_skipped(optimizer.step), "step")
    return optimizer


def _skip_next_step(optimizer, scaler, loss_id):
    """Make the next ``optimizer.step()`` a no-op that reports the overflow (apex's skip)."""
    stash = optimizer._amp_stash
    if not stash.already_patched:  # several overflows before a step: one skip
        stash.already_patched = True
        stash.skip_reason = (scaler, loss_id)


def _step_unless_skipped(original_step):
    # apex swapped `step` for a one-shot replacement on overflow; a flag checked by a permanent
    # wrapper behaves the same and survives whatever wraps `step` later (e.g. LR schedulers).
    def step(self, *args, **kwargs):
        stash = self._amp_stash
        if not stash.already_patched:
            return original_step(*args, **kwargs)
        if (args[0] if args else kwargs.get("closure")) is not None:
            raise RuntimeError(_CLOSURE_ERROR)
        scaler, loss_id = stash.skip_reason
        maybe_print("Gradient overflow.  Skipping step, loss scaler {} reducing loss scale to {}"
                    .format(loss_id, scaler.loss_scale()))
        _set_grads_to_none(getattr(stash, "all_fp32_from_fp16_params", ()))
        if hasattr(self, "most_recent_scale"):  # apex's FusedSGD bookkeeping
            self.most_recent_scale = 1.0
            self.scale_set_by_backward = False
        stash.already_patched = False
        stash.skip_reason = None
        return None

    return step


def _amp_lazy_init(self):
    stash = self._amp_stash
    if stash.lazy_init_called:
        return
    stash.lazy_init_called = True  # first: the init itself reloads the optimizer state
    try:
        self._lazy_init_maybe_master_weights()
    except BaseException:
        stash.lazy_init_called = False
        raise


def _type_error(param):
    return TypeError(
        "Optimizer's parameters must be either float32 or half-precision (float16/bfloat16) "
        "tensors. Received {}. Likely cause: a parameter of another dtype (e.g. float64) was "
        "given to the optimizer; convert the model with .float() before amp.initialize."
        .format(param.type()))


def _is_half(tensor):
    return tensor.dtype in _HALF_DTYPES


def _is_float(tensor):
    return tensor.dtype == torch.float32


# ---------------------------------------------------------------- without master weights

def _lazy_init_no_master_weights(self):
    stash = self._amp_stash
    stash.all_fp16_params = []
    stash.all_fp32_params = []
    for group in self.param_groups:
        _sort_params(group["params"], stash)
    stash.all_fp16_grad_stash = [None] * len(stash.all_fp16_params)
    stash.all_fp32_grad_stash = [None] * len(stash.all_fp32_params)


def _sort_params(params, stash):
    for param in params:
        if _is_half(param):
            stash.all_fp16_params.append(param)
        elif _is_float(param):
            stash.all_fp32_params.append(param)
        else:
            raise _type_error(param)


def _prepare_backward_no_master_weights(self):
    stash = self._amp_stash
    self._amp_lazy_init()
    _stash_grads(stash.all_fp16_params, stash.all_fp16_grad_stash)
    _stash_grads(stash.all_fp32_params, stash.all_fp32_grad_stash)


def _post_backward_no_master_weights(self, scaler):
    stash = self._amp_stash
    self._amp_lazy_init()
    _unscale_and_restore_stash(scaler, stash.all_fp16_params + stash.all_fp32_params,
                               stash.all_fp16_grad_stash, stash.all_fp32_grad_stash)


def _restore_stashed_grads(optimizer):
    """Undo ``_prepare_amp_backward``: drop the fresh grads and put the stashed ones back."""
    stash = optimizer._amp_stash
    if hasattr(stash, "all_fp32_from_fp32_params"):  # with master weights
        _set_grads_to_none(stash.all_fp16_params)
        pairs = [(stash.all_fp32_from_fp32_params, stash.all_fp32_from_fp32_grad_stash)]
    else:
        pairs = [(stash.all_fp16_params, stash.all_fp16_grad_stash),
                 (stash.all_fp32_params, stash.all_fp32_grad_stash)]
    for params, grad_stash in pairs:
        for index, param in enumerate(params):
            param.grad = grad_stash[index]
            grad_stash[index] = None


def _stash_grads(params, grad_stash):
    for index, param in enumerate(params):
        grad_stash[index] = param.grad
        param.grad = None


def _unscale_and_restore_stash(scaler, params, *grad_stashes):
    """Unscale the fresh grads of ``params`` in place and add their stashed grads back.

    ``grad_stashes`` are consecutive slices of one stash aligned with ``params``; they are
    cleared afterwards.
    """
    stashed = [grad for grad_stash in grad_stashes for grad in grad_stash]
    fresh, accumulate, accumulated = [], [], []
    for param, stashed_grad in zip(params, stashed):
        if param.grad is None:
            if stashed_grad is not None:
                param.grad = stashed_grad
        elif stashed_grad is None:
            fresh.append(param.grad)
        else:
            accumulate.append(param.grad)
            accumulated.append(stashed_grad)
    if fresh:
        scaler.unscale(fresh, fresh, scaler.loss_scale(), models_are_masters=True)
    if accumulate:
        scaler.unscale_with_stashed(accumulate, accumulated, accumulate)
    for grad_stash in grad_stashes:
        grad_stash[:] = [None] * len(grad_stash)


# ---------------------------------------------------------------- with master weights

def _lazy_init_with_master_weights(self):
    stash = self._amp_stash
    stash.fp16_groups, stash.fp32_from_fp16_groups, stash.fp32_from_fp32_groups = [], [], []
    stash.all_fp16_params, stash.all_fp32_from_fp16_params = [], []
    stash.all_fp32_from_fp32_params = []
    for group in self.param_groups:
        _install_masters(self, group["params"], stash)
    stash.all_fp32_from_fp32_grad_stash = [None] * len(stash.all_fp32_from_fp32_params)
    # Recast any existing per-parameter state (e.g. momentum) to the fp32 masters' dtype.
    self.load_state_dict(self.state_dict())


def _install_masters(optimizer, params, stash):
    """Replace each trainable half param in ``params`` (a group's list) by an fp32 master."""
    halves, masters, floats = [], [], []
    for index, param in enumerate(params):
        if not param.requires_grad:
            continue
        if _is_half(param):
            master = param.detach().clone().float().requires_grad_()
            params[index] = master
            if param in optimizer.state:
                optimizer.state[master] = optimizer.state.pop(param)
            halves.append(param)
            masters.append(master)
        elif _is_float(param):
            floats.append(param)
        else:
            raise _type_error(param)
    stash.fp16_groups.append(halves)
    stash.fp32_from_fp16_groups.append(masters)
    stash.fp32_from_fp32_groups.append(floats)
    stash.all_fp16_params += halves
    stash.all_fp32_from_fp16_params += masters
    stash.all_fp32_from_fp32_params += floats
    return floats


def _master_params_to_model_params(self):
    stash = self._amp_stash
    if stash.all_fp16_params:
        with torch.no_grad():
            _grouped_copy_(stash.all_fp16_params, stash.all_fp32_from_fp16_params)


def _prepare_backward_with_master_weights(self):
    stash = self._amp_stash
    self._amp_lazy_init()
    for param in stash.all_fp16_params:
        param.grad = None  # the masters hold the accumulated grads; these get fresh ones
    _stash_grads(stash.all_fp32_from_fp32_params, stash.all_fp32_from_fp32_grad_stash)


def _post_backward_with_master_weights(self, scaler):
    stash = self._amp_stash
    self._amp_lazy_init()
    fresh_grads, new_master_grads, accumulate_grads, master_grads = [], [], [], []
    for param, master in zip(stash.all_fp16_params, stash.all_fp32_from_fp16_params):
        if param.grad is None:
            continue
        if master.grad is None:
            master.grad = torch.empty_like(master)
            fresh_grads.append(param.grad)
            new_master_grads.append(master.grad)
        else:
            accumulate_grads.append(param.grad)
            master_grads.append(master.grad)
    if fresh_grads:
        scaler.unscale(fresh_grads, new_master_grads, scaler.loss_scale())
    if accumulate_grads:
        scaler.unscale_with_stashed(accumulate_grads, master_grads, master_grads)
    _unscale_and_restore_stash(scaler, stash.all_fp32_from_fp32_params,
                               stash.all_fp32_from_fp32_grad_stash)


def _step_with_master_weights(original_step):
    def step(self, closure=None):
        if closure is not None:
            raise RuntimeError(_CLOSURE_ERROR)
        self._amp_lazy_init()
        result = original_step()
        self._master_params_to_model_params()
        _set_grads_to_none(self._amp_stash.all_fp32_from_fp16_params)
        return result

    return step


def _load_state_dict_into_masters(original_load_state_dict):
    # Create the masters first, so loaded state lands in fp32 directly. apex loaded it into the
    # half params (casting e.g. Adam's second moments to float16, where they can underflow)
    # and only then recast it to fp32.
    def load_state_dict(self, state_dict):
        self._amp_lazy_init()
        return original_load_state_dict(state_dict)

    return load_state_dict


def _zero_grad_with_master_weights(self, set_to_none=False):
    """apex's O2 ``zero_grad``: model grads zeroed in place, master grads dropped.

    ``set_to_none=True`` drops the model grads too (accepted here; apex took no argument).
    """
    stash = self._amp_stash
    self._amp_lazy_init()
    model_params = stash.all_fp16_params + stash.all_fp32_from_fp32_params
    if set_to_none:
        _set_grads_to_none(model_params)
    else:
        grads = [param.grad for param in model_params if param.grad is not None]
        for grad in grads:
            if grad.grad_fn is not None:
                grad.detach_()
            else:
                grad.requires_grad_(False)
        for group, _ in _groups(grads).values():
            torch._foreach_zero_(group)
    _set_grads_to_none(stash.all_fp32_from_fp16_params)


def _set_grads_to_none(params):
    for param in params:
        param.grad = None


# ---------------------------------------------------------------- all levels

def _add_param_group(original_add_param_group, master_weights):
    def add_param_group(self, param_group):
        stash = self._amp_stash
        self._amp_lazy_init()
        assert isinstance(param_group, dict), "param group must be a dict"
        params = param_group["params"]
        if isinstance(params, torch.Tensor):
            param_group["params"] = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of tensors in sets will change between runs. "
                            "Please use a list instead.")
        else:
            param_group["params"] = list(params)
        if master_weights:
            floats = _install_masters(self, param_group["params"], stash)
            stash.all_fp32_from_fp32_grad_stash += [None] * len(floats)
        else:
            halves_before = len(stash.all_fp16_params)
            floats_before = len(stash.all_fp32_params)
            _sort_params(param_group["params"], stash)
            stash.all_fp16_grad_stash += [None] * (len(stash.all_fp16_params) - halves_before)
            stash.all_fp32_grad_stash += [None] * (len(stash.all_fp32_params) - floats_before)
        original_add_param_group(param_group)

    return add_param_group
