"""apex's manual mixed-precision helpers: half models with fp32 batch norm, fp32 master params."""
import torch
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ampshim.deprecation import warn_deprecated

__all__ = ["tofp16", "BN_convert_float", "network_to_half", "convert_module", "convert_network",
           "FP16Model", "backwards_debug_hook", "prep_param_lists", "model_grads_to_master_grads",
           "master_params_to_model_params", "to_python_float", "clip_grad_norm"]



def _is_affine_batchnorm(module):
    return isinstance(module, nn.modules.batchnorm._BatchNorm) and module.affine is True


class tofp16(nn.Module):
    """A layer that casts its input to float16 (the first layer of :func:`network_to_half`)."""

    def forward(self, input):
        return input.half()


def BN_convert_float(module):
    """Convert every affine batch-norm layer in ``module`` back to float32, in place.

    Example::

        >>> model = BN_convert_float(model.half())

    Args:
        module (torch.nn.Module): the model.
    """
    if _is_affine_batchnorm(module):
        module.float()
    for child in module.children():
        BN_convert_float(child)
    return module


def network_to_half(network):
    """``nn.Sequential(tofp16(), BN_convert_float(network.half()))``: an fp16 model taking any input.

    State-dict keys gain a ``1.`` prefix (the model is the second layer of the Sequential).

    Example::

        >>> model = network_to_half(model)
        >>> output = model(images)  # images are cast to float16 by the first layer

    Args:
        network (torch.nn.Module): the model, converted in place.
    """
    return nn.Sequential(tofp16(), BN_convert_float(network.half()))


def convert_module(module, dtype):
    """Cast the floating-point parameters (and their grads) and buffers of ``module`` itself.

    Submodules are not visited. Parameter objects are kept (their ``.data`` is replaced).

    Example::

        >>> convert_module(model.fc, torch.float16)

    Args:
        module (torch.nn.Module): the module whose own tensors are cast.
        dtype (torch.dtype): the floating-point dtype to cast to.
    """
    for param in module.parameters(recurse=False):
        if param.is_floating_point():
            param.data = param.data.to(dtype=dtype)
        if param.grad is not None and param.grad.is_floating_point():
            param.grad.data = param.grad.data.to(dtype=dtype)
    for buf in module.buffers(recurse=False):
        if buf.is_floating_point():
            buf.data = buf.data.to(dtype=dtype)


def convert_network(network, dtype):
    """Cast every module of ``network`` to ``dtype`` except affine batch norms, in place.

    Non-affine batch norms are cast too; RNNs get ``flatten_parameters()``.

    Example::

        >>> model = convert_network(model, torch.float16)

    Args:
        network (torch.nn.Module): the model.
        dtype (torch.dtype): the floating-point dtype to cast to.
    """
    for module in network.modules():
        if _is_affine_batchnorm(module):
            continue
        convert_module(module, dtype)
        if isinstance(module, nn.RNNBase):
            module.flatten_parameters()
    return network


class FP16Model(nn.Module):
    """Wrap a model converted to float16 (affine batch norms kept fp32); inputs are cast to half.

    Only positional inputs are supported, as in apex. State-dict keys gain a ``network.`` prefix.

    Example::

        >>> model = FP16Model(model)
        >>> output = model(images)  # float16

    Args:
        network (torch.nn.Module): the model, converted in place.
    """

    def __init__(self, network):
        warn_deprecated("apex.fp16_utils.FP16Model", "torch.autocast (or model.half())",
                        rewritten=False)
        super().__init__()
        self.network = convert_network(network, dtype=torch.half)

    def forward(self, *inputs):
        inputs = tuple(t.half() for t in inputs)
        return self.network(*inputs)


def backwards_debug_hook(grad):
    """A gradient hook that fails: master params must never receive gradients from backward."""
    raise RuntimeError("master_params received a gradient in the backward pass!")


def prep_param_lists(model, flat_master=False):
    """Return ``(model_params, master_params)``: trainable params and fp32 copies of them.

    Example::

        >>> model_params, master_params = prep_param_lists(model)
        >>> optimizer = torch.optim.SGD(master_params, lr=0.1)

    Args:
        model (torch.nn.Module): the (half) model.
        flat_master (bool, optional, default=False): one flat fp32 ``nn.Parameter`` holding all
            params, with a pre-allocated ``.grad`` (needs all params of one dtype).
    """
    model_params = [param for param in model.parameters() if param.requires_grad]
    if flat_master:
        try:
            flat = _flatten_dense_tensors([param.data for param in model_params]).float()
        except RuntimeError:
            print("Error in prep_param_lists:  model may contain a mixture of parameters of "
                  "different types.  Use flat_master=False, or use F16_Optimizer.")
            raise
        master = nn.Parameter(flat)
        master.grad = master.new_empty(master.size())
        return model_params, [master]
    master_params = [param.detach().clone().float() for param in model_params]
    for param in master_params:
        param.requires_grad = True
    return model_params, master_params


def model_grads_to_master_grads(model_params, master_params, flat_master=False):
    """Copy the model's gradients into the master params' (allocating them as needed).

    A model param without a gradient leaves its master's gradient None.

    Example::

        >>> model_grads_to_master_grads(model_params, master_params)

    Args:
        model_params (list of Tensor): from :func:`prep_param_lists`.
        master_params (list of Tensor): from :func:`prep_param_lists`.
        flat_master (bool, optional, default=False): ``master_params`` holds one flat tensor.
    """
    if flat_master:
        master_params[0].grad.data.copy_(_flatten_dense_tensors([p.grad.data for p in model_params]))
        return
    for model, master in zip(model_params, master_params):
        if model.grad is None:
            master.grad = None
            continue
        if master.grad is None:
            master.grad = torch.empty_like(master)
        master.grad.data.copy_(model.grad.data)


def master_params_to_model_params(model_params, master_params, flat_master=False):
    """Copy the master params' values back into the model's params.

    Example::

        >>> optimizer.step()
        >>> master_params_to_model_params(model_params, master_params)

    Args:
        model_params (list of Tensor): from :func:`prep_param_lists`.
        master_params (list of Tensor): from :func:`prep_param_lists`.
        flat_master (bool, optional, default=False): ``master_params`` holds one flat tensor.
    """
    if flat_master:
        masters = _unflatten_dense_tensors(master_params[0].data, model_params)
    else:
        masters = [master.data for master in master_params]
    for model, master in zip(model_params, masters):
        model.data.copy_(master)


def to_python_float(t):
    """``t.item()`` for a tensor, ``t[0]`` for a sequence.

    Example::

        >>> total += to_python_float(loss)

    Args:
        t (Tensor or sequence): a one-element value.
    """
    if hasattr(t, "item"):
        return t.item()
    return t[0]


clip_grad_norm = torch.nn.utils.clip_grad_norm_
