"""The amp module handed on (``model.amp = amp``, ``f(amp=amp)``, ``amp if fp16 else None``):
the GradScaler goes where it went, and its receivers' calls become the scaler's; ``self.amp = amp``
that only ever stands in for the module is the module under another name."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.vocabulary import CORE, HELPER_NAME, HELPER_SOURCE, INITIALIZE, STATE_DICT, InitializeSite
from migrate.flow.receivers import parameter_taking, receivers
from migrate.tree_walk import descendants, walk


class HandedOnPlanning:
    """The amp module handed on to a parameter or an attribute, and what receives it.

    A part of ``Planner``: its methods read the ``FileTree``, the classified sites and the frozen
    ``Setup``, and write to the ``Draft``.
    """

    def _escape(self, node: cst.CSTNode) -> str | None:
        """``model.amp = amp`` or ``f(amp=amp)``, also as ``amp if fp16 else None``: the name the
        module is handed on under (the GradScaler takes its place, so ``None`` still means "off")."""
        parent = self.tree.parent.get(id(node))
        if isinstance(parent, cst.IfExp) and nodes.is_none(parent.orelse if parent.body is node else parent.body):
            node, parent = parent, self.tree.parent.get(id(parent))
        if isinstance(parent, cst.Assign) and parent.value is node and len(parent.targets) == 1:
            target = parent.targets[0].target
            # `self.amp = amp` stays with its object; `args.amp = amp` goes wherever `args` goes,
            # other files included, which would keep handing the module to what expects a scaler
            owned = isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self"
            return target.attr.value if owned else None
        if isinstance(parent, cst.Arg) and parent.value is node:
            if parent.keyword is not None:
                return parent.keyword.value
            taken = parameter_taking(self.tree.module, self.tree.parent, parent)  # `train(model, amp)`: by position
            return taken[1] if taken is not None else None
        return None

    def _find_stand_ins(self) -> None:
        """``self.amp = amp`` where the file only ever calls apex's API on ``self.amp`` (or assigns
        it): the attribute is another name for the module, so its calls are the module's sites
        and the assignment goes."""
        uses: dict[str, list[cst.Attribute]] = {}

        class _Uses(cst.CSTVisitor):
            def visit_Attribute(self, node: cst.Attribute) -> None:
                if isinstance(node.value, cst.Name) and node.value.value == "self":
                    uses.setdefault(node.attr.value, []).append(node)

        candidates = []
        for node, alias in self.escapes:
            assign = self.tree.parent.get(id(node))
            if isinstance(assign, cst.Assign) and nodes.code(assign.targets[0].target) == f"self.{alias}":
                candidates.append((node, alias, assign))
        if not candidates:
            return
        walk(self.tree.module, _Uses())
        for node, alias, assign in candidates:
            calls, plain = [], True
            for use in uses.get(alias, []):
                parent = self.tree.parent.get(id(use))
                call = self.tree.parent.get(id(parent))
                if isinstance(parent, cst.Attribute) and parent.attr.value in CORE and isinstance(call, cst.Call) and call.func is parent:
                    calls.append((parent.attr.value, call))
                elif not self._assigned(use):
                    plain = False
            if not plain or not calls:
                continue
            others = [use for use in uses[alias] if self._assigned(use) and self.tree.statement(use) is not self.tree.statement(assign)]
            self._stand_ins_assigned_once = self._stand_ins_assigned_once and all(self._sets_none(use) for use in others)
            self.escapes.remove((node, alias))
            statement = self.tree.statement(assign)
            self._stand_in_assignments.append(statement)
            for kind, call in calls:
                self.sites[kind].append(call)
                self._stand_in_calls.add(id(call))

    def _only_stand_ins_set_beside(self, init: InitializeSite) -> bool:
        """Whether the scaler is only ever used through ``self.amp``, a stand-in for the module that
        is given the module nowhere but just before ``init``, in its block (elsewhere at most
        ``None``): wherever ``init`` has not run, the file failed on ``self.amp`` exactly as its
        rewrite fails on the scaler."""
        block = self.tree.parent.get(id(init.statement))
        body = list(getattr(block, "body", ()))
        used = [call for kind in CORE if kind != "initialize" for call in self.sites[kind]]
        return (
            bool(self._stand_in_assignments) and not self.escapes and self._stand_ins_assigned_once
            and all(id(call) in self._stand_in_calls for call in used)
            and all(statement in body and body.index(statement) < body.index(init.statement) for statement in self._stand_in_assignments)
        )

    def _set_to_none_beside(self, name: cst.Name) -> bool:
        """Whether the function (or module) handing on ``name`` also assigns it ``None``."""
        scope = self.tree.function(name) or self.tree.module
        return any(type(node) is cst.Assign and nodes.is_none(node.value)
                   and any(nodes.code(target.target) == name.value for target in node.targets)
                   for node in descendants(scope))

    def _sets_none(self, target: cst.CSTNode) -> bool:
        """Whether the assignment to ``target`` gives it ``None`` (``a.x, a.y = [None, None]`` too)."""
        statement = self.tree.statement(target)
        values = [small.value for small in getattr(statement, "body", ()) if isinstance(small, cst.Assign)]
        return len(values) == 1 and all(nodes.is_none(value) for value in (
            [e.value for e in values[0].elements] if isinstance(values[0], (cst.List, cst.Tuple)) else values))

    def _assigned(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is a target of an assignment (also inside a tuple of targets)."""
        parent = self.tree.parent.get(id(node))
        while isinstance(parent, (cst.Element, cst.Tuple, cst.List)):
            node, parent = parent, self.tree.parent.get(id(parent))
        return isinstance(parent, cst.AssignTarget) and parent.target is node

    def _find_alias_sites(self, aliases: set[str]) -> None:
        """``amp.scale_loss`` / ``amp.master_params`` called on what received the handed-on module:
        a parameter or an attribute of that name (``def run(..., amp=None)``, ``self.amp``)."""
        known = {id(call) for kind in CORE for call in self.sites[kind]}
        for node in descendants(self.tree.module):
            func = node.func if type(node) is cst.Call else None
            if not isinstance(func, cst.Attribute) or id(node) in known:
                continue
            holder = func.value
            name = holder.value if isinstance(holder, cst.Name) else holder.attr.value if isinstance(holder, cst.Attribute) else None
            if name in aliases and func.attr.value == "initialize":
                # A GradScaler has no `initialize`: the receiver would call it on the scaler.
                self.blockers.append((node, f"`{nodes.code(holder)}.initialize` is called on the handed-on module"))
            elif name in aliases and func.attr.value in ("scale_loss", "master_params"):
                self.sites[func.attr.value].append(node)
                self.alias_of[id(node)] = nodes.code(holder)

    def _scaler_of(self, call: cst.Call) -> str:
        """The scaler a site uses: the plan's, or what received the handed-on module."""
        return self.alias_of.get(id(call), self.setup.scaler)

    def _receiver_calls(self) -> tuple[tuple[str, cst.Call], ...] | None:
        """The receivers' calls of apex's API (by method), where every read of the handed-on module is seen (the same-file function or the
        class's attribute that receives it, followed on) and does what a GradScaler in its place
        does the same: the API the rewrite turns into the scaler's, a test for ``None`` or truth,
        its state saved or loaded (old apex checkpoints converted on load); else None."""
        reads = []
        for node, _ in self.escapes:
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
            self.draft.replace(call, nodes.parse_expression(
                f"{holder}.load_state_dict({HELPER_NAME}({nodes.code(state.value)}, {holder}))", self.tree.module))
            self.draft.kind(call, STATE_DICT, "the handed-on module loads apex's loss-scaler state here",
                       "Load it into the GradScaler, converting old apex checkpoints")
            if HELPER_NAME not in self.tree.names and HELPER_SOURCE not in self.draft.after_imports:
                self.draft.after_imports.append(HELPER_SOURCE)

    def _plan_escapes(self) -> None:
        self._plan_receiver_loads()
        for statement in self._stand_in_assignments:
            self.draft.replace(statement, cst.RemoveFromParent())
            self.draft.kind(statement, INITIALIZE, "the apex.amp module is kept on `self` here", "Remove it: its calls are rewritten where they are")
        for node, _ in self.escapes:
            handed = self.setup.scaler
            if isinstance(node, cst.Name) and self._set_to_none_beside(node):
                # `else: amp = None` then `train(..., amp)`: where apex was off the receiver got
                # None, and tests for it (`if amp:`); a disabled scaler would pass that test
                handed = f"{self.setup.scaler} if {self.setup.scaler}.is_enabled() else None"
            self.draft.replace(node, nodes.parse_expression(handed, self.tree.module))
            self.draft.kind(node, INITIALIZE, "the apex.amp module is handed on here", f"Hand on `{self.setup.scaler}`, the GradScaler, instead")
