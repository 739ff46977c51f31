"""AMP013: ``apex.optimizers.FusedSGD`` -> ``torch.optim.SGD``."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._apex_rename import ApexRename, NativeCall, NoFix, without_native
from migrate.types import FixSafety

_SHARED = {"params", "lr", "momentum", "dampening", "weight_decay", "nesterov"}
# Only about O2 master gradients and how zero_grad clears: no effect on the update.
_DROPPED = ("materialize_master_grads", "set_grad_none")


class ApexFusedSGD(ApexRename):
    """What it does:
    Replaces ``FusedSGD(params, lr, momentum, ...)`` with ``torch.optim.SGD(params, lr, momentum, ...)``.

    Why is this bad?
    ``FusedSGD`` needs an apex build; ``torch.optim.SGD`` has the same update rule and parameters
    in the same order (it picks a multi-tensor implementation by itself).

    Fix safety:
    Safe (``materialize_master_grads`` and ``set_grad_none`` only concern O2 master gradients and
    ``zero_grad``). Reported for ``wd_after_momentum=True``, which applies weight decay after
    momentum: torch has no such option. Reported where the class is handed on as a value
    (``OPTIMIZERS = dict(sgd=FusedSGD)``): the call made with it elsewhere may pass those
    arguments, which torch's SGD refuses.

    Options:
    None.
    """

    CODE = "AMP013"
    FIX = 'FusedSGD -> torch.optim.SGD'
    FIX_SAFETY = FixSafety.ALWAYS
    MESSAGE = "`apex.optimizers.FusedSGD` needs an apex build; use `torch.optim.SGD`"
    TARGETS = ("apex.optimizers.FusedSGD", "apex.optimizers.fused_sgd.FusedSGD")
    REFERENCES = {name: "torch.optim.SGD" for name in TARGETS}
    CALLS_UNSEEN_DIFFER = True
    VALID = [Valid("import torch\noptimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)\n")]
    INVALID = [
        Invalid(
            "from apex.optimizers import FusedSGD\noptimizer = FusedSGD(params, 0.1, momentum=0.9, nesterov=True)\n",
            "import torch\n\noptimizer = torch.optim.SGD(params, 0.1, momentum=0.9, nesterov=True)\n",
        ),
        Invalid("import apex\noptimizer = apex.optimizers.FusedSGD(params, lr=0.1, wd_after_momentum=True)\n"),
    ]

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        if nodes.has_star(call) or len([a for a in call.args if a.keyword is None]) > 6:
            return NoFix("apex-only arguments are passed positionally or through `*args`/`**kwargs`")
        unknown = nodes.keyword_names(call) - _SHARED - set(_DROPPED) - {"wd_after_momentum"}
        if unknown:
            return without_native(unknown)
        after = nodes.argument(call, None, "wd_after_momentum")
        if after is not None and nodes.code(after.value) not in ("False", "0"):
            return NoFix("torch's SGD applies weight decay before momentum")
        return NativeCall(self.rebuild("torch.optim.SGD", call, drop=(*_DROPPED, "wd_after_momentum")))
