"""AMP008: ``with amp.disable_casts():`` -> ``with torch.autocast("cuda", enabled=False):``."""
from __future__ import annotations

import libcst as cst

from migrate.apex_plan import ApexPlanProvider, plan_of
from migrate.rule import Invalid, Valid
from migrate.rules._apex_planned import apex_casts_after_run
from migrate.rules._apex_rename import ApexRename, NativeCall, NoFix
from migrate.types import FixSafety

_DISABLED = 'torch.autocast("cuda", enabled=False)'


class AmpDisableCasts(ApexRename):
    """What it does:
    Replaces ``amp.disable_casts()`` with ``torch.autocast("cuda", enabled=False)``.

    Why is this bad?
    ``disable_casts`` switched off apex's patched casts for a region; the native way to leave a
    region in the inputs' own precision is an autocast region that is disabled.

    Fix safety:
    Safe: inside both, functions run in the dtype of their inputs, once native autocast does the
    casting. It goes with the project's ``amp.initialize``, and is no safer than its rewrite:
    while apex still initializes, in this file or in another file of the project that the run
    leaves on apex, its patched functions cast inside a disabled ``torch.autocast`` too, so the
    call is only reported; where that rewrite is unsafe, so is this.

    Options:
    None.
    """

    CODE = "AMP008"
    FIX = 'amp.disable_casts() -> torch.autocast("cuda", enabled=False)'
    FIX_SAFETY = FixSafety.SOMETIMES
    METADATA_DEPENDENCIES = (*ApexRename.METADATA_DEPENDENCIES, ApexPlanProvider)
    MESSAGE = "`amp.disable_casts` is apex mixed precision"
    TARGETS = ("apex.amp.disable_casts",)
    VALID = [Valid('import torch\nwith torch.autocast("cuda", enabled=False):\n    y = f(x.float())\n')]
    INVALID = [
        Invalid(
            "from apex import amp\n\nwith amp.disable_casts():\n    loss = criterion(out.float(), target)\n",
            'import torch\n\nwith torch.autocast("cuda", enabled=False):\n    loss = criterion(out.float(), target)\n',
        ),
        Invalid(  # unsafe with the O2 `initialize` it goes with
            "from apex import amp\n\nmodel, optimizer = amp.initialize(model, optimizer, opt_level='O2')\n"
            "with amp.disable_casts():\n    y = model(x.float())\n",
            "import torch\n\n# TODO(ampmigrate): apex O2 ran `model` in float16, weights and inputs: call `.half()`\n"
            '#   on both, or run it under torch.autocast("cuda", dtype=torch.float16); where code\n'
            "#   handed `optimizer` (another file, a library) scales the loss with apex's\n"
            "#   `amp.scale_loss`, it raises once this call is gone: migrate it too, or keep this\n"
            "#   call on apex\n"
            "# TODO(ampmigrate): review, this rewrite is unsafe: O2 keeps fp16 weights with fp32\n"
            "#   master copies, where native autocast keeps fp32 weights, like O1 (`o2-as-autocast =\n"
            "#   true` in [tool.ampmigrate.settings] accepts that)\n"
            'with torch.autocast("cuda", enabled=False):\n    y = model(x.float())\n',
            unsafe_fixes=True,
        ),
    ]

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        if call.args:
            return NoFix("`disable_casts` takes no arguments")
        casts = apex_casts_after_run(plan_of(self, self._module), self.context.settings)
        if casts.stay:
            return NoFix(f"{casts.why}, and its patched functions cast inside a disabled `torch.autocast` too")
        return NativeCall(_DISABLED, casts.safety, casts.why)
