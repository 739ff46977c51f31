"""apex's ``FusedMixedPrecisionLamb``: LAMB on fp32 master weights, driven by ``GradScaler``."""
import torch

from ampshim.optimizers._base import _evaluate, _fp32_state, _write_back
from ampshim.optimizers.fused_lamb import FusedLAMB

__all__ = ["FusedMixedPrecisionLamb"]


class FusedMixedPrecisionLamb(FusedLAMB):
    """:class:`FusedLAMB` keeping fp32 masters of ``reduced_precision_dtype`` parameters.

    The learning rate and step count live in each param group as tensors on the parameters'
    device, and the moments are fp32. Passed to ``torch.amp.GradScaler.step``, it unscales the
    gradients and checks them for inf/NaN through the scaler itself (``_step_supports_amp_scaling``)
    and skips the whole step on overflow.

    Example::

        >>> model.to(torch.bfloat16)
        >>> optimizer = FusedMixedPrecisionLamb(model.parameters(), reduced_precision_dtype=torch.bfloat16)
        >>> scaler = torch.amp.GradScaler()
        >>> scaler.scale(loss_fn(model(x), y)).backward()
        >>> scaler.step(optimizer)
        >>> scaler.update()

    Args:
        params (iterable): parameters or param groups.
        lr (float, optional, default=1e-3): learning rate.
        step (int, optional, default=0): initial step count.
        reduced_precision_dtype (torch.dtype, optional): parameters of this dtype get fp32 masters.
        Others: as :class:`FusedLAMB` (``bias_correction, betas, eps, weight_decay, amsgrad,
            adam_w_mode, grad_averaging, max_grad_norm, use_nvlamb``).
    """

    _step_supports_amp_scaling = True

    def __init__(self, params, lr=1e-3, step=0, bias_correction=True, betas=(0.9, 0.999), eps=1e-6,
                 weight_decay=0.01, amsgrad=False, adam_w_mode=True, grad_averaging=True,
                 max_grad_norm=1.0, use_nvlamb=False, reduced_precision_dtype=None):
        super().__init__(params, lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                         weight_decay=weight_decay, amsgrad=amsgrad, adam_w_mode=adam_w_mode,
                         grad_averaging=grad_averaging, set_grad_none=True,
                         max_grad_norm=max_grad_norm, use_nvlamb=use_nvlamb)
        device = self.param_groups[0]["params"][0].device
        for group in self.param_groups:
            group["lr"] = torch.as_tensor(group["lr"], dtype=torch.float32, device=device)
            group["step"] = torch.tensor([group.get("step", step)], dtype=torch.int, device=device)
        self.reduced_precision_dtype = reduced_precision_dtype
        self.param_groups_full_precision = []
        self._add_masters()

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if hasattr(self, "param_groups_full_precision"):  # not during the base constructor
            self._add_masters()

    def _add_masters(self):
        """fp32 masters (None where not needed) for the param groups that have none yet."""
        for group in self.param_groups[len(self.param_groups_full_precision):]:
            self.param_groups_full_precision.append(
                {"params": [p.detach().float() if p.dtype == self.reduced_precision_dtype else None
                            for p in group["params"]]})

    @torch.no_grad()
    def step(self, closure=None, grad_scaler=None):
        """Perform one optimization step; skipped entirely if ``grad_scaler`` found inf/NaN grads.

        Args:
            closure (callable, optional): re-evaluates the model and returns the loss.
            grad_scaler (torch.amp.GradScaler, optional): passed by ``GradScaler.step``.
        """
        loss = _evaluate(closure)
        if grad_scaler is None or not self._scaler_found_inf(grad_scaler):
            self._step()
        return loss

    def _scaler_found_inf(self, grad_scaler):
        """Unscale the grads through ``grad_scaler`` (unless done already) and report an overflow."""
        from torch.amp.grad_scaler import OptState

        if grad_scaler._per_optimizer_states[id(self)]["stage"] is OptState.READY:
            grad_scaler.unscale_(self)
        found = grad_scaler._per_optimizer_states[id(self)]["found_inf_per_device"].values()
        return bool(sum(f.item() for f in found))

    def _update(self, index, group, params, clip):
        all_masters = self.param_groups_full_precision[index]["params"]
        master_of = {id(p): m for p, m in zip(group["params"], all_masters)}
        weights = [master_of[id(p)] if master_of[id(p)] is not None else p for p in params]
        exp_avgs = [_fp32_state(self.state[p], "exp_avg", p) for p in params]
        exp_avg_sqs = [_fp32_state(self.state[p], "exp_avg_sq", p) for p in params]
        grads = [p.grad.float() for p in params]
        group_view = dict(group, step=int(group["step"]), lr=float(group["lr"]))
        self._lamb(group_view, weights, grads, exp_avgs, exp_avg_sqs, clip)
        _write_back(params, weights)

