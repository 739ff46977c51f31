"""The amp module handed on (``model.amp = amp``, ``f(amp=amp)``, ``amp if fp16 else None``):
the GradScaler goes where it went, and its receivers' calls become the scaler's; ``self.amp = amp``
that only ever stands in for the module is the module under another name."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Step
from migrate.apex_plan.vocabulary import (
    HELPER_NAME,
    HELPER_SOURCE,
    INITIALIZE,
    STATE_DICT,
)
from migrate.flow.receivers import receivers
from migrate.tree_walk import descendants


class HandedOnPlanning(Step):
    """The amp module handed on to a parameter or an attribute, and what receives it.

    It reads the ``FileTree``, the classified sites and the frozen ``Setup``, and writes to the ``Draft``.
    """

    def _set_to_none_beside(self, name: cst.Name) -> bool:
        """Whether the function (or module) handing on ``name`` also assigns it ``None``."""
        scope = self.tree.function(name) or self.tree.module
        return any(type(node) is cst.Assign and nodes.is_none(node.value)
                   and any(nodes.code(target.target) == name.value for target in node.targets)
                   for node in descendants(scope))

    def _scaler_of(self, call: cst.Call) -> str:
        """The scaler a site uses: the plan's, or what received the handed-on module."""
        return self.sites.alias_of.get(id(call), self.setup.scaler)

    def receiver_calls(self) -> tuple[tuple[str, cst.Call], ...] | None:
        """The receivers' calls of apex's API (by method), where every read of the handed-on module is seen (the same-file function or the
        class's attribute that receives it, followed on) and does what a GradScaler in its place
        does the same: the API the rewrite turns into the scaler's, a test for ``None`` or truth,
        its state saved or loaded (old apex checkpoints converted on load); else None."""
        reads = []
        for node, _ in self.sites.escapes:
            found = receivers(self.tree.module, self.tree.parent, node)
            if found is None:
                return None
            reads += found
        if not all(read.method in (None, "scale_loss", "master_params", "state_dict", "load_state_dict") for read in reads):
            return None
        return tuple((read.method, self.tree.parent[id(self.tree.parent[id(read.node)])]) for read in reads if read.method is not None)

    def _plan_receiver_loads(self) -> None:
        """``amp.load_state_dict(state)`` on what received the module: an apex checkpoint's state
        is converted for the GradScaler now in its place."""
        for call in (call for method, call in self.setup.receiver_calls if method == "load_state_dict"):
            state = nodes.argument(call, 0, "state_dict")
            if state is None or len(call.args) != 1 or nodes.has_star(call):
                continue
            holder = nodes.code(call.func.value)
            self.draft.replace(call, self.fitted(call, nodes.parse_expression(
                f"{holder}.load_state_dict({HELPER_NAME}({nodes.code(state.value)}, {holder}))", self.tree.module)))
            self.draft.kind(call, STATE_DICT, "the handed-on module loads apex's loss-scaler state here",
                       "Load it into the GradScaler, converting old apex checkpoints")
            if HELPER_NAME not in self.tree.names and HELPER_SOURCE not in self.draft.after_imports:
                self.draft.after_imports.append(HELPER_SOURCE)

    def plan_escapes(self) -> None:
        self._plan_receiver_loads()
        for statement in self.sites.stand_in_assignments:
            self.draft.replace(statement, cst.RemoveFromParent())
            self.draft.kind(statement, INITIALIZE, "the apex.amp module is kept on `self` here", "Remove it: its calls are rewritten where they are")
        for node, _ in self.sites.escapes:
            handed = self.setup.scaler
            if isinstance(node, cst.Name) and self._set_to_none_beside(node):
                # `else: amp = None` then `train(..., amp)`: where apex was off the receiver got
                # None, and tests for it (`if amp:`); a disabled scaler would pass that test
                handed = f"{self.setup.scaler} if {self.setup.scaler}.is_enabled() else None"
            self.draft.replace(node, nodes.parse_expression(handed, self.tree.module))
            self.draft.kind(node, INITIALIZE, "the apex.amp module is handed on here", f"Hand on `{self.setup.scaler}`, the GradScaler, instead")
