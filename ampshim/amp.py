"""``apex.amp``: apex's automatic mixed precision, on native ``torch.amp``.

A real module with apex's top-level functions (code probes ``'state_dict' in amp.__dict__``).
apex's submodules that scripts reach as attributes (``amp.frontend``, ``amp.scaler``,
``amp.handle``, ``amp.opt``, ``amp._initialize``, ``amp._process_optimizer``) load on first use.
"""
import importlib

from ampshim import lists
from ampshim.cast_decorators import disable_casts, float_function, half_function, promote_function
from ampshim.casting import register_float_function, register_half_function, register_promote_function
from ampshim.handle import init
from ampshim.initialize import initialize
from ampshim.scale_loss import scale_loss
from ampshim.state import _amp_state, load_state_dict, master_params, state_dict

__version__ = "0.1.0"

__all__ = ["init", "half_function", "float_function", "promote_function",
           "register_half_function", "register_float_function", "register_promote_function",
           "scale_loss", "disable_casts", "initialize", "state_dict", "load_state_dict",
           "master_params", "_amp_state", "lists", "__version__"]

_SUBMODULES = {
    "frontend": "ampshim.opt_levels",
    "scaler": "ampshim.scaler",
    "handle": "ampshim.handle",
    "opt": "ampshim.handle",
    "_initialize": "ampshim.initialize",
    "_process_optimizer": "ampshim.optimizer",
}


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module 'apex.amp' has no attribute {name!r}")
