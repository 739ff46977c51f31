"""What ``python -m ampshim compare`` sees of a training script, recorded as it runs.

Installed in the script's own process before the script starts (see :mod:`.probe`); nothing in
the script is edited. Each event is one JSON line, written as it happens, so a run that crashes
keeps every step it took:

- ``backward``: the loss handed to ``amp.scale_loss`` / ``GradScaler.scale`` /
  ``FP16_Optimizer.backward`` or a plain ``backward()`` (its value and dtype), the loss scale and
  how the scale grows, and the forward that made the loss: how many matmul-class ops its autograd
  graph holds, and how many of them ran in half precision (read from the graph when backward
  starts, so ops outside the training step's graph, and the run's speed, are left alone);
- ``clip``: ``clip_grad_norm_``'s ``max_norm`` and the total norm it saw;
- ``step``: one optimizer step the script asked for, taken or skipped (overflow), the global
  norm of the gradients the optimizer stepped with (unscaled, as it read them), and the
  matmul-class layers that ran without gradients since the step before (``torch.no_grad``: a
  memory bank, a teacher made from the model), with how many of them ran in half precision:
  they are in no loss's graph, so a global forward hook counts them, by their output;
- ``end``: why the run ended and a checksum of the stepped parameters.

After ``steps`` optimizer steps the run stops: :class:`StopTraining` (a ``SystemExit``) is raised
from the step, so ``finally`` blocks and the DataLoader's workers end as on any exit.
"""
from __future__ import annotations

import functools
import json
import os
import re
import weakref

import torch
import torch.optim.optimizer as torch_optimizer

__all__ = ["Recorder", "StopTraining", "install"]

_HALF_DTYPES = (torch.float16, torch.bfloat16)

# The autograd nodes of the ops that autocast runs in half precision and that carry a model's
# arithmetic (linear, matmul, einsum, conv2d and attention reach the graph as these).
_MATMUL_NODES = frozenset((
    "Mm", "Addmm", "Bmm", "Baddbmm", "Addbmm", "Mv", "Addmv", "Dot", "Vdot", "Linear",
    "MkldnnLinear", "Convolution", "CudnnConvolution", "CudnnConvolutionTranspose",
    "MkldnnConvolution", "ScaledDotProductFlashAttention", "ScaledDotProductFlashAttentionForCpu",
    "ScaledDotProductEfficientAttention", "ScaledDotProductCudnnAttention"))
# Where such a node keeps an input it multiplied: its dtype is the precision the op ran in.
_SAVED_INPUTS = ("_saved_mat2", "_saved_mat1", "_saved_self", "_saved_input", "_saved_weight",
                 "_saved_query", "_saved_key", "_saved_value", "_saved_vec", "_saved_tensor")


class StopTraining(SystemExit):
    """Raised from the optimizer step that reached the requested number of steps."""


