"""apex's ``DistributedDataParallel`` and ``Reducer``, on ``torch.nn.parallel.DistributedDataParallel``."""
import os
import warnings

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ampshim.deprecation import warn_deprecated

__all__ = ["DDP_GRAPH_ENV_VAR", "DistributedDataParallel", "Reducer", "flat_dist_call"]

# How torch's DDP under apex's class learns which parameters get gradients (see the class).
DDP_GRAPH_ENV_VAR = "AMPSHIM_DDP_GRAPH"
_GRAPH_OPTIONS = {"unused": {"find_unused_parameters": True}, "static": {"static_graph": True}}


def _graph_options() -> dict:
    chosen = os.environ.get(DDP_GRAPH_ENV_VAR, "").strip().lower() or "unused"
    if chosen not in _GRAPH_OPTIONS:
        raise ValueError(
            f"{DDP_GRAPH_ENV_VAR}={chosen!r}: use 'unused' (the default: parameters may go without a "
            "gradient in any pass) or 'static' (the same ones every pass; runs reentrant activation "
            "checkpoints, and the first backward pass must synchronise), or unset it.")
    return _GRAPH_OPTIONS[chosen]


def _require_process_group(what):
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{what} needs an initialized default process group, and there is none. Call "
            "torch.distributed.init_process_group(backend=..., init_method=...) in every process "
            "before building it (for one process: world_size=1, rank=0).")


def flat_dist_call(tensors, call, extra_args=(), average=True):
    """Run a collective on ``tensors`` flattened into one buffer per dtype, then copy results back.

    ``all_reduce`` results are divided by the world size when ``average`` is true (apex's behaviour).

    Example::

        >>> flat_dist_call([p.grad for p in model.parameters()], dist.all_reduce)

    Args:
        tensors (list of Tensor): dense tensors, updated in place.
        call (callable): a ``torch.distributed`` collective such as ``dist.all_reduce``.
        extra_args (tuple, optional): extra positional arguments for ``call`` (e.g. ``(0,)``).
        average (bool, optional, default=True): divide all_reduce results by the world size.
    """
    by_dtype = {}
    for t in tensors:
        by_dtype.setdefault((t.dtype, t.device), []).append(t)
    for bucket in by_dtype.values():
        flat = _flatten_dense_tensors(bucket)
        call(flat, *extra_args)
        if call is dist.all_reduce and average:
            flat /= dist.get_world_size()
        for t, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            t.copy_(synced)


