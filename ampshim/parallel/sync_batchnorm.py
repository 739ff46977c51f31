"""apex's ``SyncBatchNorm``: ``torch.nn.SyncBatchNorm`` on CUDA, its own group statistics on the CPU (gloo).

Like apex's, the class derives from ``_BatchNorm``, not from ``torch.nn.SyncBatchNorm``: native
``DistributedDataParallel`` refuses any ``torch.nn.SyncBatchNorm`` in a CPU module, which would stop
``convert_syncbn_model`` + DDP on a machine without a GPU.
"""
import torch
import torch.distributed as dist

from ampshim.deprecation import warn_deprecated

__all__ = ["SyncBatchNorm", "convert_syncbn_model", "create_syncbn_process_group"]


class _AllReduceSum(torch.autograd.Function):
    """Sum over the group; the gradient of every rank's input is the sum of all ranks' gradients."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        tensor = tensor.clone()
        dist.all_reduce(tensor, group=group)
        return tensor

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Batch norm whose training statistics cover the whole process group, with apex's signature.

    On CUDA this runs native ``torch.nn.SyncBatchNorm``'s forward (its fused kernels). On the CPU
    (gloo) the sums, sums of squares and counts are all-reduced over the group with differentiable
    all-reduces, since the native module refuses CPU tensors. Without an initialized process group
    it runs as plain batch norm. As apex's CUDA-extension variant, ``forward(input, z=None)`` adds
    ``z`` after normalizing and ``fuse_relu=True`` applies a ReLU last.

    Example::

        >>> bn = SyncBatchNorm(64)
        >>> y = bn(x)  # statistics over the batches of every rank

    Args:
        num_features (int): channels (dimension 1 of the input).
        eps (float, optional, default=1e-5): added to the variance.
        momentum (float, optional, default=0.1): running-stats momentum (None: cumulative average).
        affine (bool, optional, default=True): learn ``weight`` and ``bias``.
        track_running_stats (bool, optional, default=True): keep running mean and variance.
        process_group (ProcessGroup, optional): the group to synchronise over (default: WORLD).
        channel_last (bool, optional, default=False): not supported (AttributeError).
        fuse_relu (bool, optional, default=False): apply ReLU to the output.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, channel_last=False, fuse_relu=False):
        warn_deprecated("apex.parallel.SyncBatchNorm", "torch.nn.SyncBatchNorm")
        if channel_last:
            raise AttributeError(
                "channel_last=True is not supported: ampshim's SyncBatchNorm takes NCHW-shaped "
                "input. Pass channels_last tensors (x.to(memory_format=torch.channels_last)) with "
                "channel_last=False instead.")
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats)
        self.process_group = process_group
        self.channel_last = channel_last
        self.fuse_relu = fuse_relu

    def forward(self, input, z=None):
        if self.training and input.device.type == "cpu" and dist.is_available() and dist.is_initialized():
            output = self._forward_with_group_statistics(input)
        else:
            output = torch.nn.SyncBatchNorm.forward(self, input)
        if z is not None:
            output = output + z
        return torch.relu(output) if self.fuse_relu else output

    # What native SyncBatchNorm's forward expects of its module.
    _check_input_dim = torch.nn.SyncBatchNorm._check_input_dim
    _check_non_zero_input_channels = torch.nn.SyncBatchNorm._check_non_zero_input_channels

    def _forward_with_group_statistics(self, input):
        self._check_input_dim(input)
        group = self.process_group or dist.group.WORLD
        dims = [0] + list(range(2, input.dim()))
        shape = [1, -1] + [1] * (input.dim() - 2)
        x = input.to(torch.promote_types(input.dtype, torch.float32))
        count = torch.full((1,), input.numel() // input.shape[1], dtype=x.dtype)
        totals = _AllReduceSum.apply(torch.cat([x.sum(dims), count]), group)
        n = totals[-1]
        mean = totals[:-1] / n
        centered = x - mean.view(shape)
        var = _AllReduceSum.apply((centered * centered).sum(dims), group) / n  # biased, for normalizing
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), n.item())
        output = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            output = output * self.weight.view(shape) + self.bias.view(shape)
        return output.to(input.dtype)

    @torch.no_grad()
    def _update_running_stats(self, mean, var, n):
        self.num_batches_tracked.add_(1)
        factor = self.momentum if self.momentum is not None else 1.0 / self.num_batches_tracked.item()
        unbiased_var = var * n / max(n - 1, 1)
        self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
        self.running_var.mul_(1 - factor).add_(unbiased_var.to(self.running_var.dtype), alpha=factor)


def convert_syncbn_model(module, process_group=None, channel_last=False):
    """Replace every ``_BatchNorm`` in ``module`` (instance norms excepted) by :class:`SyncBatchNorm`.

    Running statistics are shared with the replaced layers; affine parameters are copied.
    Native equivalent: ``torch.nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)``.

    Example::

        >>> model = convert_syncbn_model(model)
        >>> model = DistributedDataParallel(model)

    Args:
        module (torch.nn.Module): the model (converted in place where possible, and returned).
        process_group (ProcessGroup, optional): group for the new layers (default: WORLD).
        channel_last (bool, optional, default=False): not supported (AttributeError).
    """
    warn_deprecated("apex.parallel.convert_syncbn_model",
                    "torch.nn.SyncBatchNorm.convert_sync_batchnorm")
    return _convert(module, process_group, channel_last)


def _convert(module, process_group, channel_last):
    converted = module
    if isinstance(module, torch.nn.modules.instancenorm._InstanceNorm):
        return module
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
        converted = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                  module.track_running_stats, process_group, channel_last=channel_last)
        converted.running_mean = module.running_mean
        converted.running_var = module.running_var
        converted.num_batches_tracked = module.num_batches_tracked
        if module.affine:
            converted.weight.data = module.weight.data.clone().detach()
            converted.bias.data = module.bias.data.clone().detach()
        converted.train(module.training)
    for name, child in module.named_children():
        converted.add_module(name, _convert(child, process_group, channel_last))
    return converted


def create_syncbn_process_group(group_size):
    """Split the world into consecutive groups of ``group_size`` ranks; return this rank's group.

    Every rank must call it (all groups are created everywhere). ``group_size=0`` returns None
    (meaning WORLD).

    Example::

        >>> group = create_syncbn_process_group(4)  # ranks 0-3, 4-7, ...
        >>> model = convert_syncbn_model(model, process_group=group)

    Args:
        group_size (int): ranks per group; must divide the world size.
    """
    if group_size == 0:
        return None
    world_size = dist.get_world_size()
    if group_size > world_size or world_size % group_size != 0:
        raise ValueError(f"create_syncbn_process_group(group_size={group_size!r}) needs a group size "
                         f"that divides the world size {world_size}.")
    rank = dist.get_rank()
    mine = None
    for start in range(0, world_size, group_size):
        group = dist.new_group(ranks=list(range(start, start + group_size)))
        if start <= rank < start + group_size:
            mine = group
    return mine
