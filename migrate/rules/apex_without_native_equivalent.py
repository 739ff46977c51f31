"""AMP015: apex features with no native counterpart (LAMB, NovoGrad, FP16_Optimizer, LARC, ...): reported."""
from __future__ import annotations

import libcst as cst
from libcst.metadata import ParentNodeProvider

from migrate.names import qualified_names
from migrate.rule import Invalid, Valid
from migrate.rules._apex_rename import ApexRename, NativeCall, NoFix, binds

# Qualified-name prefix -> the manual step to take.
_MANUAL_STEPS = {
    "apex.optimizers.FusedLAMB": "torch has no LAMB: keep apex's optimizers package or use another LAMB implementation",
    "apex.optimizers.FusedMixedPrecisionLamb": "torch has no LAMB: keep apex's optimizers package or use another LAMB implementation",
    "apex.optimizers.FusedNovoGrad": "torch has no NovoGrad: keep apex's optimizers package or switch optimizer",
    "apex.optimizers.FusedAdagrad": "use `torch.optim.Adagrad(..., foreach=True)` and check its arguments by hand",
    "apex.optimizers.FP16_Optimizer": "replace it with `torch.amp.GradScaler`: `scaler.scale(loss).backward()` for "
    "`optimizer.backward(loss)`, `scaler.step(optimizer)` and `scaler.update()` for `optimizer.step()`",
    "apex.fp16_utils": "replace FP16_Optimizer with `torch.amp.GradScaler` and autocast (`scaler.scale(loss).backward()` for "
    "`optimizer.backward(loss)`); `network_to_half` with autocast; `to_python_float(t)` with `t.item()`",
    "apex.parallel.LARC": "torch has no LARC: keep the wrapper as project code or drop it",
    "apex.contrib": "apex.contrib has no native counterpart: keep apex installed for it or replace it by hand",
    "apex.multi_tensor_apply": "use `torch._foreach_*` operations instead of apex's multi-tensor kernels",
    "amp_C": "use `torch._foreach_*` operations instead of apex's multi-tensor kernels",
    "apex_C": "use `torch._utils._flatten_dense_tensors`/`_unflatten_dense_tensors` instead of apex_C",
}


class ApexWithoutNativeEquivalent(ApexRename):
    """What it does:
    Reports each use of an apex feature that native PyTorch does not provide (``FusedLAMB``,
    ``FusedNovoGrad``, ``FP16_Optimizer`` and the rest of ``apex.fp16_utils``, ``LARC``,
    ``apex.contrib``, the multi-tensor kernels ``amp_C``/``apex_C``), with the manual step to take.

    Why is this bad?
    These need an apex build that current PyTorch releases no longer match; the file will not
    import without it.

    Fix safety:
    No fix: each needs a decision (another optimizer, a different loss-scaling loop).

    Options:
    None.
    """

    CODE = "AMP015"
    MESSAGE = "this apex feature has no native PyTorch equivalent"
    TARGETS = tuple(_MANUAL_STEPS)
    VALID = [
        Valid("class FP16_Optimizer:\n    pass\noptimizer = FP16_Optimizer(optimizer)\n"),
        Valid("from apex.optimizers import FusedAdam as Adam\n"),
    ]
    INVALID = [
        Invalid("from apex.optimizers import FusedLAMB\noptimizer = FusedLAMB(params, lr=1e-3)\n"),
        Invalid("import apex.fp16_utils\noptimizer = apex.fp16_utils.FP16_Optimizer(optimizer, dynamic_loss_scale=True)\n"),
        Invalid("from apex.fp16_utils import *\n"),
    ]

    def _target(self, node: cst.CSTNode) -> str | None:
        if self._in_import or binds(self.get_metadata(ParentNodeProvider, node, None), node):
            return None
        for name in qualified_names(self, node):
            for prefix in self.TARGETS:
                if name == prefix or name.startswith(prefix + "."):
                    return prefix
        return None

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        super().visit_ImportFrom(node)
        if isinstance(node.names, cst.ImportStar) and node.module is not None and not node.relative:
            module = cst.Module([]).code_for_node(node.module)
            prefix = next((p for p in self.TARGETS if module == p or module.startswith(p + ".")), None)
            if prefix is not None:
                self.report(node, f"{self.MESSAGE}: `from {module} import *`; {_MANUAL_STEPS[prefix]}")

    def visit_Call(self, node: cst.Call) -> None:
        target = self._target(node.func)
        if target is not None:
            self._funcs.add(id(node.func))
            self.report(node, f"{self.MESSAGE}; {_MANUAL_STEPS[target]}")

    def _reference(self, node: cst.BaseExpression) -> None:
        if id(node) in self._funcs or self._inside_reported(node):
            return
        target = self._target(node)
        if target is not None:
            self._reported.add(id(node))
            self.report(node, f"{self.MESSAGE}; {_MANUAL_STEPS[target]}")

    _reported: set[int]

    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        self._reported = set()
        self._open: list[cst.CSTNode] = []

    def _inside_reported(self, node: cst.CSTNode) -> bool:
        return bool(self._open)

    def leave_Attribute(self, original_node: cst.Attribute) -> None:
        if self._open and self._open[-1] is original_node:
            self._open.pop()

    def visit_Attribute(self, node: cst.Attribute) -> None:
        already = bool(self._open) or id(node) in self._funcs
        self._reference(node)
        if already or id(node) in self._reported or id(node) in self._funcs:
            self._open.append(node)

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        return NoFix(_MANUAL_STEPS[target])