def _allreduce_hook(predivide_factor, average, always_fp32):
    """A DDP comm hook doing apex's scaling: ``/predivide`` before, ``*predivide/world`` after."""

    def hook(process_group, bucket):
        group = process_group if process_group is not None else dist.group.WORLD
        world_size = dist.get_world_size(group)
        buffer = bucket.buffer()
        work = buffer.float() if always_fp32 and buffer.dtype != torch.float32 else buffer
        if predivide_factor != 1.0:
            work.div_(predivide_factor)
        future = dist.all_reduce(work, group=group, async_op=True).get_future()

        def finish(fut):
            reduced = fut.value()[0]
            if average and predivide_factor != world_size:
                reduced.mul_(predivide_factor / world_size)
            if reduced is not buffer:
                buffer.copy_(reduced)
            return buffer

        return future.then(finish)

    return hook


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """apex's DDP constructor and switches over native ``torch.nn.parallel.DistributedDataParallel``.

    As in apex: parameters are broadcast from rank 0 at construction, buffers are never broadcast
    (``broadcast_buffers=False``), gradients are averaged over the world (or summed with
    ``gradient_average=False``, pre-divided by ``gradient_predivide_factor``, reduced in fp32 with
    ``allreduce_always_fp32`` — through a communication hook), and
    ``disable_allreduce()``/``enable_allreduce()`` switch gradient synchronisation off and on.
    ``message_size`` (elements) sets the native bucket size. Parameters that get no gradient are
    tolerated as in apex, which bucketed only those the first backward pass reached (with
    ``delay_allreduce``, whatever got one): ``find_unused_parameters=True`` either way. torch's
    DDP then raises at a reentrant activation checkpoint (``checkpoint(block, x)``), whose
    parameters its search of the graph does not see, and where two forward passes run different
    parts before one backward pass (the search starts from the last); ``AMPSHIM_DDP_GRAPH=static`` chooses
    ``static_graph=True`` instead, which runs them where the same parameters get gradients every
    pass and the first pass synchronises (not under ``disable_allreduce()``), as the code stands.
    ``num_allreduce_streams``, ``allreduce_communicators``, ``allreduce_trigger_params``,
    ``retain_allreduce_buffers`` and ``prof`` are accepted for compatibility and have no effect.

    Example::

        >>> torch.distributed.init_process_group("nccl", init_method="env://")
        >>> model = DistributedDataParallel(model.cuda(), delay_allreduce=True)
        >>> loss_fn(model(x), y).backward()  # gradients are averaged over all ranks

    Args:
        module (torch.nn.Module): the model, already on this process's device.
        message_size (int, optional, default=10000000): bucket size in elements.
        delay_allreduce (bool, optional, default=False): accepted; the all-reduce overlaps backward.
        gradient_average (bool, optional, default=True): average (True) or sum (False) gradients.
        gradient_predivide_factor (float, optional, default=1.0): divide before the allreduce.
        allreduce_always_fp32 (bool, optional, default=False): allreduce fp16/bf16 buckets in fp32.
    """

    def __init__(self, module, message_size=10000000, delay_allreduce=False, shared_param=None,
                 allreduce_trigger_params=None, retain_allreduce_buffers=False,
                 allreduce_always_fp32=False, num_allreduce_streams=1, allreduce_communicators=None,
                 gradient_average=True, gradient_predivide_factor=1.0,
                 gradient_average_split_factor=None, prof=False):
        warn_deprecated("apex.parallel.DistributedDataParallel",
                        "torch.nn.parallel.DistributedDataParallel")
        if shared_param is not None:
            raise ValueError(
                "shared_param is no longer supported as an option.  It was misleadingly named from "
                "the start.  It turns out overlapping communication with computation should work "
                "fine with shared parameters.  If you still wish to delay communication to the end "
                "of the backward pass, use delay_allreduce=True|False instead.")
        if num_allreduce_streams > 1 and delay_allreduce:
            raise ValueError("num_allreduce_streams > 1 may only be used with delay_allreduce=False.")
        if allreduce_trigger_params is not None and delay_allreduce:
            raise ValueError("Setting allreduce_trigger_params is only valid if delay_allreduce=False.")
        if gradient_average_split_factor is not None:
            print("Warning:  gradient_average_split_factor has been renamed to "
                  "gradient_predivide_factor.  For now, gradient_average_split_factor will also "
                  "work, but please update to gradient_predivide_factor instead.")
            gradient_predivide_factor = gradient_average_split_factor
        _require_process_group("apex.parallel.DistributedDataParallel")

        element_size = next((p.element_size() for p in module.parameters()), 4)
        with warnings.catch_warnings():
            # torch deprecates broadcast_buffers, but it is still the only way to leave buffers
            # unsynchronised at construction too, which is what apex did.
            warnings.filterwarnings("ignore", message=".*broadcast_buffers", category=FutureWarning)
            super().__init__(module, device_ids=None, broadcast_buffers=False,
                             bucket_cap_mb=message_size * element_size / 2 ** 20,
                             **_graph_options())
        self.message_size = message_size
        self.delay_allreduce = delay_allreduce
        self.gradient_average = gradient_average
        self.gradient_predivide_factor = gradient_predivide_factor
        self.allreduce_always_fp32 = allreduce_always_fp32
        if gradient_predivide_factor != 1.0 or not gradient_average or allreduce_always_fp32:
            self.register_comm_hook(
                None, _allreduce_hook(gradient_predivide_factor, gradient_average, allreduce_always_fp32))

    def enable_allreduce(self):
        """Allreduce gradients in the following backward passes again (the default)."""
        self.require_backward_grad_sync = True

    def disable_allreduce(self):
        """Keep gradients local in the following backward passes, until :meth:`enable_allreduce`."""
        self.require_backward_grad_sync = False


def _tensors_in(value):
    """The tensors in ``value``, a tensor or (nested) lists and tuples of them, in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)


class Reducer:
    """apex's manual gradient averaging: broadcast a module's parameters now, allreduce on ``reduce()``.

    Example::

        >>> reducer = Reducer(model)  # parameters now equal rank 0's
        >>> loss_fn(model(x), y).backward()
        >>> reducer.reduce()  # gradients averaged over all ranks

    Args:
        module_or_grads_list (torch.nn.Module or list of Tensor): a module, whose parameters are
            broadcast from rank 0 and whose existing gradients ``reduce()`` averages; or a fixed
            (possibly nested) list of tensors that ``reduce()`` averages.
    """

    def __init__(self, module_or_grads_list):
        _require_process_group("apex.parallel.Reducer")
        if isinstance(module_or_grads_list, torch.nn.Module):
            self.module = module_or_grads_list
            with torch.no_grad():
                flat_dist_call(list(self.module.parameters()), dist.broadcast, (0,))
        else:
            self.module = None
            self.grads = list(_tensors_in(module_or_grads_list))

    def reduce(self):
        """Average the gradients over all ranks, in place."""
        if self.module is not None:
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        else:
            grads = self.grads
        flat_dist_call(grads, dist.all_reduce)
