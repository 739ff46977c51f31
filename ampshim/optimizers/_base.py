"""What apex's fused optimizers share: ``set_grad_none``, gradient checks, fp32 math on any dtype."""
import torch

__all__ = []  # private room


class _FusedOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` whose ``zero_grad()`` follows apex's ``set_grad_none`` flag."""

    def __init__(self, params, defaults, set_grad_none):
        super().__init__(params, defaults)
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none=None):
        """Set grads to None if ``set_grad_none`` (apex's constructor flag), else zero them in place.

        Args:
            set_to_none (bool, optional): overrides ``set_grad_none`` for this call (apex took
                no argument; native code passes one).
        """
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        """Perform one optimization step.

        Args:
            closure (callable, optional): re-evaluates the model and returns the loss.
        """
        loss = _evaluate(closure)
        self._step()
        return loss

    def _step(self):
        raise NotImplementedError

    def _params_with_grad(self, group, dtypes=None):
        """The group's parameters that have a gradient, after apex's checks on them."""
        name = type(self).__name__
        params = [p for p in group["params"] if p.grad is not None]
        for p in params:
            if p.grad.is_sparse:
                raise RuntimeError(f"{name} does not support sparse gradients; use "
                                   "torch.optim.SparseAdam for sparse parameters.")
            if dtypes is not None and p.dtype not in dtypes:
                allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
                raise RuntimeError(f"{name} only supports {allowed} parameters; got a parameter of "
                                   f"dtype {p.dtype} and shape {tuple(p.shape)}.")
        return params


def _evaluate(closure):
    """The loss from ``closure`` (run with grad enabled inside ``step``), or None."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


REDUCED_AND_FP32 = (torch.float16, torch.bfloat16, torch.float32)


def _as_fp32(tensors):
    """fp32 versions of ``tensors``: the tensors themselves when already fp32, else copies."""
    return [t if t.dtype == torch.float32 else t.float() for t in tensors]


def _write_back(originals, fp32_versions):
    """Copy the updated fp32 copies made by :func:`_as_fp32` into their reduced-precision originals."""
    pairs = [(o, f) for o, f in zip(originals, fp32_versions) if o is not f]
    if pairs:
        torch._foreach_copy_([o for o, _ in pairs], [f for _, f in pairs])


def _fp32_state(state, key, param):
    """``state[key]``, created as fp32 zeros; upcast if a state-dict load cast it to the param dtype."""
    value = state.get(key)
    if value is None:
        value = state[key] = torch.zeros_like(param, dtype=torch.float32, memory_format=torch.preserve_format)
    elif value.dtype != torch.float32:
        value = state[key] = value.float()
    return value
