"""apex's ``multi_tensor_applier``: honestly unavailable, since there is no ``amp_C`` extension.

Code that branches on ``multi_tensor_applier.available`` takes its pure-PyTorch path; code that
calls it unconditionally gets a clear error naming the native replacement.
"""

__all__ = ["MultiTensorApply", "multi_tensor_applier"]


class MultiTensorApply:
    """Stand-in for apex's launcher of fused ``amp_C`` kernels; ``available`` is always False.

    Example::

        >>> from apex.multi_tensor_apply import multi_tensor_applier
        >>> if multi_tensor_applier.available:
        ...     multi_tensor_applier(amp_C.multi_tensor_scale, buf, [src, dst], 1.0)
        ... else:
        ...     torch._foreach_mul_(src, 1.0)

    Args:
        chunk_size (int): elements per kernel chunk; kept for apex compatibility, unused.
    """

    available = False
    warned = False
    import_err = ModuleNotFoundError(
        "No module named 'amp_C': ampshim runs apex code on native PyTorch and has no fused CUDA "
        "extension."
    )

    def __init__(self, chunk_size):
        self.chunk_size = chunk_size

    def check_avail(self):
        raise RuntimeError(
            "multi_tensor_applier was called, but it is not available: ampshim provides no 'amp_C' "
            "fused kernels. Check `multi_tensor_applier.available` before calling it, and use "
            "torch._foreach_* ops (e.g. torch._foreach_mul_, torch._foreach_norm) instead. "
            f"Original import error: {self.import_err}"
        )

    def __call__(self, op, noop_flag_buffer, tensor_lists, *args):
        self.check_avail()


multi_tensor_applier = MultiTensorApply(2048 * 32)
