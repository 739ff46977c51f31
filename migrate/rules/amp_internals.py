"""AMP009: apex's private state and the legacy ``amp.init()`` handle: reported."""
from __future__ import annotations

import libcst as cst

from migrate.apex_plan import CAST_API, CORE, ApexPlanProvider, plan_of
from migrate.rule import Invalid, Valid
from migrate.rules._apex_rename import ApexRename, NativeCall, NoFix

_STEP = (
    "GradScaler keeps its state in `scaler.get_scale()`, `scaler.state_dict()` and `scaler.load_state_dict()`; "
    "replace this by hand, or keep the file running on ampshim"
)


class AmpInternals(ApexRename):
    """What it does:
    Reports uses of apex's private state (``_amp_state``, ``loss_scalers[i]._loss_scale``,
    ``optimizer._amp_stash``), of the legacy ``amp.init()`` handle API, and of any other
    ``apex.amp`` name that is not public API.

    Why is this bad?
    None of it exists in native PyTorch; code that pokes it breaks as soon as apex is gone.

    Fix safety:
    No fix: what the code meant by the poke (reset the scale, skip a scheduler step after an
    overflow) has to be expressed with GradScaler by hand.

    Options:
    None.
    """

    CODE = "AMP009"
    MESSAGE = "apex.amp internals and the legacy handle have no native equivalent"
    VALID = [Valid("scale = scaler.get_scale()\n")]
    INVALID = [
        Invalid("from apex import amp\namp._amp_state.loss_scalers[0]._loss_scale = 2.0 ** 16\n"),
        Invalid("from apex import amp\namp_handle = amp.init(enabled=args.fp16)\n"),
        Invalid(
            "import apex\nif hasattr(optimizer, '_amp_stash'):\n    optimizer._amp_stash.lazy_init_called = True\n",
            "if hasattr(optimizer, '_amp_stash'):\n    optimizer._amp_stash.lazy_init_called = True\n",
        ),
    ]

    METADATA_DEPENDENCIES = (*ApexRename.METADATA_DEPENDENCIES, ApexPlanProvider)

    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        self._open: list[cst.CSTNode] = []
        self._handled = plan_of(self, node).handled  # e.g. `"state_dict" in amp.__dict__`, which the rewrite drops

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        super().visit_ImportFrom(node)
        module = cst.Module([]).code_for_node(node.module) if node.module is not None else ""
        if node.relative or isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            full = f"{module}.{alias.evaluated_name}"
            if full.startswith("apex.amp.") and self._internal(full):
                self.report(alias, f"{self.MESSAGE}: `{full}`; {_STEP}")

    def visit_Import(self, node: cst.Import) -> None:
        super().visit_Import(node)
        for alias in node.names:
            if alias.evaluated_name.startswith("apex.amp.") and self._internal(alias.evaluated_name):
                self.report(alias, f"{self.MESSAGE}: `{alias.evaluated_name}`; {_STEP}")

    @staticmethod
    def _internal(name: str) -> bool:
        first = name[len("apex.amp.") :].split(".")[0]
        return first not in CORE and first not in CAST_API

    def _target_among(self, names: frozenset[str]) -> str | None:
        found = sorted(n for n in names if n.startswith("apex.amp.") and self._internal(n))
        return found[0] if found else None

    def visit_Call(self, node: cst.Call) -> None:
        return None

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if self._open:
            self._open.append(node)
            return
        if node.attr.value == "_amp_stash":
            self.report(node, f"{self.MESSAGE}: `_amp_stash` is apex's per-optimizer state; {_STEP}")
            self._open.append(node)
            return
        self._reference(node)

    def leave_Attribute(self, original_node: cst.Attribute) -> None:
        if self._open and self._open[-1] is original_node:
            self._open.pop()

    def visit_Name(self, node: cst.Name) -> None:
        if not self._open:
            self._reference(node)

    def _reference(self, node: cst.BaseExpression) -> None:
        if id(node) in self._handled:
            if isinstance(node, cst.Attribute):
                self._open.append(node)  # nor the names inside it
            return
        target = self._target(node)
        if target is not None:
            self.report(node, f"{self.MESSAGE}: `{target}`; {_STEP}")
            if isinstance(node, cst.Attribute):
                self._open.append(node)

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        return NoFix(_STEP)