class Recorder:
    """The events of one process, written to ``path`` as JSON lines."""

    def __init__(self, path: str, steps: int) -> None:
        self._file = open(path, "w", encoding="utf-8", buffering=1)
        self._limit = steps
        self._owner = os.getpid()  # forked DataLoader workers record nothing
        self._attempts = 0
        self._attempt_depth = 0
        self._taken: list = []  # (optimizer name, gradient norm) of the optimizer steps inside one
        self._optimizers: dict[int, tuple[int, object]] = {}
        self._scaled: dict[int, tuple[weakref.ref, dict]] = {}
        self._scale_blocks: list[tuple] = []  # (loss, fields): apex scale_loss / FP16_Optimizer.backward in progress
        self._detached = [0, 0]  # matmul-class layers run without gradients since the last step, in half
        self.stopped = False
        self.ended = False

    # -- events -------------------------------------------------------------------------------

    def emit(self, event: str, **fields) -> None:
        if os.getpid() != self._owner or self._file.closed:
            return
        self._file.write(json.dumps({"e": event, **fields}, default=_jsonable) + "\n")

    def backward(self, tensor, run):
        """Record the backward of ``tensor`` (its loss, scale, forward), then ``run()`` it."""
        self._stop_again()
        self.emit("backward", **_graph_precision(tensor), **self._loss_behind(tensor))
        return run()

    def scaled(self, loss, scaled, scale: float, growth, via: str) -> None:
        """``scaled`` is ``loss`` times ``scale``: its backward records ``loss``."""
        if isinstance(scaled, torch.Tensor):
            if len(self._scaled) > 64:  # scaled and never backpropagated (an evaluation): forget
                self._scaled = {key: entry for key, entry in self._scaled.items() if entry[0]()}
            self._scaled[id(scaled)] = (weakref.ref(scaled), _loss_fields(loss, scale, growth, via))

    def begin_scale_block(self, loss, scale: float, growth, via: str) -> None:
        """A backward run by a library call (``FP16_Optimizer.backward``, inside ``scale_loss``)."""
        self._scale_blocks.append((loss, _loss_fields(loss, scale, growth, via)))

    def end_scale_block(self) -> None:
        if self._scale_blocks:
            self._scale_blocks.pop()

    def detached_layer(self, output) -> None:
        """A matmul-class layer ran with gradients off and gave ``output``."""
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            self._detached[0] += 1
            self._detached[1] += output.dtype in _HALF_DTYPES

    def clip(self, max_norm, norm) -> None:
        self.emit("clip", max_norm=_number(max_norm), norm=_number(norm))

    # -- optimizer steps -----------------------------------------------------------------------

    def begin_attempt(self) -> bool:
        """Enter a step the script asked for; False when inside another one (a wrapper's step)."""
        self._stop_again()
        self._attempt_depth += 1
        if self._attempt_depth > 1:
            return False
        self._taken = []
        return True

    def end_attempt(self, optimizer, outermost: bool, raised: bool = False) -> None:
        """Leave a step; the outermost one that returned is recorded (and may stop the run)."""
        self._attempt_depth -= 1
        if not outermost or raised:
            return
        self._attempts += 1
        taken = self._taken
        self.emit("step", n=self._attempts, optimizer=self._index_of(optimizer),
                  name=taken[0][0] if taken else type(optimizer).__name__,
                  taken=bool(taken), grad_norm=taken[0][1] if taken else None,
                  detached=self._detached)
        self._detached = [0, 0]
        if self._attempts >= self._limit:
            self.end("steps")
            self.stopped = True
            raise StopTraining(0)

    def optimizer_step_runs(self, optimizer) -> None:
        """The optimizer's own ``step`` is about to update its parameters."""
        self._taken.append((type(optimizer).__name__, _gradient_norm(optimizer)))

    def in_attempt(self) -> bool:
        return self._attempt_depth > 0

    # -- the end -------------------------------------------------------------------------------

    def end(self, reason: str, error: str | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        self.emit("end", reason=reason, error=error, steps=self._attempts,
                  checksum=self._checksum())
        if os.getpid() == self._owner:
            self._file.close()

    def _stop_again(self) -> None:
        # A script that caught the stop (a bare ``except:``) is stopped at its next step.
        if self.stopped:
            raise StopTraining(0)

    def _index_of(self, optimizer) -> int:
        entry = self._optimizers.get(id(optimizer))
        if entry is None or entry[1] is not optimizer:
            entry = (len(self._optimizers), optimizer)
            self._optimizers[id(optimizer)] = entry
        return entry[0]

    def _loss_behind(self, tensor) -> dict:
        entry = self._scaled.pop(id(tensor), None)
        if entry is not None and entry[0]() is tensor:
            return entry[1]
        if self._scale_blocks:
            loss, fields = self._scale_blocks[-1]
            if tensor is not loss:
                return fields
            # `loss.backward()` inside `scale_loss`: the loss itself, never multiplied by the scale
        return _loss_fields(tensor, 1.0, None, "plain")

    def _checksum(self) -> dict | None:
        total = absolute = 0.0
        count = 0
        seen = set()
        try:
            with torch.no_grad():
                for _, optimizer in sorted(self._optimizers.values(), key=lambda entry: entry[0]):
                    for group in getattr(optimizer, "param_groups", ()):
                        for param in group["params"]:
                            if id(param) in seen:
                                continue
                            seen.add(id(param))
                            values = param.detach().double()
                            total += float(values.sum())
                            absolute += float(values.abs().sum())
                            count += param.numel()
        except Exception:  # a checksum never makes the run fail
            return None
        return {"sum": total, "abs": absolute, "numel": count} if count else None


def _loss_fields(loss, scale, growth, via) -> dict:
    value, dtype = None, None
    if isinstance(loss, torch.Tensor):
        dtype = str(loss.dtype).removeprefix("torch.")
        with torch.no_grad():
            value = float(loss.detach().float().sum())
    return {"loss": value, "dtype": dtype, "scale": _number(scale), "growth": growth, "via": via}


def _gradient_norm(optimizer) -> float | None:
    grads = []
    for group in getattr(optimizer, "param_groups", ()):
        for param in group["params"]:
            grad = param.grad
            if grad is None:
                continue
            if grad.is_sparse:
                grad = grad.coalesce()._values()
            grads.append(grad.detach())
    if not grads:
        return None
    with torch.no_grad():
        norms = [torch.linalg.vector_norm(grad.double()) for grad in grads]
        return float(torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms])))


