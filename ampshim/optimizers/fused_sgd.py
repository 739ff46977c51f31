"""apex's ``FusedSGD``: torch's SGD update rule, plus apex's ``wd_after_momentum`` option."""
import torch
from torch.optim.optimizer import required

from ampshim.optimizers._base import _FusedOptimizer

__all__ = ["FusedSGD"]


class FusedSGD(_FusedOptimizer):
    """SGD with momentum, dampening and Nesterov, as ``torch.optim.SGD``, vectorised with foreach ops.

    The momentum buffer (state ``momentum_buffer``, as in torch) starts as the first gradient, then
    ``buf = momentum * buf + (1 - dampening) * grad``. Weight decay is added to the gradient before
    the momentum update, or after it with ``wd_after_momentum=True`` (apex only).

    Example::

        >>> optimizer = FusedSGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        >>> loss_fn(model(x), y).backward()
        >>> optimizer.step()
        >>> optimizer.zero_grad()

    Args:
        params (iterable): parameters or param groups.
        lr (float): learning rate (required).
        momentum (float, optional, default=0): momentum factor.
        dampening (float, optional, default=0): dampening for momentum.
        weight_decay (float, optional, default=0): L2 penalty.
        nesterov (bool, optional, default=False): Nesterov momentum.
        wd_after_momentum (bool, optional, default=False): apply weight decay after momentum.
        materialize_master_grads (bool, optional, default=True): accepted for apex compatibility.
        set_grad_none (bool, optional, default=False): ``zero_grad()`` sets grads to None.
    """

    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                 wd_after_momentum=False, materialize_master_grads=True, set_grad_none=False):
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr!r}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum!r}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay!r}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov)
        super().__init__(params, defaults, set_grad_none)
        self.wd_after_momentum = wd_after_momentum
        self.materialize_master_grads = materialize_master_grads
        # Read and reset by apex's amp when it skips a step after an overflow.
        self.most_recent_scale = 1.0
        self.scale_set_by_backward = False

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)

    def _step(self):
        for group in self.param_groups:
            params = self._params_with_grad(group)
            if params:
                self._update(group, params)
        self.most_recent_scale = 1.0

    def _update(self, group, params):
        wd, momentum = group["weight_decay"], group["momentum"]
        grads = [p.grad for p in params]
        if wd != 0 and not self.wd_after_momentum:
            grads = torch._foreach_add(grads, params, alpha=wd)
        if momentum != 0:
            bufs = []
            for p, g in zip(params, grads):
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.clone(g).detach()
                else:
                    state["momentum_buffer"].mul_(momentum).add_(g, alpha=1 - group["dampening"])
                bufs.append(state["momentum_buffer"])
            grads = torch._foreach_add(grads, bufs, alpha=momentum) if group["nesterov"] else bufs
        if wd != 0 and self.wd_after_momentum:
            grads = torch._foreach_add(grads, params, alpha=wd)
        torch._foreach_add_(params, grads, alpha=-group["lr"])
