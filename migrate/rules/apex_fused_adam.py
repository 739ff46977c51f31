"""AMP012: ``apex.optimizers.FusedAdam`` -> ``torch.optim.AdamW(..., fused=True)`` (or ``Adam``)."""
from __future__ import annotations

import libcst as cst

from libcst.metadata import PositionProvider

from migrate import apex_nodes as nodes
from migrate.optimizer_resumes import SETTING as RESUMES
from migrate.rule import Invalid, Valid
from migrate.step_model.vocabulary import optimizer_like
from migrate.rules._apex_rename import ApexRename, NativeCall, NoFix, without_native
from migrate.tree_walk import descendants
from migrate.types import FixSafety, Safety

# Keywords both take with the same meaning.
_SHARED = {"params", "lr", "betas", "eps", "weight_decay", "amsgrad", "capturable"}


class ApexFusedAdam(ApexRename):
    """What it does:
    Replaces ``FusedAdam(params, ...)`` with ``torch.optim.AdamW(params, ..., fused=True)``, or with
    ``torch.optim.Adam(..., fused=True)`` for ``adam_w_mode=False``. apex's default weight decay is 0
    where AdamW's is 0.01, so ``weight_decay=0.0`` is written out when it was not given.

    Why is this bad?
    The native optimizers have fused implementations with the same update rule; they need no
    apex build.

    Fix safety:
    Safe for the standard arguments (``set_grad_none`` is dropped: native ``zero_grad`` already sets
    gradients to None), where nothing in the project loads an optimizer's saved state
    (``optimizer.load_state_dict(...)``, on anything named as an optimizer): apex keeps the step
    count per parameter group, torch per parameter, and a checkpoint saved before the migration
    raises ``KeyError: 'step'`` as it loads, so there it is reported, not rewritten. Reported for ``bias_correction=False``, ``master_weights``, the old
    ``max_grad_norm``/``eps_inside_sqrt`` signature, a computed ``adam_w_mode``, and positional
    arguments after ``lr`` (apex's third parameter is ``bias_correction``, torch's is ``betas``).

    Options:
    None.
    """

    CODE = "AMP012"
    FIX = 'FusedAdam -> torch.optim.AdamW/Adam(fused=True)'
    FIX_SAFETY = FixSafety.SOMETIMES
    MESSAGE = "`apex.optimizers.FusedAdam` needs an apex build; torch has a fused Adam"
    TARGETS = ("apex.optimizers.FusedAdam", "apex.optimizers.fused_adam.FusedAdam")
    VALID = [
        Valid("import torch\noptimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)\n"),
        Valid("class FusedAdam:\n    pass\noptimizer = FusedAdam()\n"),
    ]
    INVALID = [
        Invalid(
            "from apex.optimizers import FusedAdam\n\noptimizer = FusedAdam(model.parameters(), lr=1e-3)\n",
            "import torch\n\noptimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True)\n",
        ),
        Invalid(
            "from apex.optimizers import FusedAdam as Adam\noptimizer = Adam(params, lr=args.lr, adam_w_mode=False, weight_decay=0.01)\n",
            "import torch\n\noptimizer = torch.optim.Adam(params, lr=args.lr, weight_decay=0.01, fused=True)\n",
        ),
        Invalid("from apex.optimizers import FusedAdam\noptimizer = FusedAdam(params, lr=1e-3, bias_correction=False, max_grad_norm=1.0)\n"),
        Invalid(  # a checkpoint saved with apex's FusedAdam does not load into torch's Adam
            "from apex.optimizers import FusedAdam\n"
            "\n"
            "optimizer = FusedAdam(model.parameters(), lr=1e-3)\n"
            "if resume:\n"
            "    optimizer.load_state_dict(torch.load(resume)['optimizer'])\n",
        ),
        Invalid(
            "from apex.optimizers import FusedAdam\noptimizer = FusedAdam(params, lr=1e-3, set_grad_none=False)\n",
            "import torch\n\noptimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0, fused=True)\n",
            unsafe_fixes=True,
        ),
    ]

    _resumes: tuple[str, ...] | None = None  # where optimizer state is loaded, found at the first call

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        if nodes.has_star(call):
            return NoFix("its arguments are passed through `*args`/`**kwargs`")
        if len([a for a in call.args if a.keyword is None]) > 2:
            return NoFix("arguments after `lr` are positional, and apex's order differs from torch's")
        keywords = nodes.keyword_names(call)
        unknown = keywords - _SHARED - {"adam_w_mode", "set_grad_none", "bias_correction"}
        if unknown:
            return without_native(unknown)
        bias = nodes.argument(call, None, "bias_correction")
        if bias is not None and nodes.code(bias.value) not in ("True", "1"):
            return NoFix("torch's Adam always corrects the bias")
        mode = nodes.argument(call, None, "adam_w_mode")
        mode_text = nodes.code(mode.value) if mode is not None else "True"
        if mode_text not in ("True", "False", "1", "0"):
            return NoFix("`adam_w_mode` is computed: choose `torch.optim.AdamW` (True) or `torch.optim.Adam` (False)")
        decoupled = mode_text in ("True", "1")
        extra = ["fused=True"]
        if decoupled and "weight_decay" not in keywords:
            extra.insert(0, "weight_decay=0.0")
        native = "torch.optim.AdamW" if decoupled else "torch.optim.Adam"
        grad_none = nodes.argument(call, None, "set_grad_none")
        safety = Safety.SAFE
        note = ""
        if grad_none is not None and nodes.code(grad_none.value) not in ("True", "1"):
            safety, note = Safety.UNSAFE, "`set_grad_none=False` dropped: call `zero_grad(set_to_none=False)` to keep zeroed gradients"
        resumed = self._loaded_at()
        if resumed:
            return NoFix(
                f"optimizer state is loaded ({', '.join(resumed[:3])}{', ...' if len(resumed) > 3 else ''}): a checkpoint "
                "saved with apex's FusedAdam keeps the step count per parameter group, where torch's Adam keeps it per "
                "parameter and raises KeyError 'step' loading it; swap it by hand where no such checkpoint must load, "
                "or move each group's `step` into its parameters' states first")
        source = self.rebuild(native, call, drop=("adam_w_mode", "set_grad_none", "bias_correction"), extra=tuple(extra))
        return NativeCall(source, safety, note)

    def _loaded_at(self) -> tuple[str, ...]:
        """Where the project (``optimizer_resumes``), or this file when no project is known, loads an
        optimizer's state: ``optimizer.load_state_dict(checkpoint["optimizer"])``."""
        if self._resumes is None:
            here = [f"line {self.get_metadata(PositionProvider, node).start.line}"
                    for node in descendants(self._module) if type(node) is cst.Call and type(node.func) is cst.Attribute
                    and node.func.attr.value == "load_state_dict" and optimizer_like(nodes.code(node.func.value))]
            self._resumes = tuple(self.context.settings.get(RESUMES, ())) or tuple(here)
        return self._resumes
