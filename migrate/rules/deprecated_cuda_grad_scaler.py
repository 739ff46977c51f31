"""AMP021: ``torch.cuda.amp.GradScaler(...)`` -> ``torch.amp.GradScaler("cuda", ...)``."""
from __future__ import annotations

import libcst as cst

from migrate.rule import Invalid, Valid
from migrate.rules._deprecated_spelling import DeprecatedSpelling, string_arg


class DeprecatedCudaGradScaler(DeprecatedSpelling):
    """What it does:
    Replaces ``torch.cuda.amp.GradScaler(args...)`` with ``torch.amp.GradScaler("cuda", args...)``,
    however ``GradScaler`` was imported.

    Why is this bad?
    ``torch.cuda.amp.GradScaler`` is deprecated since PyTorch 2.4 and warns when constructed.

    Fix safety:
    Safe: the native class takes the device first and then the same parameters in the same order,
    and the deprecated class is a thin subclass of it. A use that is not a call (``isinstance``,
    a base class) is only reported: the native class is wider than the deprecated one there.
    """

    CODE = "AMP021"
    FIX = 'torch.cuda.amp.GradScaler -> torch.amp.GradScaler("cuda")'
    MESSAGE = "`torch.cuda.amp.GradScaler` is deprecated; use `torch.amp.GradScaler(\"cuda\", ...)`"
    TRIGGERS = ("GradScaler",)
    RENAMES = {"torch.cuda.amp.GradScaler": "torch.amp.GradScaler"}

    VALID = [
        Valid('import torch\n\nscaler = torch.amp.GradScaler("cuda")\n'),
        Valid("from torch.amp import GradScaler\nscaler = GradScaler('cpu', init_scale=1024)\n"),
        Valid("class GradScaler:\n    pass\nscaler = GradScaler()\n"),
    ]
    INVALID = [
        Invalid(
            "import torch\n\nscaler = torch.cuda.amp.GradScaler(init_scale=2.0**14, enabled=args.fp16)\n",
            'import torch\n\nscaler = torch.amp.GradScaler("cuda", init_scale=2.0**14, enabled=args.fp16)\n',
        ),
        Invalid(
            "from torch.cuda.amp import GradScaler, autocast\nscaler = GradScaler(1024.0)\n",
            'from torch.cuda.amp import autocast\nimport torch\n\nscaler = torch.amp.GradScaler("cuda", 1024.0)\n',
        ),
        Invalid(
            "from torch.cuda import amp\nscaler = amp.GradScaler()\n",
            'import torch\n\nscaler = torch.amp.GradScaler("cuda")\n',
        ),
        Invalid("import torch\nassert isinstance(scaler, torch.cuda.amp.GradScaler)\n"),
    ]

    def fixed_args(self, call: cst.Call) -> list[cst.Arg] | None:
        return [string_arg("cuda"), *call.args]
