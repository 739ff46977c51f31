"""apex's ``LARC``: layer-wise adaptive rate scaling (or clipping) around any optimizer."""
import torch

__all__ = ["LARC"]


class LARC:
    """Wrap ``optimizer`` so each parameter's gradient is scaled by its layer-wise adaptive rate.

    Before each inner ``step()``, for every parameter with a gradient and non-zero norms,
    ``local_lr = trust_coefficient * ||p|| / (||g|| + weight_decay * ||p|| + eps)``; with
    ``clip=True`` it becomes ``min(local_lr / lr, 1)`` (so the effective rate never exceeds
    ``lr``). The gradient becomes ``(g + weight_decay * p) * local_lr``, and the inner optimizer runs
    with its weight decay temporarily set to 0. LARC is a wrapper, not an ``Optimizer``: it
    forwards ``state``, ``param_groups``, ``state_dict()``, ``zero_grad()`` and the rest.

    Example::

        >>> optimizer = LARC(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        >>> loss_fn(model(x), y).backward()
        >>> optimizer.step()

    Args:
        optimizer (torch.optim.Optimizer): the optimizer to wrap.
        trust_coefficient (float, optional, default=0.02): the trust coefficient.
        clip (bool, optional, default=True): clip the local rate to ``lr`` (LARC) rather than
            scale it (LARS).
        eps (float, optional, default=1e-8): added to the denominator.
    """

    def __init__(self, optimizer, trust_coefficient=0.02, clip=True, eps=1e-8):
        self.optim = optimizer
        self.trust_coefficient = trust_coefficient
        self.eps = eps
        self.clip = clip

    @property
    def state(self):
        return self.optim.state

    def __repr__(self):
        return self.optim.__repr__()

    @property
    def param_groups(self):
        return self.optim.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optim.param_groups = value

    def state_dict(self):
        return self.optim.state_dict()

    def load_state_dict(self, state_dict):
        self.optim.load_state_dict(state_dict)

    def zero_grad(self, *args, **kwargs):
        self.optim.zero_grad(*args, **kwargs)

    def add_param_group(self, param_group):
        self.optim.add_param_group(param_group)

    def step(self):
        """Scale every gradient by its adaptive rate, then run the inner optimizer's ``step()``."""
        with torch.no_grad():
            weight_decays = []
            for group in self.optim.param_groups:
                weight_decay = group.get("weight_decay", 0)
                weight_decays.append(weight_decay)
                group["weight_decay"] = 0
                for p in group["params"]:
                    if p.grad is not None:
                        self._scale_gradient(p, group["lr"], weight_decay)
        try:
            self.optim.step()
        finally:
            for group, weight_decay in zip(self.optim.param_groups, weight_decays):
                group["weight_decay"] = weight_decay

    def _scale_gradient(self, p, lr, weight_decay):
        param_norm = torch.linalg.vector_norm(p)
        grad_norm = torch.linalg.vector_norm(p.grad)
        if param_norm == 0 or grad_norm == 0:
            return
        local_lr = self.trust_coefficient * param_norm / (grad_norm + param_norm * weight_decay + self.eps)
        if self.clip:
            local_lr = torch.clamp(local_lr / lr, max=1)
        p.grad.add_(p, alpha=weight_decay)
        p.grad.mul_(local_lr)