def _graph_precision(tensor) -> dict:
    """The matmul-class ops in the autograd graph behind ``tensor``, and how many ran in half."""
    matmul = half = 0
    half_dtype = None
    start = getattr(tensor, "grad_fn", None)
    stack, seen = [start], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(function for function, _ in node.next_functions)
        if _node_op(type(node).__name__) not in _MATMUL_NODES:
            continue
        matmul += 1
        dtype = _saved_input_dtype(node)
        if dtype in _HALF_DTYPES:
            half += 1
            half_dtype = str(dtype).removeprefix("torch.")
    return {"matmul": matmul, "half": half, "half_dtype": half_dtype}


@functools.lru_cache(maxsize=None)
def _node_op(node_name: str) -> str:
    return re.sub(r"Backward\d*$", "", node_name)


def _saved_input_dtype(node):
    for name in _SAVED_INPUTS:
        try:
            saved = getattr(node, name, None)
        except RuntimeError:  # freed by an earlier backward with retain_graph=False
            return None
        if isinstance(saved, torch.Tensor):
            return saved.dtype
    return None


def _number(value):
    if isinstance(value, torch.Tensor):
        value = float(value.detach().float().sum()) if value.numel() else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _jsonable(value):
    return None if value is None else str(value)


# --- how the loss scale grows --------------------------------------------------------------------

def apex_growth(scaler) -> list | None:
    """``[interval, factor]`` of an apex loss scaler (per backward pass), None when static."""
    return [scaler._scale_seq_len, 2.0] if scaler.dynamic else None


def native_growth(scaler) -> list | None:
    """``[interval, factor]`` of a ``GradScaler`` (per step), None when it never grows."""
    if not scaler.is_enabled() or scaler.get_growth_factor() == 1.0 \
            or scaler.get_growth_interval() >= 2**31 - 1:
        return None
    return [scaler.get_growth_interval(), scaler.get_growth_factor()]


# --- installing the hooks ------------------------------------------------------------------------

def install(recorder: Recorder, *, apex: bool) -> None:
    """Hook torch (and ampshim's apex, when it serves the script) so ``recorder`` sees the steps."""
    _hook_backward(recorder)
    _hook_grad_scaler(recorder)
    _hook_optimizer_steps(recorder)
    _hook_clip(recorder)
    _hook_detached_layers(recorder)
    if apex:
        _hook_apex(recorder)



def _attempt(recorder, optimizer, step):
    """Run ``step()``, a step the script asked of ``optimizer``, as one recorded attempt."""
    outermost = recorder.begin_attempt()
    try:
        result = step()
    except BaseException:
        recorder.end_attempt(optimizer, outermost, raised=True)
        raise
    recorder.end_attempt(optimizer, outermost)
    return result


def _hook_backward(recorder):
    backward = torch.autograd.backward

    @functools.wraps(backward)
    def recorded_backward(tensors, *args, **kwargs):
        first = tensors[0] if isinstance(tensors, (tuple, list)) and tensors else tensors
        return recorder.backward(first, lambda: backward(tensors, *args, **kwargs))

    torch.autograd.backward = recorded_backward


