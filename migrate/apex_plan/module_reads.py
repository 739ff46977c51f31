"""Statements that touch apex's module itself rather than its API, each with its native form:
the loss scale set through apex's internals (``init_scale``), ``"state_dict" in amp.__dict__``
(always true of a GradScaler), the legacy ``amp.init()`` handle left unused, and a log line naming
apex's install path or version (both go with apex)."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.vocabulary import INITIALIZE, STATE_DICT, InitializeSite, Unplannable
from migrate.tree_walk import walk
from migrate.unread import Unparsed

_ABOUT_THE_MODULE = frozenset({"__path__", "__file__", "__version__"})
_LOGGERS = frozenset({"print", "info", "debug", "warning", "warn", "log"})


class ModuleReadPlanning:
    """apex's module touched directly: its internals' loss scale, ``amp.__dict__`` probes,
    ``amp_handle = amp.init(...)`` never used, and ``logger.info(f"... {amp.__path__}")``.

    A part of ``Planner``: its methods read the ``FileTree``, the classified sites and the frozen
    ``Setup``, and write to the ``Draft``.
    """

    def _scale_poke(self, attr: str, node: cst.CSTNode) -> bool:
        """``amp._amp_state.loss_scalers[0]._loss_scale = X``: the scale to start from, set by hand."""
        subscript = self.tree.parent.get(id(node))
        attribute = self.tree.parent.get(id(subscript))
        target = self.tree.parent.get(id(attribute))
        assign = self.tree.parent.get(id(target))
        if not (attr == "_amp_state.loss_scalers" and isinstance(subscript, cst.Subscript) and isinstance(attribute, cst.Attribute)
                and attribute.attr.value == "_loss_scale" and isinstance(target, cst.AssignTarget) and isinstance(assign, cst.Assign)
                and len(assign.targets) == 1 and nodes.is_pure(assign.value)):
            return False
        self.scale_pokes.append((self.tree.statement(assign), assign.value, node))
        return True

    def _plan_scale_pokes(self, inits: list[InitializeSite]) -> None:
        """The scale poked right after ``initialize`` (in its block) is the scaler's ``init_scale``."""
        for statement, value, _ in self.scale_pokes:
            block = self.tree.parent.get(id(statement))
            body = list(getattr(block, "body", ()))
            init = next((i for i in inits if self.tree.parent.get(id(i.statement)) is block
                         and body.index(i.statement) < body.index(statement)), None)
            if init is None:
                raise Unplannable(statement, "apex's loss scale is set by hand away from `amp.initialize`")
            init.scaler_args[:] = [a for a in init.scaler_args if not a.startswith("init_scale=")] + [f"init_scale={nodes.code(value)}"]
            self.draft.replace(statement, cst.RemoveFromParent())
            self.draft.kind(statement, INITIALIZE, "apex's loss scale is set through its internals", "Start the GradScaler at that scale")

    def _probe(self, node: cst.CSTNode) -> None:
        """``if "state_dict" in amp.__dict__:`` (no ``else``): asks whether apex is new enough to
        save its state; GradScaler always is, so the ``if`` gives way to its body."""
        comparison = self.tree.parent.get(id(self.tree.parent.get(id(node))))
        branch = self.tree.parent.get(id(comparison))
        probed = nodes.literal_string(getattr(comparison, "left", None))
        if probed in ("state_dict", "load_state_dict") and isinstance(branch, cst.If) and branch.test is comparison and branch.orelse is None:
            self.probes.append((branch, node))
        else:
            self.blockers.append((node, "`amp.__dict__` is probed here: apex's own attributes have no native counterpart"))

    def _plan_probes(self) -> None:
        for branch, _ in self.probes:
            body = list(branch.body.body)
            self.draft.replace(branch, cst.FlattenSentinel([nodes.with_leading(body[0], branch), *body[1:]]))
            self.draft.kind(branch, STATE_DICT, "apex's `state_dict` is probed for", "Drop the test: GradScaler has `state_dict` and `load_state_dict`")

    def _module_read(self, attr: str, node: cst.CSTNode) -> bool:
        """Whether ``amp.<attr>`` at ``node`` sits in a statement that can simply go (planned later)."""
        statement = self.tree.statement(node)
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
        if attr == "init":
            call = self.tree.parent.get(id(node))
            if not (isinstance(call, cst.Call) and call.func is node):
                return False
            if isinstance(small, cst.Assign) and small.value is call and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
                handle = small.targets[0].target.value
                if self._name_count(handle) > 1:
                    return False  # `amp_handle.scale_loss(...)`: the legacy API is in use
            elif not (isinstance(small, cst.Expr) and small.value is call):
                return False
            self.legacy_handles.append(call)
        elif attr in _ABOUT_THE_MODULE:
            logged = small.value if isinstance(small, cst.Expr) else None
            func = getattr(logged, "func", None)
            name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
            if name not in _LOGGERS:
                return False
            self.draft.notes.append("a log line naming apex's module goes with it")
        else:
            return False
        self.module_reads.append(statement)
        return True

    def _name_count(self, name: str) -> int:
        found = 0

        class _Count(cst.CSTVisitor):
            def visit_Name(self, node: cst.Name) -> None:
                nonlocal found
                found += node.value == name

            def visit_Unparsed(self, node: Unparsed) -> None:  # a definition kept as text
                nonlocal found
                found += node.uses(name)

        walk(self.tree.module, _Count())
        return found

    def _plan_module_reads(self, inits: list[InitializeSite]) -> None:
        for call in self.legacy_handles:
            enabled = nodes.argument(call, 0, "enabled")
            # O1's `initialize` runs `amp.init()` itself: a second handle beside it, in the same
            # function, patched the same casts again; a disabled one patched nothing.
            beside_o1 = any(init.level == "O1" and self.tree.function(init.statement) is self.tree.function(call) for init in inits)
            if not (beside_o1 or (enabled is not None and nodes.code(enabled.value) == "False")):
                self.draft.unsafe.append(
                    f"the legacy `amp.init()` handle (line {self.tree.line(call)}) is unused and goes: autocast now makes the casts it switched on"
                )
        for statement in dict.fromkeys(self.module_reads):
            block = self.tree.parent.get(id(statement))
            alone = isinstance(block, cst.IndentedBlock) and len(block.body) == 1
            self.draft.replace(statement, nodes.with_leading(cst.SimpleStatementLine([cst.Pass()]), statement) if alone else cst.RemoveFromParent())
            self.draft.kind(statement, INITIALIZE, "this statement only touches apex's module", "Remove it with apex")
