"""AMP024: ``torch.cpu.amp.GradScaler(...)`` -> ``torch.amp.GradScaler("cpu", ...)``."""
from __future__ import annotations

import libcst as cst

from migrate.rule import Invalid, Valid
from migrate.rules._deprecated_spelling import DeprecatedSpelling, string_arg


class DeprecatedCpuGradScaler(DeprecatedSpelling):
    """What it does:
    Replaces ``torch.cpu.amp.GradScaler(args...)`` with ``torch.amp.GradScaler("cpu", args...)``,
    however ``GradScaler`` was imported.

    Why is this bad?
    ``torch.cpu.amp.GradScaler`` is deprecated since PyTorch 2.4 and warns when constructed.

    Fix safety:
    Safe: the native class takes the device first and then the same parameters in the same order.
    A use that is not a call (``isinstance``, a base class) is only reported.
    """

    CODE = "AMP024"
    FIX = 'torch.cpu.amp.GradScaler -> torch.amp.GradScaler("cpu")'
    MESSAGE = "`torch.cpu.amp.GradScaler` is deprecated; use `torch.amp.GradScaler(\"cpu\", ...)`"
    TRIGGERS = ("GradScaler",)
    RENAMES = {"torch.cpu.amp.GradScaler": "torch.amp.GradScaler"}

    VALID = [
        Valid('import torch\nscaler = torch.amp.GradScaler("cpu")\n'),
    ]
    INVALID = [
        Invalid(
            "import torch\n\nscaler = torch.cpu.amp.GradScaler(growth_interval=100)\n",
            'import torch\n\nscaler = torch.amp.GradScaler("cpu", growth_interval=100)\n',
        ),
        Invalid("import torch\nassert isinstance(scaler, torch.cpu.amp.GradScaler)\n"),
    ]

    def fixed_args(self, call: cst.Call) -> list[cst.Arg] | None:
        return [string_arg("cpu"), *call.args]
