"""AMP022: ``torch.cuda.amp.custom_fwd/custom_bwd`` -> ``torch.amp.custom_fwd/custom_bwd(device_type="cuda")``."""
from __future__ import annotations

import libcst as cst

from migrate.rule import Invalid, Valid
from migrate.rules._deprecated_spelling import DeprecatedSpelling, string_arg


class DeprecatedCustomFwd(DeprecatedSpelling):
    """What it does:
    Replaces the ``torch.cuda.amp.custom_fwd`` and ``torch.cuda.amp.custom_bwd`` decorators of
    ``torch.autograd.Function`` methods with ``torch.amp.custom_fwd(device_type="cuda", ...)`` and
    ``torch.amp.custom_bwd(device_type="cuda")``, bare (``@custom_fwd``) or called
    (``@custom_fwd(cast_inputs=torch.float32)``).

    Why is this bad?
    The ``torch.cuda.amp`` decorators are deprecated since PyTorch 2.4 and warn when applied.

    Fix safety:
    Safe: the native decorators do the same for ``device_type="cuda"``, which is the only device
    the deprecated ones know. A use that is neither a call nor a decorator is only reported.
    """

    CODE = "AMP022"
    FIX = 'torch.cuda.amp.custom_fwd/bwd -> torch.amp.custom_fwd/bwd("cuda")'
    MESSAGE = "`torch.cuda.amp.custom_fwd` is deprecated; use `torch.amp.custom_fwd(device_type=\"cuda\")`"
    TRIGGERS = ("custom_fwd", "custom_bwd")
    RENAMES = {
        "torch.cuda.amp.custom_fwd": "torch.amp.custom_fwd",
        "torch.cuda.amp.custom_bwd": "torch.amp.custom_bwd",
    }

    VALID = [
        Valid('import torch\n\n\n@torch.amp.custom_fwd(device_type="cuda")\ndef forward(ctx, x):\n    return x\n'),
        Valid("def custom_fwd(f):\n    return f\n\n\n@custom_fwd\ndef forward(ctx, x):\n    return x\n"),
    ]
    INVALID = [
        Invalid(
            "import torch\n\n\nclass Scale(torch.autograd.Function):\n"
            "    @staticmethod\n    @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)\n"
            "    def forward(ctx, x):\n        return x * 2\n\n"
            "    @staticmethod\n    @torch.cuda.amp.custom_bwd\n"
            "    def backward(ctx, grad):\n        return grad * 2\n",
            "import torch\n\n\nclass Scale(torch.autograd.Function):\n"
            '    @staticmethod\n    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)\n'
            "    def forward(ctx, x):\n        return x * 2\n\n"
            '    @staticmethod\n    @torch.amp.custom_bwd(device_type="cuda")\n'
            "    def backward(ctx, grad):\n        return grad * 2\n",
        ),
        Invalid(
            "from torch.cuda.amp import custom_fwd\n\n\n@custom_fwd\ndef forward(ctx, x):\n    return x\n",
            'import torch\n\n\n@torch.amp.custom_fwd(device_type="cuda")\ndef forward(ctx, x):\n    return x\n',
        ),
        Invalid(
            "from torch.cuda import amp\nforward = amp.custom_fwd(forward)\n",
            'import torch\n\nforward = torch.amp.custom_fwd(forward, device_type="cuda")\n',
        ),
        Invalid("import torch\ndecorators = [torch.cuda.amp.custom_fwd]\n"),
    ]

    def fixed_args(self, call: cst.Call) -> list[cst.Arg] | None:
        positional = [arg for arg in call.args if arg.keyword is None and arg.star != "**"]
        keywords = [arg for arg in call.args if arg.keyword is not None or arg.star == "**"]
        return [*positional, string_arg("cuda", keyword="device_type"), *keywords]

    def bare_decorator_args(self) -> list[cst.Arg] | None:
        return [string_arg("cuda", keyword="device_type")]
