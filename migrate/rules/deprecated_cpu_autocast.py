"""AMP023: ``torch.cpu.amp.autocast(...)`` -> ``torch.amp.autocast("cpu", ...)``."""
from __future__ import annotations

import libcst as cst

from migrate.rule import Invalid, Valid
from migrate.rules._deprecated_spelling import DeprecatedSpelling, as_keywords, string_arg

# torch.cpu.amp.autocast's parameters in order; torch.amp.autocast takes device_type first and
# dtype second, so positional arguments are passed by keyword.
_PARAMETERS = ("enabled", "dtype", "cache_enabled")


class DeprecatedCpuAutocast(DeprecatedSpelling):
    """What it does:
    Replaces ``torch.cpu.amp.autocast(args...)`` with ``torch.amp.autocast("cpu", args...)``, in
    every spelling (call, ``with`` item, decorator; ``from torch.cpu.amp import autocast``).

    Why is this bad?
    ``torch.cpu.amp.autocast`` is deprecated since PyTorch 2.4 and warns on every use.

    Fix safety:
    Safe: the native form with device type ``"cpu"`` has the same defaults (bfloat16, cache on).
    Positional arguments are passed by keyword, since the native signature orders them differently.
    A call with ``*args``, a name that may also be something else, and a use that is not a call
    are only reported.
    """

    CODE = "AMP023"
    FIX = 'torch.cpu.amp.autocast -> torch.amp.autocast("cpu")'
    MESSAGE = "`torch.cpu.amp.autocast` is deprecated; use `torch.amp.autocast(\"cpu\", ...)`"
    TRIGGERS = ("autocast",)
    RENAMES = {"torch.cpu.amp.autocast": "torch.amp.autocast"}

    VALID = [
        Valid('import torch\nwith torch.amp.autocast("cpu", dtype=torch.bfloat16):\n    pass\n'),
        Valid("import torch\nwith torch.cuda.amp.autocast():\n    pass\n"),
    ]
    INVALID = [
        Invalid(
            "import torch\n\nwith torch.cpu.amp.autocast(dtype=torch.bfloat16):\n    out = model(x)\n",
            'import torch\n\nwith torch.amp.autocast("cpu", dtype=torch.bfloat16):\n    out = model(x)\n',
        ),
        Invalid(
            "import torch\nfrom torch.cpu.amp import autocast\n\nwith autocast(args.amp):\n    pass\n",
            'import torch\n\nwith torch.amp.autocast("cpu", enabled=args.amp):\n    pass\n',
        ),
        Invalid("import torch\nwith torch.cpu.amp.autocast(*flags):\n    pass\n"),
    ]

    def fixed_args(self, call: cst.Call) -> list[cst.Arg] | None:
        keywords = as_keywords(call.args, _PARAMETERS)
        return None if keywords is None else [string_arg("cpu"), *keywords]