def _hook_grad_scaler(recorder):
    scaler_class = torch.amp.grad_scaler.GradScaler
    scale, step = scaler_class.scale, scaler_class.step

    @functools.wraps(scale)
    def recorded_scale(self, outputs):
        scaled = scale(self, outputs)
        factor = self.get_scale() if self.is_enabled() else 1.0
        recorder.scaled(outputs, scaled, factor, native_growth(self), "GradScaler")
        return scaled

    @functools.wraps(step)
    def recorded_step(self, optimizer, *args, **kwargs):
        return _attempt(recorder, optimizer, lambda: step(self, optimizer, *args, **kwargs))

    scaler_class.scale, scaler_class.step = recorded_scale, recorded_step


def _hook_optimizer_steps(recorder):
    plain = []  # optimizers whose step is a plain one: no wrapper asked for it

    def before(optimizer, args, kwargs):
        if not recorder.in_attempt():
            plain.append(optimizer)
            recorder.begin_attempt()
        recorder.optimizer_step_runs(optimizer)

    def after(optimizer, args, kwargs):
        if plain and plain[-1] is optimizer:
            plain.pop()
            recorder.end_attempt(optimizer, True)

    torch_optimizer.register_optimizer_step_pre_hook(before)
    torch_optimizer.register_optimizer_step_post_hook(after)


def _hook_clip(recorder):
    import torch.nn.utils
    import torch.nn.utils.clip_grad as clip_grad

    clip = clip_grad.clip_grad_norm_

    @functools.wraps(clip)
    def recorded_clip(parameters, max_norm, *args, **kwargs):
        norm = clip(parameters, max_norm, *args, **kwargs)
        recorder.clip(max_norm, norm)
        return norm

    clip_grad.clip_grad_norm_ = recorded_clip
    torch.nn.utils.clip_grad_norm_ = recorded_clip


def _hook_detached_layers(recorder):
    """Count the matmul-class layers that run with gradients off (see ``Recorder.detached_layer``).
    A module hook, not a wrapper of ``F.linear``: TorchScript compiles ``F.linear`` by identity."""
    import torch.nn as nn

    layers = (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd, nn.MultiheadAttention)

    def counted(module, args, output):
        if torch.is_grad_enabled() or not isinstance(module, layers):
            return None
        recorder.detached_layer(output[0] if isinstance(output, tuple) and output else output)
        return None

    return nn.modules.module.register_module_forward_hook(counted)


def _hook_apex(recorder):
    from ampshim import optimizer as amp_optimizer
    from ampshim import scale_loss as amp_scale_loss
    from ampshim.fp16_utils import fp16_optimizer

    block = amp_scale_loss._ScaleLoss
    enter, leave = block.__enter__, block.__exit__

    @functools.wraps(enter)
    def recorded_enter(self):
        scaled = enter(self)
        recorder.begin_scale_block(self._loss, self._scaler.loss_scale(),
                                   apex_growth(self._scaler), "amp.scale_loss")
        return scaled

    @functools.wraps(leave)
    def recorded_exit(self, *exc):
        recorder.end_scale_block()
        return leave(self, *exc)

    block.__enter__, block.__exit__ = recorded_enter, recorded_exit

    unless_skipped = amp_optimizer._step_unless_skipped

    @functools.wraps(unless_skipped)
    def recorded_unless_skipped(original_step):
        step = unless_skipped(original_step)

        @functools.wraps(step)
        def recorded_step(self, *args, **kwargs):
            return _attempt(recorder, self, lambda: step(self, *args, **kwargs))
        return recorded_step

    amp_optimizer._step_unless_skipped = recorded_unless_skipped

    fp16 = fp16_optimizer.FP16_Optimizer
    fp16_step, fp16_backward = fp16.step, fp16.backward

    @functools.wraps(fp16_step)
    def recorded_fp16_step(self, *args, **kwargs):
        return _attempt(recorder, self, lambda: fp16_step(self, *args, **kwargs))

    @functools.wraps(fp16_backward)
    def recorded_fp16_backward(self, loss, *args, **kwargs):
        scaler = self.loss_scaler
        recorder.begin_scale_block(loss, scaler.loss_scale(), apex_growth(scaler),
                                   "FP16_Optimizer.backward")
        try:
            return fp16_backward(self, loss, *args, **kwargs)
        finally:
            recorder.end_scale_block()

    fp16.step, fp16.backward = recorded_fp16_step, recorded_fp16_backward
