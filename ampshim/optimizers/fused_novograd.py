"""apex's ``FusedNovoGrad``: Adam-like moments whose second moment is one gradient NORM per tensor."""
import torch

from ampshim.optimizers._base import _as_fp32, _FusedOptimizer, _write_back

__all__ = ["FusedNovoGrad"]

_REDUCED = (torch.float16, torch.bfloat16)


class FusedNovoGrad(_FusedOptimizer):
    """NovoGrad as apex computes it, vectorised with foreach ops.

    Per tensor, ``v = sqrt(beta2 * v**2 + (1 - beta2) * ||g||**2)`` for the L2 norm
    (``v = beta2 * v + (1 - beta2) * ||g||_inf`` for ``norm_type=0``), seeded with the first step's
    norms unless ``init_zero``. With ``denom = v / sqrt(1 - beta2**step) + eps``:

    * ``reg_inside_moment=False`` (default): ``m = beta1*m + beta3*g``;
      ``p -= lr * (m / (1 - beta1**step) / denom + weight_decay * p)``;
    * ``reg_inside_moment=True``: ``m = beta1*m + beta3*(g / denom + weight_decay * p)``;
      ``p -= lr * m / (1 - beta1**step)``;

    where ``beta3 = 1 - beta1`` with grad averaging, else 1. As in apex, the norms live in the
    param group: ``group['exp_avg_sq'] = [fp16/bf16 norms, fp32 norms]``; ``m`` is ``state['exp_avg']``.

    Example::

        >>> optimizer = FusedNovoGrad(model.parameters(), lr=1e-2, weight_decay=1e-3)
        >>> loss_fn(model(x), y).backward()
        >>> optimizer.step()

    Args:
        params (iterable): parameters or param groups.
        lr (float, optional, default=1e-3): learning rate.
        bias_correction (bool, optional, default=True): correct the moments' bias.
        betas (Tuple[float, float], optional, default=(0.9, 0.999)): moment decay rates.
        eps (float, optional, default=1e-8): added to the denominator.
        weight_decay (float, optional, default=0): weight decay.
        amsgrad (bool, optional, default=False): not supported (RuntimeError), as in apex.
        reg_inside_moment (bool, optional, default=False): see above.
        grad_averaging (bool, optional, default=True): scale the new gradient by ``1 - beta1``.
        norm_type (int, optional, default=2): 2 (L2) or 0 (infinity norm).
        init_zero (bool, optional, default=False): start the norms at zero.
        set_grad_none (bool, optional, default=True): ``zero_grad()`` sets grads to None.
    """

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0., amsgrad=False, reg_inside_moment=False, grad_averaging=True,
                 norm_type=2, init_zero=False, set_grad_none=True):
        if amsgrad:
            raise RuntimeError("FusedNovoGrad does not support the AMSGrad variant.")
        if norm_type not in (0, 2):
            raise RuntimeError(f"FusedNovoGrad only supports the L2 (norm_type=2) and infinity "
                               f"(norm_type=0) norms; got norm_type={norm_type!r}.")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                        weight_decay=weight_decay, grad_averaging=grad_averaging,
                        norm_type=norm_type, init_zero=init_zero)
        super().__init__(params, defaults, set_grad_none)
        self.moment_mode = 0 if reg_inside_moment else 1

    def _step(self):
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            params = self._params_with_grad(group, _REDUCED + (torch.float32,))
            # apex keeps two lists, reduced precision first, each in param order.
            for index, subset in enumerate(([p for p in params if p.dtype in _REDUCED],
                                            [p for p in params if p.dtype == torch.float32])):
                if subset:
                    self._update(group, index, subset)

    def _grad_norms(self, group, grads):
        if group["norm_type"] == 0:
            return torch.stack([g.abs().max() for g in grads])
        return torch.stack(torch._foreach_norm(grads))

    def _update(self, group, index, params):
        grads = _as_fp32([p.grad for p in params])
        norms = self._grad_norms(group, grads)
        norm_lists = group.setdefault("exp_avg_sq", [None, None])
        beta1, beta2 = group["betas"]
        if norm_lists[index] is None:
            norm_lists[index] = torch.zeros_like(norms) if group["init_zero"] else norms.clone()
        elif norm_lists[index].numel() != len(params):
            raise RuntimeError(
                f"FusedNovoGrad keeps one gradient norm per parameter, but {len(params)} parameters "
                f"have gradients now against {norm_lists[index].numel()} before. NovoGrad needs the "
                "same parameters to receive gradients at every step.")
        v = norm_lists[index]
        if group["norm_type"] == 0:
            v.mul_(beta2).add_(norms, alpha=1 - beta2)
        else:
            v.copy_(torch.sqrt(beta2 * v * v + (1 - beta2) * norms * norms))

        step, lr, wd = group["step"], group["lr"], group["weight_decay"]
        bias_correction1 = 1 - beta1 ** step if group["bias_correction"] else 1.0
        bias_correction2 = (1 - beta2 ** step) ** 0.5 if group["bias_correction"] else 1.0
        beta3 = 1 - beta1 if group["grad_averaging"] else 1.0
        denoms = list((v / bias_correction2 + group["eps"]).unbind())

        for p in params:
            if "exp_avg" not in self.state[p]:
                self.state[p]["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        exp_avgs = [self.state[p]["exp_avg"] for p in params]
        weights, m = _as_fp32(params), _as_fp32(exp_avgs)
        if self.moment_mode == 0:  # regularisation inside the moment
            scaled = torch._foreach_div(grads, denoms)
            if wd != 0:
                torch._foreach_add_(scaled, weights, alpha=wd)
            torch._foreach_mul_(m, beta1)
            torch._foreach_add_(m, scaled, alpha=beta3)
            torch._foreach_add_(weights, m, alpha=-lr / bias_correction1)
        else:  # decoupled weight decay
            torch._foreach_mul_(m, beta1)
            torch._foreach_add_(m, grads, alpha=beta3)
            updates = torch._foreach_div(m, denoms)
            torch._foreach_div_(updates, bias_correction1)
            if wd != 0:
                torch._foreach_add_(updates, weights, alpha=wd)
            torch._foreach_add_(weights, updates, alpha=-lr)
        _write_back(params, weights)
        _write_back(exp_avgs, m)
