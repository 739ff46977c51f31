"""apex's ``FP16_Optimizer``: fp32 master weights and loss scaling around any optimizer (pre-amp API)."""
import torch

from ampshim.fp16_utils.checkpoint import loss_scaler_from_checkpoint
from ampshim.deprecation import warn_deprecated
from ampshim.fp16_utils.fp16util import clip_grad_norm, master_params_to_model_params
from ampshim.scaler import LossScaler

__all__ = ["FP16_Optimizer"]

_HALF_TYPES = (torch.float16, torch.bfloat16)


class FP16_Optimizer:
    """Keep fp32 master copies of a half model's params, scale the loss, and step on the masters.

    At construction every fp16/bf16 parameter with ``requires_grad`` is replaced, in the wrapped
    optimizer's param groups, by an fp32 master copy (its optimizer state moves along); fp32
    parameters are used as they are. ``backward(loss)`` computes ``(loss.float() * scale)``'s
    gradients, then unscales them into the masters and updates the scale (amp's
    :class:`~ampshim.scaler.LossScaler`: static, or ``"dynamic"`` from 2**16); ``step()`` skips
    the update after an overflow, otherwise steps and copies the masters back into the model.
    Works on the device the parameters are on (apex required CUDA).

    Example::

        >>> model = model.half()
        >>> optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
        ...                            dynamic_loss_scale=True)
        >>> optimizer.zero_grad()
        >>> optimizer.backward(loss_fn(model(x.half()), y))
        >>> optimizer.step()

    Args:
        init_optimizer (torch.optim.Optimizer): an optimizer over the model's parameters.
        static_loss_scale (float, optional, default=1.0): the scale, unless dynamic.
        dynamic_loss_scale (bool, optional, default=False): use a dynamic scale.
        dynamic_loss_args (dict, optional): keyword arguments for the dynamic
            :class:`~ampshim.scaler.LossScaler` (``init_scale``, ``scale_window``, ...).
        verbose (bool, optional, default=True): print what is done to each parameter.
    """

    def __init__(self, init_optimizer, static_loss_scale=1.0, dynamic_loss_scale=False,
                 dynamic_loss_args=None, verbose=True):
        warn_deprecated("apex.fp16_utils.FP16_Optimizer", "torch.autocast and torch.amp.GradScaler",
                        rewritten=False)
        self.verbose = verbose
        self.optimizer = init_optimizer
        self.fp16_groups = []
        self.fp32_from_fp16_groups = []
        self.fp32_from_fp32_groups = []
        for index, param_group in enumerate(self.optimizer.param_groups):
            self.maybe_print(f"FP16_Optimizer processing param group {index}:")
            fp16, fp32_from_fp16, fp32 = self._make_masters(param_group)
            self.fp16_groups.append(fp16)
            self.fp32_from_fp16_groups.append(fp32_from_fp16)
            self.fp32_from_fp32_groups.append(fp32)
        self.all_fp16_params = [p for group in self.fp16_groups for p in group]
        self.all_fp32_from_fp16_params = [p for group in self.fp32_from_fp16_groups for p in group]
        self.all_fp32_from_fp32_params = [p for group in self.fp32_from_fp32_groups for p in group]
        # Recast any existing per-param state to the masters' dtype.
        self.optimizer.load_state_dict(self.optimizer.state_dict())

        self.dynamic_loss_scale = bool(dynamic_loss_scale)
        if dynamic_loss_scale:
            self.loss_scaler = LossScaler("dynamic", **(dynamic_loss_args or {}))
        else:
            self.loss_scaler = LossScaler(static_loss_scale)
        self.overflow = False
        self.first_closure_call_this_step = True
        self.clip_grad_norm = clip_grad_norm

    def _make_masters(self, param_group):
        fp16, fp32_from_fp16, fp32 = [], [], []
        params = param_group["params"]
        for i, param in enumerate(params):
            if not param.requires_grad:
                continue
            if param.dtype in _HALF_TYPES:
                self.maybe_print(f"FP16_Optimizer received {param.type()} with {param.size()}")
                master = param.detach().clone().float()
                master.requires_grad = True
                params[i] = master
                if param in self.optimizer.state:
                    self.optimizer.state[master] = self.optimizer.state.pop(param)
                fp16.append(param)
                fp32_from_fp16.append(master)
            elif param.dtype == torch.float32:
                self.maybe_print(f"FP16_Optimizer received {param.type()} with {param.size()}")
                fp32.append(param)
            else:
                raise TypeError(
                    "Wrapped parameters must be either float16/bfloat16 or float32 tensors (apex: "
                    f"torch.cuda.FloatTensor or torch.cuda.HalfTensor). Received {param.type()} of "
                    f"shape {tuple(param.shape)}; convert the model with .half() or .float() first.")
        return fp16, fp32_from_fp16, fp32

    def maybe_print(self, msg):
        if self.verbose:
            print(msg)

    def __getstate__(self):
        raise RuntimeError("FP16_Optimizer should be serialized using state_dict().")

    def __setstate__(self, state):
        raise RuntimeError("FP16_Optimizer should be deserialized using load_state_dict().")

    def zero_grad(self, set_grads_to_None=False):
        """Zero (or set to None) the gradients of the masters and of the model's half params."""
        masters = [p for group in self.optimizer.param_groups for p in group["params"]]
        for param in masters + self.all_fp16_params:
            if set_grads_to_None:
                param.grad = None
            elif param.grad is not None:
                param.grad.detach_()
                param.grad.zero_()

    def _master_params_to_model_params(self):
        for fp16_group, fp32_from_fp16_group in zip(self.fp16_groups, self.fp32_from_fp16_groups):
            master_params_to_model_params(fp16_group, fp32_from_fp16_group)

    def clip_master_grads(self, max_norm, norm_type=2):
        """Clip the masters' gradient norm; returns it, or -1 after an overflow (nothing clipped).

        Args:
            max_norm (float): the largest allowed norm.
            norm_type (float, optional, default=2): the norm's order.
        """
        if self.overflow:
            return -1
        masters = [p for group in self.optimizer.param_groups for p in group["params"]]
        return self.clip_grad_norm(masters, max_norm, norm_type)

    def state_dict(self):
        """apex's layout: the loss scaler, flags, the inner state, the fp32 masters.

        Unlike apex, the loss scaler is saved as plain numbers (``LossScaler.state_dict()``), so
        the checkpoint loads with ``torch.load``'s default ``weights_only=True``.
        """
        return {
            "loss_scaler": self.loss_scaler.state_dict(),
            "dynamic_loss_scale": self.dynamic_loss_scale,
            "overflow": self.overflow,
            "first_closure_call_this_step": self.first_closure_call_this_step,
            "optimizer_state_dict": self.optimizer.state_dict(),
            "fp32_from_fp16": self.fp32_from_fp16_groups,
        }

    def load_state_dict(self, state_dict):
        """Restore from :meth:`state_dict`, ampshim's or real apex's of any year.

        A scaler pickled by apex (``torch.load`` builds it once ``apex`` is imported, even with
        ``weights_only=True``) is converted to the one this optimizer trains with.
        """
        loss_scaler = loss_scaler_from_checkpoint(state_dict["loss_scaler"])  # checked first
        self.optimizer.load_state_dict(state_dict["optimizer_state_dict"])
        self.loss_scaler = loss_scaler
        self.dynamic_loss_scale = state_dict["dynamic_loss_scale"]
        self.overflow = state_dict["overflow"]
        self.first_closure_call_this_step = state_dict["first_closure_call_this_step"]
        with torch.no_grad():
            for current_group, saved_group in zip(self.fp32_from_fp16_groups, state_dict["fp32_from_fp16"]):
                for current, saved in zip(current_group, saved_group):
                    current.copy_(saved)

    def step(self, closure=None):
        """Step on the masters and copy them into the model, unless the last backward overflowed.

        Args:
            closure (callable, optional): must call ``optimizer.backward(loss)`` and return the
                loss; re-run while it overflows.
        """
        if self.overflow:
            print(f"Gradient overflow.  Skipping step, reducing loss scale to "
                  f"{self.loss_scaler.loss_scale()}")
            return None
        if closure is not None:
            retval = self._step_with_closure(closure)
        else:
            retval = self.optimizer.step()
        self._master_params_to_model_params()
        return retval

    def _step_with_closure(self, closure):
        def wrapped_closure():
            if self.first_closure_call_this_step:
                self.first_closure_call_this_step = False
            else:
                # The inner optimizer may evaluate the closure several times per step (LBFGS):
                # the model must see the masters' latest values each time.
                self._master_params_to_model_params()
            loss = closure()
            while self.overflow:
                print(f"OVERFLOW within closure! Skipping step, reducing loss scale to "
                      f"{self.loss_scaler.loss_scale()}")
                loss = closure()
            return loss

        retval = self.optimizer.step(wrapped_closure)
        self.first_closure_call_this_step = True
        return retval

    def backward(self, loss, update_master_grads=True, retain_graph=False):
        """Backward of ``loss.float() * loss_scale``; then, by default, :meth:`update_master_grads`.

        Args:
            loss (Tensor): the loss.
            update_master_grads (bool, optional, default=True): unscale into the masters now
                (pass False to accumulate several backward passes first).
            retain_graph (bool, optional, default=False): as in ``Tensor.backward``.
        """
        scaled_loss = loss.float() * self.loss_scaler.loss_scale()
        scaled_loss.backward(retain_graph=retain_graph)
        if update_master_grads:
            self.update_master_grads()

    def update_master_grads(self):
        """Unscale the model's gradients into the masters' and update the loss scale."""
        self.loss_scaler.clear_overflow_state()
        model_grads, master_grads = [], []
        for model_param, master in zip(self.all_fp16_params, self.all_fp32_from_fp16_params):
            if model_param.grad is not None:
                if master.grad is None:
                    master.grad = torch.empty_like(master)
                model_grads.append(model_param.grad)
                master_grads.append(master.grad)
        if model_grads:
            self.loss_scaler.unscale(model_grads, master_grads, self.loss_scaler.loss_scale())
        fp32_grads = [p.grad for p in self.all_fp32_from_fp32_params if p.grad is not None]
        if fp32_grads:
            self.loss_scaler.unscale(fp32_grads, fp32_grads, self.loss_scaler.loss_scale())
        self.overflow = self.loss_scaler.update_scale()

    def inspect_master_grad_data(self):
        """The masters' gradients per param group (None where absent); None after an overflow."""
        if self.overflow:
            print("Warning:  calling FP16_Optimizer.inspect_master_grad_data while in an overflow "
                  "state.  Gradients are currently invalid (may be inf, nan, or stale).  Returning None.")
            return None
        return [[None if p.grad is None else p.grad.data for p in group["params"]]
                for group in self.optimizer.param_groups]

    @property
    def loss_scale(self):
        return self.loss_scaler.loss_scale()

    @loss_scale.setter
    def loss_scale(self, value):
        self.loss_scaler._loss_scale = value

    @property
    def state(self):
        return self.optimizer.state

    @state.setter
    def state(self, value):
        self.optimizer.state = value

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optimizer.param_groups = value
