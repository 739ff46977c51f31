"""AMP025: ``torch.get_autocast_gpu_dtype()`` and friends -> the device-taking ``torch`` functions."""
from __future__ import annotations

import libcst as cst

from migrate.rule import Invalid, Valid
from migrate.rules._deprecated_spelling import DeprecatedSpelling, string_arg

# deprecated function -> (native function, the device its first argument now names)
_NATIVE = {
    "torch.is_autocast_cpu_enabled": ("torch.is_autocast_enabled", "cpu"),
    "torch.set_autocast_cpu_enabled": ("torch.set_autocast_enabled", "cpu"),
    "torch.get_autocast_cpu_dtype": ("torch.get_autocast_dtype", "cpu"),
    "torch.set_autocast_cpu_dtype": ("torch.set_autocast_dtype", "cpu"),
    "torch.get_autocast_gpu_dtype": ("torch.get_autocast_dtype", "cuda"),
    "torch.set_autocast_gpu_dtype": ("torch.set_autocast_dtype", "cuda"),
}


class DeprecatedAutocastState(DeprecatedSpelling):
    """What it does:
    Replaces the per-device autocast state functions with the ones that take the device:
    ``torch.get_autocast_gpu_dtype()`` -> ``torch.get_autocast_dtype("cuda")``,
    ``torch.set_autocast_cpu_dtype(d)`` -> ``torch.set_autocast_dtype("cpu", d)``,
    ``torch.is_autocast_cpu_enabled()`` -> ``torch.is_autocast_enabled("cpu")``,
    ``torch.set_autocast_cpu_enabled(b)`` -> ``torch.set_autocast_enabled("cpu", b)``.

    Why is this bad?
    The per-device functions are deprecated since PyTorch 2.4 and warn on every call.

    Fix safety:
    Safe: each is the device-taking function called for its device.
    A use that is not a call is only reported.
    """

    CODE = "AMP025"
    FIX = 'per-device autocast state functions -> those taking the device'
    MESSAGE = "per-device autocast state functions are deprecated; pass the device instead"
    TRIGGERS = ("autocast",)
    RENAMES = {deprecated: native for deprecated, (native, _) in _NATIVE.items()}

    VALID = [
        Valid('import torch\ndtype = torch.get_autocast_dtype("cuda")\n'),
        Valid("def get_autocast_gpu_dtype():\n    return None\nget_autocast_gpu_dtype()\n"),
    ]
    INVALID = [
        Invalid(
            "import torch\n\nif torch.is_autocast_cpu_enabled():\n    dtype = torch.get_autocast_cpu_dtype()\n",
            'import torch\n\nif torch.is_autocast_enabled("cpu"):\n    dtype = torch.get_autocast_dtype("cpu")\n',
        ),
        Invalid(
            "import torch\ntorch.set_autocast_gpu_dtype(torch.float16)\ntorch.set_autocast_cpu_enabled(False)\n",
            'import torch\ntorch.set_autocast_dtype("cuda", torch.float16)\ntorch.set_autocast_enabled("cpu", False)\n',
        ),
        Invalid("import torch\nquery = torch.get_autocast_gpu_dtype\n"),
    ]

    def fixed_args(self, call: cst.Call) -> list[cst.Arg] | None:
        _, device = _NATIVE[self._deprecated_name(call.func)]
        return [string_arg(device), *call.args]
