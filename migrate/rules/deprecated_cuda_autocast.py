"""AMP020: ``torch.cuda.amp.autocast(...)`` -> ``torch.amp.autocast("cuda", ...)``."""
from __future__ import annotations

import libcst as cst

from migrate.rule import Invalid, Valid
from migrate.rules._deprecated_spelling import DeprecatedSpelling, as_keywords, string_arg

# torch.cuda.amp.autocast's parameters in order; torch.amp.autocast takes device_type first and
# dtype second, so positional arguments are passed by keyword.
_PARAMETERS = ("enabled", "dtype", "cache_enabled")


class DeprecatedCudaAutocast(DeprecatedSpelling):
    """What it does:
    Replaces ``torch.cuda.amp.autocast(args...)`` with ``torch.amp.autocast("cuda", args...)``, in
    every spelling (call, ``with`` item, decorator; ``from torch.cuda.amp import autocast``,
    ``from torch.cuda import amp``).

    Why is this bad?
    ``torch.cuda.amp.autocast`` is deprecated since PyTorch 2.4 and warns on every use.

    Fix safety:
    Safe: the native form with device type ``"cuda"`` has the same defaults (float16, cache on).
    Positional arguments are passed by keyword, since the native signature orders them differently.
    A call with ``*args``, a name that may also be something else (imported from elsewhere on
    another branch), and a use that is not a call (an alias, ``isinstance``) are only reported.
    """

    CODE = "AMP020"
    FIX = 'torch.cuda.amp.autocast -> torch.amp.autocast("cuda")'
    MESSAGE = "`torch.cuda.amp.autocast` is deprecated; use `torch.amp.autocast(\"cuda\", ...)`"
    TRIGGERS = ("autocast",)
    RENAMES = {"torch.cuda.amp.autocast": "torch.amp.autocast"}

    VALID = [
        Valid('import torch\nwith torch.amp.autocast("cuda"):\n    pass\n'),
        Valid("import torch\nwith torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n    pass\n"),
        Valid("from contextlib import nullcontext as autocast\nwith autocast():\n    pass\n"),
        Valid("class amp:\n    autocast = None\namp.autocast()\n"),
    ]
    INVALID = [
        Invalid(
            "import torch\n\nwith torch.cuda.amp.autocast():\n    loss = model(x)\n",
            'import torch\n\nwith torch.amp.autocast("cuda"):\n    loss = model(x)\n',
        ),
        Invalid(
            "import torch as th\nwith th.cuda.amp.autocast(False):\n    pass\n",
            'import torch as th\nwith th.amp.autocast("cuda", enabled=False):\n    pass\n',
        ),
        Invalid(
            "import torch\nfrom torch.cuda.amp import autocast\n\nwith autocast(enabled=use_amp, dtype=torch.float16):\n    pass\n",
            'import torch\n\nwith torch.amp.autocast("cuda", enabled=use_amp, dtype=torch.float16):\n    pass\n',
        ),
        Invalid(
            "from torch.cuda import amp\n\n\n@amp.autocast()\ndef forward(x):\n    return x\n",
            'import torch\n\n\n@torch.amp.autocast("cuda")\ndef forward(x):\n    return x\n',
        ),
        Invalid(
            "import torch.cuda.amp as tca\nwith tca.autocast(**options):\n    pass\n",
            'import torch\n\nwith torch.amp.autocast("cuda", **options):\n    pass\n',
        ),
        Invalid("import torch\nwith torch.cuda.amp.autocast(*flags):\n    pass\n"),
        Invalid(
            "if USE_CUDA:\n    from torch.cuda.amp import autocast\nelse:\n"
            "    from contextlib import nullcontext as autocast\nwith autocast():\n    pass\n"
        ),
        Invalid("import torch\ncontext = torch.cuda.amp.autocast\n"),
    ]

    def fixed_args(self, call: cst.Call) -> list[cst.Arg] | None:
        keywords = as_keywords(call.args, _PARAMETERS)
        return None if keywords is None else [string_arg("cuda"), *keywords]
