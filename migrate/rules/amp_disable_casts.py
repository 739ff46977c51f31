"""AMP008: ``with amp.disable_casts():`` -> ``with torch.autocast("cuda", enabled=False):``."""
from __future__ import annotations

import libcst as cst

from migrate.rule import Invalid, Valid
from migrate.rules._apex_rename import ApexRename, NativeCall, NoFix
from migrate.types import FixSafety


class AmpDisableCasts(ApexRename):
    """What it does:
    Replaces ``amp.disable_casts()`` with ``torch.autocast("cuda", enabled=False)``.

    Why is this bad?
    ``disable_casts`` switched off apex's patched casts for a region; the native way to leave a
    region in the inputs' own precision is an autocast region that is disabled.

    Fix safety:
    Safe: inside both, functions run in the dtype of their inputs.

    Options:
    None.
    """

    CODE = "AMP008"
    FIX = 'amp.disable_casts() -> torch.autocast("cuda", enabled=False)'
    FIX_SAFETY = FixSafety.ALWAYS
    MESSAGE = "`amp.disable_casts` is apex mixed precision"
    TARGETS = ("apex.amp.disable_casts",)
    VALID = [Valid('import torch\nwith torch.autocast("cuda", enabled=False):\n    y = f(x.float())\n')]
    INVALID = [
        Invalid(
            "from apex import amp\n\nwith amp.disable_casts():\n    loss = criterion(out.float(), target)\n",
            'import torch\n\nwith torch.autocast("cuda", enabled=False):\n    loss = criterion(out.float(), target)\n',
        ),
    ]

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        if call.args:
            return NoFix("`disable_casts` takes no arguments")
        return NativeCall('torch.autocast("cuda", enabled=False)')
