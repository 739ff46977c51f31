"""apex's ``FusedAdagrad``: torch's Adagrad (no lr decay), plus decoupled weight decay."""
import torch

from ampshim.optimizers._base import _FusedOptimizer

__all__ = ["FusedAdagrad"]


class FusedAdagrad(_FusedOptimizer):
    """Adagrad: ``sum += g*g``; ``p -= lr * g / (sqrt(sum) + eps)``, vectorised with foreach ops.

    With ``adagrad_w_mode=False`` (default) weight decay is added to the gradient, as
    ``torch.optim.Adagrad`` does; with ``True`` it is decoupled: ``p -= lr * (g / (sqrt(sum) + eps)
    + weight_decay * p)``. State key ``sum`` matches torch's.

    Example::

        >>> optimizer = FusedAdagrad(model.parameters(), lr=1e-2)
        >>> loss_fn(model(x), y).backward()
        >>> optimizer.step()

    Args:
        params (iterable): parameters or param groups.
        lr (float, optional, default=1e-2): learning rate.
        eps (float, optional, default=1e-10): added to the denominator.
        weight_decay (float, optional, default=0): weight decay.
        set_grad_none (bool, optional, default=True): ``zero_grad()`` sets grads to None.
        adagrad_w_mode (bool, optional, default=False): decoupled weight decay.
    """

    def __init__(self, params, lr=1e-2, eps=1e-10, weight_decay=0., set_grad_none=True,
                 adagrad_w_mode=False):
        defaults = dict(lr=lr, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults, set_grad_none)
        self.adagrad_w_mode = 1 if adagrad_w_mode else 0

    def _step(self):
        for group in self.param_groups:
            params = self._params_with_grad(group)
            if params:
                self._update(group, params)

    def _update(self, group, params):
        wd, lr = group["weight_decay"], group["lr"]
        for p in params:
            if "sum" not in self.state[p]:
                self.state[p]["sum"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        sums = [self.state[p]["sum"] for p in params]
        grads = [p.grad for p in params]
        if wd != 0 and not self.adagrad_w_mode:
            grads = torch._foreach_add(grads, params, alpha=wd)
        torch._foreach_addcmul_(sums, grads, grads)
        std = torch._foreach_sqrt(sums)
        torch._foreach_add_(std, group["eps"])
        if wd != 0 and self.adagrad_w_mode:
            torch._foreach_mul_(params, 1 - lr * wd)
        torch._foreach_addcdiv_(params, grads, std, -lr)
