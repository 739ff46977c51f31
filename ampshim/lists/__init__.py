"""apex's O1 cast lists (``amp.lists``): which functions run in which precision.

The lists are plain, mutable Python lists with apex's names. ampshim's O1 runs on native autocast,
whose own op policies already cover the shipped entries; a user's edit to a list (or an
``amp.register_*_function`` call) is applied at initialization as a small wrapper on just that
function.
"""
from ampshim.lists import functional_overrides, tensor_overrides, torch_overrides

__all__ = ["functional_overrides", "torch_overrides", "tensor_overrides"]
