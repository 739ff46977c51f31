"""O1 inference: ``amp.initialize`` readies models for inference and only the lines after it,
to the end of its function, run after it. apex cast every op from there on, as an autocast around
those lines does (``else: model = amp.initialize(model, opt_level="O1")``, then the evaluation)."""
from __future__ import annotations

import re

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.autocast import AutocastPlanning
from migrate.apex_plan.context import Step
from migrate.apex_plan.hidden_readers import helpers_reached
from migrate.apex_plan.syntax import SUSPENDS, backward_calls, calls, contains, defines, read_names
from migrate.apex_plan.vocabulary import INITIALIZE, InitializeSite, as_bool
from migrate.tree_walk import descendants

# What an inference `initialize` leaves for autocast: the statement it goes with, the lines after
# it, and the region's `enabled` argument.
Tail = tuple[cst.CSTNode, list[cst.BaseStatement], str]

_TRAINING_CALLS = frozenset({"step", "scale_loss", "autocast"})
_TRAINING_NAME = re.compile(r"train|fit", re.IGNORECASE)


class InferenceTailPlanning(Step):
    """It reads the ``FileTree``, the classified sites and the frozen ``Setup``, and writes to the
    ``Draft`` (the region through ``AutocastPlanning``'s own steps)."""

    def inference_tail(self, init: InitializeSite) -> Tail | None:
        """Where ``init`` readies models for inference at O1 and only the lines after it, to the end
        of its function, run after it: apex cast every op from there on, as autocast around those
        lines does (``else: model = amp.initialize(model, opt_level="O1")``, then the evaluation).

        The statement ``init`` leaves (itself, or the ``if flag:`` whose arm it ends), the lines
        after it that go under autocast, and the region's ``enabled`` (the flag's test, or none)."""
        if not init.inference or init.level != "O1" or init.level_expression is not None or init.enabled is not None:
            return None
        if init.restore is not None and init.restore.startswith("return "):
            return None
        if any("." in code for code in init.model_codes):
            return None  # a model kept on an object may run elsewhere, later
        anchor, enabled = init.statement, ""
        block = self.tree.parent.get(id(anchor))
        owner = self.tree.parent.get(id(block))
        if (list(block.body)[-1] is init.statement and init.restore is None and isinstance(owner, cst.If) and owner.body is block
                and nodes.is_pure(owner.test)
                and isinstance(self.tree.parent.get(id(owner)), (cst.IndentedBlock, cst.Module))):  # not an `elif`
            # `if has_amp: model = amp.initialize(model, ...)` last in its arm, then the evaluation:
            # autocast on the lines after the `if`, when its test held.
            anchor, enabled, block = owner, f", enabled={as_bool(owner.test, self.tree.boolean_options)}", self.tree.parent.get(id(owner))
        body = list(block.body)
        rest = body[body.index(anchor) + 1 :]
        training = next((index for index, statement in enumerate(rest) if self._trains(statement, init.model_codes)), None)
        if training is not None:
            # `train(args, model)` after the evaluation: its own regions, nested in this one, would
            # keep autocast's cast weights from one step to the next (cleared where the outermost
            # region exits); the region stops before it, where nothing after it runs the model
            if any(self.tree.calls_model(s, init.model_codes, self.sites.ids) for s in rest[training + 1:]):
                return None
            rest = rest[:training]
        if not any(self.tree.calls_model(s, init.model_codes, self.sites.ids) for s in rest):
            return None
        if any(defines(s) or contains(s, SUSPENDS) or self._returns_models(s, init.model_codes) for s in rest):
            return None  # its caller may run the model it gets back, outside
        if enabled and self.tree.changes_its_test(anchor, rest):
            return None  # the flag may differ by the time the lines after it run
        current = block
        while not isinstance(current, cst.Module):  # up to the function: each block the last that runs in its own
            statement = self.tree.parent.get(id(current))
            if isinstance(statement, cst.FunctionDef):
                return anchor, rest, enabled
            while isinstance(statement, cst.Else) or isinstance(self.tree.parent.get(id(statement)), (cst.If, cst.Else)):
                statement = self.tree.parent.get(id(statement))  # an `else`/`elif` arm: the whole `if` decides
            if not isinstance(statement, (cst.If, cst.With)):
                return None  # a loop runs the lines before it again; a `try` has its handlers after it
            current = self.tree.parent.get(id(statement))
            if not isinstance(current, (cst.IndentedBlock, cst.Module)) or list(current.body)[-1] is not statement:
                return None
        return anchor, rest, enabled

    def _trains(self, statement: cst.CSTNode, models: set[str]) -> bool:
        """Whether ``statement``, or a function of the file it reaches, runs a backward pass, steps,
        scales a loss or enters an autocast region of its own; or hands a model to a function not
        of the file that is named for training (``fit(model, loader)``, ``run_training(model)``)."""
        reached = [statement, *helpers_reached(self.tree, statement, frozenset())]
        return any(backward_calls(each) or calls(each, lambda name: name in _TRAINING_CALLS) for each in reached) or any(
            self.tree.helper(call) is None and _TRAINING_NAME.search(nodes.code(call.func).rsplit(".", 1)[-1])
            and any(nodes.code(arg.value) in models for arg in call.args) for call in calls(statement, lambda name: True))

    @staticmethod
    def _returns_models(statement: cst.CSTNode, models: set[str]) -> bool:
        """A ``return`` that may hand a model back (``return results`` with numbers only does not)."""
        return any(
            node.value is None or bool(read_names(node.value) & models)
            for node in descendants(statement, lambda node: type(node) is not cst.FunctionDef)
            if type(node) is cst.Return
        )

    def plan_inference_tail(self, init: InitializeSite, tail: Tail) -> None:
        """The lines after ``init`` (or after the ``if flag:`` whose arm it ends) go under autocast;
        the call goes (its models are the ones passed in, as under O1)."""
        anchor, rest, enabled = tail
        regions = AutocastPlanning(self.context)
        region = regions.under_autocast(rest, enabled)
        placed = [*nodes.parse_statements(init.restore + "\n", self.tree.module), region] if init.restore else [region]
        if anchor is not init.statement:  # the `if` keeps what else it holds
            kept = [statement for statement in anchor.body.body if statement is not init.statement]
            if kept or anchor.orelse is not None:
                placed.insert(0, anchor.with_changes(body=anchor.body.with_changes(body=kept or [cst.SimpleStatementLine([cst.Pass()])])))
        # The first line takes the place of `anchor`; the region keeps the blank lines above the
        # lines it holds.
        placed = [nodes.with_leading(statement, anchor) if i == 0 else statement if statement is region
                  else nodes.with_leading(statement, cst.SimpleStatementLine([])) for i, statement in enumerate(placed)]
        self.draft.replace(anchor, cst.FlattenSentinel(placed))
        self.draft.kind(anchor, INITIALIZE, "`amp.initialize` readies the models for inference under apex's casts",
                   "Run the lines after it under `torch.autocast`: apex cast every op from there on")
        regions.move_into_region(rest, "what runs after `amp.initialize` ran under apex's casts")
