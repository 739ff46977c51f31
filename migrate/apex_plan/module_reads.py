"""Statements that touch apex's module itself rather than its API, each with its native form:
the loss scale set through apex's internals (``init_scale``), ``"state_dict" in amp.__dict__``
(always true of a GradScaler), the legacy ``amp.init()`` handle left unused, and a log line naming
apex's install path or version (both go with apex)."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Step
from migrate.apex_plan.syntax import calls
from migrate.apex_plan.vocabulary import (
    INITIALIZE,
    SCALE_LOSS,
    STATE_DICT,
    InitializeSite,
    Unplannable,
)
from migrate.tree_walk import descendants

_ABOUT_THE_MODULE = frozenset({"__path__", "__file__", "__version__"})
_LOGGERS = frozenset({"print", "info", "debug", "warning", "warn", "log"})


class ModuleReadPlanning(Step):
    """apex's module touched directly: its internals' loss scale, ``amp.__dict__`` probes,
    ``amp_handle = amp.init(...)`` never used, and ``logger.info(f"... {amp.__path__}")``.

    It reads the ``FileTree``, the classified sites and the frozen ``Setup``, and writes to the ``Draft``.
    """

    def plan_scale_pokes(self, inits: list[InitializeSite]) -> list[InitializeSite]:
        """The scale poked right after ``initialize`` (in its block) is the scaler's ``init_scale``:
        ``inits``, with the scaler's options that follow from it."""
        inits = list(inits)
        for statement, value, _ in self.sites.scale_pokes:
            block = self.tree.parent.get(id(statement))
            body = list(getattr(block, "body", ()))
            init = next((i for i in inits if self.tree.parent.get(id(i.statement)) is block
                         and body.index(i.statement) < body.index(statement)), None)
            if init is None:
                raise Unplannable(statement, "apex's loss scale is set by hand away from `amp.initialize`")
            options = [a for a in init.scaler_args if not a.startswith("init_scale=")] + [f"init_scale={nodes.code(value)}"]
            inits[inits.index(init)] = init._replace(scaler_args=options)
            self.draft.replace(statement, cst.RemoveFromParent())
            self.draft.kind(statement, INITIALIZE, "apex's loss scale is set through its internals", "Start the GradScaler at that scale")
        return inits

    def plan_scale_reads(self) -> None:
        """apex's current loss scale, read through its internals, is the scaler's ``get_scale()``.
        apex lowered it as the scaled backward pass overflowed, GradScaler does at ``update()``,
        after the step: a read that no step of the iteration comes before differs on that step."""
        for read, _ in self.sites.scale_reads:
            if self.setup.o0 or self.setup.scaler is None or self.setup.extra_scalers:
                raise Unplannable(read, "apex's loss scale is read here, and this file has no single GradScaler to read it from")
            statement = self.tree.statement(read)
            if not self._after_a_step(statement):
                self.draft.mark(statement, f"apex's loss scale is read at line {self.tree.line(read)} where no optimizer step "
                                "comes before it", "this reads the loss scale before the step: apex had lowered it already "
                                "when the backward pass overflowed, GradScaler lowers it at `update()`, after the step")
            self.draft.replace(read, nodes.parse_expression(f"{self.setup.scaler}.get_scale()", self.tree.module))
            self.draft.kind(read, SCALE_LOSS, "apex's loss scale is read through its internals", f"Use `{self.setup.scaler}.get_scale()`")

    def _after_a_step(self, statement: cst.CSTNode) -> bool:
        """Whether an ``optimizer.step()`` runs before ``statement`` in its block, or in a block around it."""
        node = statement
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
            block = self.tree.parent.get(id(node))
            body = list(getattr(block, "body", ())) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
            if node in body and any(_steps(earlier) for earlier in body[: body.index(node)]):
                return True
            node = block
        return False

    def plan_probes(self) -> None:
        for branch, _ in self.sites.probes:
            body = list(branch.body.body)
            self.draft.replace(branch, cst.FlattenSentinel([nodes.with_leading(body[0], branch), *body[1:]]))
            self.draft.kind(branch, STATE_DICT, "apex's `state_dict` is probed for", "Drop the test: GradScaler has `state_dict` and `load_state_dict`")

    def plan_module_reads(self, inits: list[InitializeSite]) -> None:
        for call in self.sites.legacy_handles:
            enabled = nodes.argument(call, 0, "enabled")
            # O1's `initialize` runs `amp.init()` itself: a second handle beside it, in the same
            # function, patched the same casts again; a disabled one patched nothing.
            beside_o1 = any(init.level == "O1" and self.tree.function(init.statement) is self.tree.function(call) for init in inits)
            if not (beside_o1 or (enabled is not None and nodes.code(enabled.value) == "False")):
                self.draft.unsafe.append(
                    f"the legacy `amp.init()` handle (line {self.tree.line(call)}) is unused and goes: autocast now makes the casts it switched on"
                )
        for statement in dict.fromkeys(self.sites.module_reads):
            statement = self._test_left_empty(statement)
            block = self.tree.parent.get(id(statement))
            alone = isinstance(block, cst.IndentedBlock) and len(block.body) == 1
            self.draft.replace(statement, nodes.with_leading(cst.SimpleStatementLine([cst.Pass()]), statement) if alone else cst.RemoveFromParent())
            self.draft.kind(statement, INITIALIZE, "this statement only touches apex's module", "Remove it with apex")


    def _test_left_empty(self, statement: cst.CSTNode) -> cst.CSTNode:
        """The ``if args.verbose:`` that holds only ``statement`` and tests without calling
        anything, which goes with it; else ``statement``."""
        block = self.tree.parent.get(id(statement))
        owner = self.tree.parent.get(id(block))
        if not (isinstance(block, cst.IndentedBlock) and len(block.body) == 1 and isinstance(owner, cst.If)
                and owner.orelse is None and not isinstance(self.tree.parent.get(id(owner)), cst.If)):
            return statement
        if any(type(node) in (cst.Call, cst.NamedExpr) for node in descendants(owner.test)) or self.draft.touched(owner):
            return statement
        return owner


def _steps(statement: cst.CSTNode) -> bool:
    """Whether ``statement`` calls an optimizer's ``step()`` (``optimizer.step()``, ``opt_d.step()``)."""
    return any(not call.args for call in calls(statement, lambda name: name == "step"))
