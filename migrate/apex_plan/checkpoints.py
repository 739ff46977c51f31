"""``amp.state_dict`` and ``amp.load_state_dict``: GradScaler's state, apex checkpoints converted."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.syntax import subscript_key
from migrate.apex_plan.vocabulary import HELPER_NAME, HELPER_SOURCE, STATE_DICT, Unplannable


class CheckpointPlanning:
    """``amp.state_dict`` and ``amp.load_state_dict``: GradScaler's state, apex checkpoints converted.

    A part of ``Planner``: its methods read and fill the planner's state.
    """

    def _plan_state_dicts(self) -> None:
        calls = self.sites["state_dict"] + self.sites["load_state_dict"]
        if calls and self.o0 and self.scaler is None:
            raise Unplannable(calls[0], "O0 has no loss scaler whose state could be saved")
        for call in self.sites["state_dict"]:
            if call.args:
                raise Unplannable(call, "`amp.state_dict(destination)` has no native equivalent")
            node, native = self._state_dict_read(call)
            self._replace(node, nodes.parse_expression(native, self.module))
            self._kind(node, STATE_DICT, "`amp.state_dict` is apex's loss-scaler state", f"Use `{native}`")
        for call in self.sites["load_state_dict"]:
            state = nodes.argument(call, 0, "state_dict")
            if state is None or len(call.args) != 1 or nodes.has_star(call):
                raise Unplannable(call, "`amp.load_state_dict` is not called with one state dict")
            self._replace(call, nodes.parse_expression(f"{self.scaler}.load_state_dict({HELPER_NAME}({nodes.code(state.value)}, {self.scaler}))", self.module))
            self._kind(call, STATE_DICT, "`amp.load_state_dict` is apex's loss-scaler state", f"Use `{self.scaler}.load_state_dict(...)`, converting old apex checkpoints")
        if self.sites["load_state_dict"] and HELPER_NAME not in self.names:
            self.after_imports.append(HELPER_SOURCE)

    def _state_dict_read(self, call: cst.Call) -> tuple[cst.CSTNode, str]:
        """What replaces ``amp.state_dict()`` and the keys read from it: GradScaler's state has
        other keys, so ``amp.state_dict()["loss_scaler0"]["loss_scale"]`` reads the scale itself."""
        keys, node = [], call
        while True:
            outer = self.parent.get(id(node))
            if not (isinstance(outer, cst.Subscript) and outer.value is node):
                break
            keys.append(subscript_key(outer))
            node = outer
        if not keys:
            return call, f"{self.scaler}.state_dict()"
        native = {"loss_scale": f"{self.scaler}.get_scale()", "unskipped": f'{self.scaler}.state_dict()["_growth_tracker"]'}
        if len(keys) == 2 and (keys[0] or "").startswith("loss_scaler") and keys[1] in native:
            return node, native[keys[1]]
        raise Unplannable(call, "apex's loss-scaler state is read by key here; GradScaler's state has other keys")
