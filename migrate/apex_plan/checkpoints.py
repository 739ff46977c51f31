"""``amp.state_dict`` and ``amp.load_state_dict``: GradScaler's state, apex checkpoints converted."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Step
from migrate.apex_plan.scaler_parameters import appended
from migrate.apex_plan.syntax import ReplaceByIdentity, subscript_key
from migrate.apex_plan.vocabulary import (
    HELPER_NAME,
    HELPER_SCALER,
    HELPER_SOURCE,
    STATE_DICT,
    Unplannable,
)


class CheckpointPlanning(Step):
    """``amp.state_dict`` and ``amp.load_state_dict``: GradScaler's state, apex checkpoints converted.

    It reads the ``FileTree``, the classified sites and the frozen ``Setup``, and writes to the ``Draft``.
    """

    def plan_state_dicts(self) -> None:
        calls = self.sites.calls["state_dict"] + self.sites.calls["load_state_dict"]
        if calls and self.setup.o0 and self.setup.scaler is None:
            raise Unplannable(calls[0], "O0 has no loss scaler whose state could be saved")
        for call in self.sites.calls["state_dict"]:
            if call.args:
                raise Unplannable(call, "`amp.state_dict(destination)` has no native equivalent")
            node, native = self._state_dict_read(call)
            self.draft.replace(node, nodes.parse_expression(native, self.tree.module))
            self.draft.kind(node, STATE_DICT, "`amp.state_dict` is apex's loss-scaler state", f"Use `{native}`")
        for call in self.sites.calls["load_state_dict"]:
            state = nodes.argument(call, 0, "state_dict")
            if state is None or len(call.args) != 1 or nodes.has_star(call):
                raise Unplannable(call, "`amp.load_state_dict` is not called with one state dict")
            self.draft.replace(call, self.fitted(call, nodes.parse_expression(f"{self.setup.scaler}.load_state_dict({HELPER_NAME}({nodes.code(state.value)}, {self.setup.scaler}))", self.tree.module)))
            self.draft.kind(call, STATE_DICT, "`amp.load_state_dict` is apex's loss-scaler state", f"Use `{self.setup.scaler}.load_state_dict(...)`, converting old apex checkpoints")
        if self.sites.calls["load_state_dict"] and HELPER_NAME not in self.tree.names:
            self.draft.after_imports.append(HELPER_SOURCE)

    def _state_dict_read(self, call: cst.Call) -> tuple[cst.CSTNode, str]:
        """What replaces ``amp.state_dict()`` and the keys read from it: GradScaler's state has
        other keys, so ``amp.state_dict()["loss_scaler0"]["loss_scale"]`` reads the scale itself."""
        keys, node = [], call
        while True:
            outer = self.tree.parent.get(id(node))
            if not (isinstance(outer, cst.Subscript) and outer.value is node):
                break
            keys.append(subscript_key(outer))
            node = outer
        if not keys:
            return call, f"{self.setup.scaler}.state_dict()"
        native = {"loss_scale": f"{self.setup.scaler}.get_scale()", "unskipped": f'{self.setup.scaler}.state_dict()["_growth_tracker"]'}
        if len(keys) == 2 and (keys[0] or "").startswith("loss_scaler") and keys[1] in native:
            return node, native[keys[1]]
        raise Unplannable(call, "apex's loss-scaler state is read by key here; GradScaler's state has other keys")

    def plan_state_alone(self) -> None:
        """``amp.state_dict()``/``amp.load_state_dict()`` in a file with neither ``initialize`` nor
        ``scale_loss`` (a checkpoint utility): each function doing it takes the GradScaler as a new
        ``scaler=None`` parameter and saves or loads its state when one is given. Its callers, in
        other files, must pass theirs: a ``TODO(ampmigrate)`` says so until they do."""
        calls = self.sites.calls["state_dict"] + self.sites.calls["load_state_dict"]
        if self.setup.scaler is None:
            raise Unplannable(calls[0], "neither `amp.initialize` nor `amp.scale_loss` is in this file, so the scaler lives elsewhere")
        if self.setup.callers_kept:  # rewritten alone, it would stop saving the state apex keeps for them
            raise Unplannable(calls[0], f"its callers ({', '.join(self.setup.callers_kept)}) stay on apex amp in this run and "
                              "save or load apex's loss-scaler state through it: migrate them together")
        if self.setup.initialize_kept:  # no GradScaler is made for those runs, and apex's state would go unsaved
            raise Unplannable(calls[0], f"apex amp stays initialized at {', '.join(self.setup.initialize_kept)} after this run, and "
                              "its loss-scaler state is saved or loaded through this file: migrate them together")
        passed = self.setup.callers_pass  # `migrate.state_helpers`: every caller, migrated in this run, passes it
        if passed and self.setup.scaler != HELPER_SCALER:
            raise Unplannable(calls[0], f"its callers pass the GradScaler as `{HELPER_SCALER}=`, a name this file uses already")
        if passed:
            self.draft.notes.append(f"each caller of its functions that ran with apex passes the GradScaler as `{HELPER_SCALER}=`, migrated in this run")
        else:
            self.draft.unsafe.append(
                f"neither `amp.initialize` nor `amp.scale_loss` is in this file: its functions take the GradScaler as "
                f"`{self.setup.scaler}=None` and save or load its state only when given one; pass it from the callers"
            )
        functions: dict[int, tuple[cst.FunctionDef, cst.CSTNode]] = {}
        for call in calls:
            function = self.tree.function(call)
            if function is None or any(p.name.value == self.setup.scaler for p in (*function.params.params, *function.params.kwonly_params)):
                raise Unplannable(call, "neither `amp.initialize` nor `amp.scale_loss` is in this file, so the scaler lives elsewhere")
            statement = self.tree.statement(call)
            functions.setdefault(id(function), (function, statement))
            small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
            if call in self.sites.calls["load_state_dict"] and isinstance(small, cst.Expr) and small.value is call:
                state = nodes.argument(call, 0, "state_dict")
                if state is None or len(call.args) != 1:
                    raise Unplannable(call, "`amp.load_state_dict` is not called with one state dict")
                converted = f"{HELPER_NAME}({nodes.code(state.value)}, {self.setup.scaler})"
                line = f"{self.setup.scaler}.load_state_dict({converted})"
                if self.tree.line_indent(statement) + 4 + len(line) > self.tree.line_limit:
                    line = f"{self.setup.scaler}.load_state_dict(\n        {converted},\n    )"
            elif call in self.sites.calls["state_dict"] and not call.args:
                node, native = self._state_dict_read(call)
                if not (isinstance(small, cst.Assign) and small.value is node):
                    if not self._none_beside(node):
                        raise Unplannable(call, "apex's loss-scaler state is used inside an expression here, with no scaler in this file")
                    # `"amp": amp.state_dict() if self.use_amp else None`: the file saves None for
                    # a run without a scaler already, and so for a call that hands none
                    given = nodes.parse_expression(f"({native} if {self.setup.scaler} is not None else None)", self.tree.module)
                    # the statement is replaced as a whole, so that the marker can go on it
                    written = self.draft.replacements.get(id(statement), (statement, statement))[1]
                    self.draft.replace(statement, written.visit(ReplaceByIdentity({id(node): given})))
                    self.draft.kind(statement, STATE_DICT, "apex's loss-scaler state is saved here",
                                    f"Save the state of a GradScaler passed as `{self.setup.scaler}=`, else None")
                    continue
                line = " = ".join([*(nodes.code(t.target) for t in small.targets), native])
            else:
                raise Unplannable(call, "apex's loss-scaler state is used inside an expression here, with no scaler in this file")
            new = nodes.parse_statements(f"if {self.setup.scaler} is not None:\n    {line}\n", self.tree.module)[0]
            self.draft.replace(statement, nodes.with_leading(new, statement))
            self.draft.kind(statement, STATE_DICT, "apex's loss-scaler state is saved or loaded here", f"Save or load the state of a GradScaler passed as `{self.setup.scaler}=`")
        for function, statement in functions.values():
            self._take_scaler(function)
            if function.name.value not in passed:
                self.draft.leave_marker(statement, f"pass the GradScaler as `{self.setup.scaler}=` where `{function.name.value}` is called")
        if self.sites.calls["load_state_dict"] and HELPER_NAME not in self.tree.names:
            self.draft.after_imports.append(HELPER_SOURCE)

    def _none_beside(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is an arm of ``x if test else None`` (or ``None if test else x``)."""
        test = self.tree.parent.get(id(node))
        if type(test) is not cst.IfExp or test.test is node:
            return False
        other = test.orelse if test.body is node else test.body
        return type(other) is cst.Name and other.value == "None"

    def _take_scaler(self, function: cst.FunctionDef) -> None:
        params = function.params
        param = nodes.parse_statements(f"def f({self.setup.scaler}=None): pass\n", self.tree.module)[0].params.params[0]
        separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        if isinstance(params.star_arg, cst.Param) or isinstance(params.star_arg, cst.ParamStar):
            new = params.with_changes(kwonly_params=appended(list(params.kwonly_params), param, separator))
        else:
            new = params.with_changes(params=appended(list(params.params), param, separator))
        self.draft.replace(params, new)
        self.draft.kind(params, STATE_DICT, "apex's loss-scaler state is saved or loaded in this function",
                   f"Take the GradScaler as `{self.setup.scaler}=None`")
