"""AMP015: apex features with no native counterpart (LAMB, NovoGrad, FP16_Optimizer, LARC, ...): reported."""
from __future__ import annotations

import libcst as cst
from libcst.metadata import ParentNodeProvider, QualifiedNameProvider

from migrate import apex_nodes as nodes
from migrate.names import may_resolve_within, qualified_names
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
    # before "apex.fp16_utils": the first prefix that matches is the one used
    "apex.fp16_utils.to_python_float": "`t.item()` is what it returns for a tensor: use that in place of `to_python_float(t)`",
    "apex.fp16_utils": "replace FP16_Optimizer with `torch.amp.GradScaler` and autocast (`scaler.scale(loss).backward()` for "
    "`optimizer.backward(loss)`); `network_to_half` with autocast; `to_python_float(t)` with `t.item()`",
    "apex.parallel.LARC": "torch has no LARC: keep the wrapper as project code or drop it",
    "apex.contrib": "apex.contrib has no native counterpart: keep apex installed for it or replace it by hand",
    "apex.multi_tensor_apply": "use `torch._foreach_*` operations instead of apex's multi-tensor kernels",
    "amp_C": "use `torch._foreach_*` operations instead of apex's multi-tensor kernels",
    "apex_C": "use `torch._utils._flatten_dense_tensors`/`_unflatten_dense_tensors` instead of apex_C",
}


_ROOTS = ("apex", "amp_C", "apex_C")
# What the other apex rules rewrite or report (AMP002-AMP014, AMP016).
_HANDLED_ELSEWHERE = (
    "apex.amp",
    "apex.parallel.DistributedDataParallel",
    "apex.parallel.distributed.DistributedDataParallel",
    "apex.parallel.convert_syncbn_model",
    "apex.parallel.SyncBatchNorm",
    "apex.parallel.create_syncbn_process_group",
    "apex.optimizers.FusedAdam",
    "apex.optimizers.fused_adam.FusedAdam",
    "apex.optimizers.FusedSGD",
    "apex.optimizers.fused_sgd.FusedSGD",
    "apex.normalization.",
)
_FP16_OPTIMIZERS = ("apex.fp16_utils", "apex.optimizers.FP16_Optimizer")
_ANY = "apex"
_UNKNOWN = "it has no native counterpart this tool knows of: replace it by hand, or keep apex installed for it"


class ApexWithoutNativeEquivalent(ApexRename):
    """What it does:
    Reports each use of an apex feature that native PyTorch does not provide (``FusedLAMB``,
    ``FusedNovoGrad``, ``FP16_Optimizer`` and the rest of ``apex.fp16_utils``, ``LARC``,
    ``apex.contrib``, the multi-tensor kernels ``amp_C``/``apex_C``), with the manual step to take;
    also any other ``apex`` name that no other rule rewrites or reports, so no apex use goes unnoticed.

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
        Invalid("from apex.fp16_utils import *\nmodel = network_to_half(model)\n"),
        Invalid("import apex\nreducer = apex.parallel.Reducer(model)\n"),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        self._open: list[cst.CSTNode] = []  # an apex name being visited: its inner parts are the same name
        self._wrapped: set[str] = set()  # names bound to an FP16_Optimizer
        self._star = False  # the file star-imports apex.fp16_utils

    def _apex_names(self, node: cst.CSTNode) -> list[str]:
        if self._in_import or not may_resolve_within(self, node, _ROOTS):
            return []
        names = sorted(name for name in qualified_names(self, node) if name.split(".")[0] in _ROOTS)
        if names and binds(self.get_metadata(ParentNodeProvider, node, None), node):
            return []
        return names

    def _target(self, node: cst.CSTNode) -> str | None:
        """The manual step's key for ``node``, or ``_ANY`` for an apex name no rule knows."""
        names = self._apex_names(node)
        for name in names:
            for prefix in self.TARGETS:
                if name == prefix or name.startswith(prefix + "."):
                    return prefix
        unknown = [n for n in names if n not in _ROOTS and not n.startswith(_HANDLED_ELSEWHERE)]
        return _ANY if unknown else None

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        super().visit_ImportFrom(node)
        if isinstance(node.names, cst.ImportStar) and node.module is not None and not node.relative:
            module = cst.Module([]).code_for_node(node.module)
            prefix = next((p for p in self.TARGETS if module == p or module.startswith(p + ".")), None)
            self._star = self._star or module.startswith("apex.fp16_utils")
            if prefix is not None or module.split(".")[0] == "apex":
                self.report(node, f"{self.MESSAGE}: `from {module} import *`; {_MANUAL_STEPS.get(prefix, _UNKNOWN)}")

    def visit_Assign(self, node: cst.Assign) -> None:
        """``optimizer = FP16_Optimizer(...)``: its ``backward``/``step`` calls are apex's too."""
        value = node.value
        if isinstance(value, cst.Call) and self._target(value.func) in _FP16_OPTIMIZERS:
            self._wrapped.update(nodes.code(t.target) for t in node.targets)

    def visit_Call(self, node: cst.Call) -> None:
        if self._open:
            return
        func = node.func
        target = self._target(func)
        if target is None and self._star and isinstance(func, cst.Name) and func.value in nodes.FP16_UTILS_NAMES:
            if not self.get_metadata(QualifiedNameProvider, func, set()):
                # brought in by `from apex.fp16_utils import *`
                own = f"apex.fp16_utils.{func.value}"
                target = own if own in _MANUAL_STEPS else "apex.fp16_utils"
        if target is not None:
            self._funcs.add(id(func))
            self.report(node, f"{self.MESSAGE}; {_MANUAL_STEPS.get(target, _UNKNOWN)}")
        elif isinstance(func, cst.Attribute) and func.attr.value == "backward" and nodes.code(func.value) in self._wrapped:
            self.report(node, f"{self.MESSAGE}: `{nodes.code(func.value)}` is apex's FP16_Optimizer; "
                        f"{_MANUAL_STEPS['apex.fp16_utils']}")

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if self._open or id(node) in self._funcs:
            self._open.append(node)
            return
        if self._apex_names(node):
            self._open.append(node)
            self._reference(node)

    def leave_Attribute(self, original_node: cst.Attribute) -> None:
        if self._open and self._open[-1] is original_node:
            self._open.pop()

    def visit_Name(self, node: cst.Name) -> None:
        if not self._open and id(node) not in self._funcs:
            self._reference(node)

    def _reference(self, node: cst.BaseExpression) -> None:
        target = self._target(node)
        if target is not None:
            self.report(node, f"{self.MESSAGE}; {_MANUAL_STEPS.get(target, _UNKNOWN)}")

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        return NoFix(_MANUAL_STEPS.get(target, _UNKNOWN))
