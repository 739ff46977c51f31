"""apex's ``FusedAdam``: AdamW by default (``adam_w_mode=True``), Adam with L2 penalty otherwise."""
import torch
from torch.optim.adam import adam as _adam_step

from ampshim.optimizers._base import REDUCED_AND_FP32, _as_fp32, _fp32_state, _FusedOptimizer, _write_back

__all__ = ["FusedAdam"]


class FusedAdam(_FusedOptimizer):
    """Adam/AdamW with apex's signature and defaults, computed by torch's own Adam.

    The update is torch's functional Adam (its fused kernel on CUDA, foreach ops elsewhere):
    ``torch.optim.AdamW`` when ``adam_w_mode=True`` (apex's default!) and ``torch.optim.Adam``
    (weight decay added to the gradient) when ``adam_w_mode=False``; ``bias_correction=False``,
    which torch lacks, uses the same formula without the correction. The math runs in fp32 for
    fp16/bf16 parameters, with fp32 ``exp_avg``/``exp_avg_sq`` state; the step count is
    ``param_group['step']``, as in apex checkpoints. ``zero_grad()`` sets grads to None unless
    ``set_grad_none=False``.

    Example::

        >>> optimizer = FusedAdam(model.parameters(), lr=1e-3, weight_decay=0.01)
        >>> loss_fn(model(x), y).backward()
        >>> optimizer.step()
        >>> optimizer.zero_grad()

    Args:
        params (iterable): parameters or param groups.
        lr (float, optional, default=1e-3): learning rate.
        bias_correction (bool, optional, default=True): divide the moments by ``1 - beta**step``.
        betas (Tuple[float, float], optional, default=(0.9, 0.999)): moment decay rates.
        eps (float, optional, default=1e-8): added to the denominator.
        adam_w_mode (bool, optional, default=True): decoupled weight decay (AdamW); False = L2.
        weight_decay (float, optional, default=0): weight decay.
        amsgrad (bool, optional, default=False): not supported (RuntimeError), as in apex.
        set_grad_none (bool, optional, default=True): ``zero_grad()`` sets grads to None.
        capturable (bool, optional, default=False): accepted; the update never syncs with the host.
        master_weights (bool, optional, default=False): keep fp32 master copies of fp16/bf16
            parameters in the optimizer state (apex requires ``capturable=True`` with it).
    """

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0., amsgrad=False, set_grad_none=True,
                 capturable=False, master_weights=False, **removed):
        if removed:
            raise TypeError(
                f"FusedAdam got unexpected keyword arguments {sorted(removed)!r}. apex removed "
                "max_grad_norm and eps_inside_sqrt from FusedAdam in 2019: clip gradients with "
                "torch.nn.utils.clip_grad_norm_ before step() instead.")
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant; use "
                               "torch.optim.Adam(amsgrad=True) for it.")
        if master_weights and not capturable:
            raise RuntimeError("FusedAdam supports master_weights=True only together with "
                               "capturable=True (as apex did); pass both.")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults, set_grad_none)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.capturable = capturable
        self.master_weights = master_weights

    @torch.no_grad()
    def step(self, closure=None, grads=None, output_params=None, scale=None, grad_norms=None):
        """Perform one optimization step.

        Args:
            closure (callable, optional): re-evaluates the model and returns the loss.
        """
        if any(arg is not None for arg in (grads, output_params, scale, grad_norms)):
            raise RuntimeError(
                "FusedAdam has been updated.  Simply initialize it identically to torch.optim.Adam, "
                "and call step() with no arguments.")
        return super().step(closure)

    def _step(self):
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            params = self._params_with_grad(group, REDUCED_AND_FP32)
            if params:
                self._update(group, params)

    def _update(self, group, params):
        states = [self.state[p] for p in params]
        exp_avgs = [_fp32_state(s, "exp_avg", p) for s, p in zip(states, params)]
        exp_avg_sqs = [_fp32_state(s, "exp_avg_sq", p) for s, p in zip(states, params)]
        if self.master_weights:
            for s, p in zip(states, params):
                master = s.get("master_param")
                if master is None or master.dtype != torch.float32:  # new, or cast by a state-dict load
                    s["master_param"] = (p if master is None else master).detach().float()
            weights = [s["master_param"] for s in states]
        else:
            weights = _as_fp32(params)
        grads = _as_fp32([p.grad for p in params])
        if group["bias_correction"]:
            _torch_adam(weights, grads, exp_avgs, exp_avg_sqs, group, decoupled=bool(self.adam_w_mode))
        else:
            _adam_without_bias_correction(weights, grads, exp_avgs, exp_avg_sqs, group,
                                          decoupled=bool(self.adam_w_mode))
        _write_back(params, weights)


def _torch_adam(weights, grads, exp_avgs, exp_avg_sqs, group, decoupled):
    """torch's own Adam/AdamW step (its fused kernel on CUDA, foreach ops elsewhere)."""
    fused = all(w.is_cuda for w in weights)
    # torch counts steps per tensor and increments them itself; apex counts per group.
    steps = [torch.tensor(float(group["step"] - 1), device=w.device if fused else None) for w in weights]
    beta1, beta2 = group["betas"]
    _adam_step(weights, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=not fused, fused=fused,
               decoupled_weight_decay=decoupled, amsgrad=False, beta1=beta1, beta2=beta2,
               lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)


def _adam_without_bias_correction(weights, grads, exp_avgs, exp_avg_sqs, group, decoupled):
    """apex's ``bias_correction=False``, which torch does not offer: ``p -= lr * m / (sqrt(v) + eps)``."""
    beta1, beta2 = group["betas"]
    lr, wd = group["lr"], group["weight_decay"]
    if wd != 0 and not decoupled:
        grads = torch._foreach_add(grads, weights, alpha=wd)  # Adam: L2 penalty in the gradient
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    if wd != 0 and decoupled:
        torch._foreach_mul_(weights, 1 - lr * wd)  # AdamW: decoupled decay
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denom, group["eps"])
    torch._foreach_addcdiv_(weights, exp_avgs, denom, -lr)
