"""apex's ``FusedLAMB``: Adam moments with a per-tensor trust ratio, after global gradient clipping."""
import torch

from ampshim.optimizers._base import REDUCED_AND_FP32, _as_fp32, _FusedOptimizer, _write_back

__all__ = ["FusedLAMB"]


def _global_clip_factor(grads, max_grad_norm):
    """``min(1, max_grad_norm / ||all grads||)`` as a 0-dim tensor (no host sync), or None."""
    if not max_grad_norm or max_grad_norm <= 0:
        return None
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)))
    return torch.clamp(max_grad_norm / norm, max=1.0)  # a zero norm gives inf, clamped to 1


def _lamb(weights, grads, exp_avgs, exp_avg_sqs, *, lr, beta1, beta2, eps, step, bias_correction,
          weight_decay, grad_averaging, adam_w_mode, use_nvlamb, clip):
    """One LAMB step on same-dtype lists, in place on ``weights`` and the moments."""
    # Out of place: the parameters' .grad tensors must not change.
    if clip is not None:
        grads = torch._foreach_mul(grads, clip)
    if weight_decay != 0 and not adam_w_mode:
        grads = torch._foreach_add(grads, weights, alpha=weight_decay)  # L2 inside the moments
    beta3 = 1 - beta1 if grad_averaging else 1.0
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=beta3)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    bias_correction1 = 1 - beta1 ** step if bias_correction else 1.0
    bias_correction2 = 1 - beta2 ** step if bias_correction else 1.0
    updates = torch._foreach_div(exp_avgs, bias_correction1)
    denom = torch._foreach_div(exp_avg_sqs, bias_correction2)
    torch._foreach_sqrt_(denom)
    torch._foreach_add_(denom, eps)
    torch._foreach_div_(updates, denom)
    if weight_decay != 0 and adam_w_mode:
        torch._foreach_add_(updates, weights, alpha=weight_decay)  # decoupled decay
    if weight_decay != 0 or use_nvlamb:
        # Trust ratio ||w|| / ||update|| per tensor, only where both norms are non-zero.
        w_norms = torch.stack(torch._foreach_norm(weights))
        u_norms = torch.stack(torch._foreach_norm(updates))
        ratios = torch.where((w_norms > 0) & (u_norms > 0), w_norms / u_norms, 1.0) * lr
        torch._foreach_mul_(updates, list(ratios.unbind()))
        torch._foreach_sub_(weights, updates)
    else:
        torch._foreach_add_(weights, updates, alpha=-lr)


class FusedLAMB(_FusedOptimizer):
    """LAMB (layer-wise adaptive moments), as apex computes it, vectorised with foreach ops.

    1. All gradients are clipped together: divided by ``||g|| / max_grad_norm`` when the global
       norm exceeds ``max_grad_norm`` (which is read from the constructor defaults, as apex does).
    2. Adam moments: ``m = beta1*m + beta3*g`` (``beta3 = 1 - beta1`` with grad averaging, else 1),
       ``v = beta2*v + (1-beta2)*g*g``; ``update = m_hat / (sqrt(v_hat) + eps)``, plus
       ``weight_decay * p`` (``adam_w_mode=True``) or with ``weight_decay * p`` added to ``g`` first.
    3. ``p -= lr * ||p|| / ||update|| * update`` per tensor when ``weight_decay != 0`` or
       ``use_nvlamb`` (and both norms are non-zero), else ``p -= lr * update``.

    State ``exp_avg``/``exp_avg_sq`` is kept in the parameter's dtype (the math runs in fp32); the
    step count is ``param_group['step']``.

    Example::

        >>> optimizer = FusedLAMB(model.parameters(), lr=1e-3, weight_decay=0.01)
        >>> loss_fn(model(x), y).backward()
        >>> optimizer.step()
        >>> optimizer.zero_grad()

    Args:
        params (iterable): parameters or param groups.
        lr (float, optional, default=1e-3): learning rate.
        bias_correction (bool, optional, default=True): correct the moments' bias.
        betas (Tuple[float, float], optional, default=(0.9, 0.999)): moment decay rates.
        eps (float, optional, default=1e-6): added to the denominator.
        weight_decay (float, optional, default=0.01): weight decay.
        amsgrad (bool, optional, default=False): not supported (RuntimeError), as in apex.
        adam_w_mode (bool, optional, default=True): decoupled weight decay; False = L2.
        grad_averaging (bool, optional, default=True): scale the new gradient by ``1 - beta1``.
        set_grad_none (bool, optional, default=True): ``zero_grad()`` sets grads to None.
        max_grad_norm (float, optional, default=1.0): global gradient clipping norm (0 = off).
        use_nvlamb (bool, optional, default=False): use the trust ratio even without weight decay.
    """

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-6,
                 weight_decay=0.01, amsgrad=False, adam_w_mode=True, grad_averaging=True,
                 set_grad_none=True, max_grad_norm=1.0, use_nvlamb=False):
        if amsgrad:
            raise RuntimeError(f"{type(self).__name__} does not support the AMSGrad variant.")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                        weight_decay=weight_decay, grad_averaging=grad_averaging,
                        max_grad_norm=max_grad_norm)
        super().__init__(params, defaults, set_grad_none)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.use_nvlamb = use_nvlamb

    def _step(self):
        groups = [(group, self._params_with_grad(group, REDUCED_AND_FP32)) for group in self.param_groups]
        grads = [p.grad for _, params in groups for p in params]
        clip = _global_clip_factor(grads, self.defaults["max_grad_norm"]) if grads else None
        for index, (group, params) in enumerate(groups):
            group["step"] = group.get("step", 0) + 1
            if params:
                self._update(index, group, params, clip)

    def _update(self, index, group, params, clip):
        for p in params:
            state = self.state[p]
            if not state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        exp_avgs = [self.state[p]["exp_avg"] for p in params]
        exp_avg_sqs = [self.state[p]["exp_avg_sq"] for p in params]
        weights, m, v = _as_fp32(params), _as_fp32(exp_avgs), _as_fp32(exp_avg_sqs)
        self._lamb(group, weights, _as_fp32([p.grad for p in params]), m, v, clip)
        for originals, fp32 in ((params, weights), (exp_avgs, m), (exp_avg_sqs, v)):
            _write_back(originals, fp32)

    def _lamb(self, group, weights, grads, exp_avgs, exp_avg_sqs, clip):
        beta1, beta2 = group["betas"]
        _lamb(weights, grads, exp_avgs, exp_avg_sqs, lr=group["lr"], beta1=beta1, beta2=beta2,
              eps=group["eps"], step=group["step"], bias_correction=group["bias_correction"],
              weight_decay=group["weight_decay"], grad_averaging=group["grad_averaging"],
              adam_w_mode=self.adam_w_mode, use_nvlamb=self.use_nvlamb, clip=clip)
