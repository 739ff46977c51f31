"""Warm-up backward passes: a pass whose gradients are cleared right after it (``model.zero_grad()``),
run to allocate memory before training. No step sees its gradients; apex cast its forward pass."""
from __future__ import annotations

from migrate.apex_plan.autocast import AutocastPlanning
from migrate.apex_plan.conditions import StepConditions
from migrate.apex_plan.context import Step
from migrate.apex_plan.syntax import backward_calls
from migrate.apex_plan.vocabulary import INITIALIZE, attribute_set


class WarmUpPlanning(Step):
    """It reads the ``FileTree``, the classified sites and the frozen ``Setup``, and writes to the ``Draft``."""

    def plan_warm_ups(self) -> None:
        """Each warm-up backward pass after ``initialize`` (``StepConditions.warm_up``): its
        forward pass and loss go under autocast, as apex cast them, so that it allocates what
        training does."""
        conditions, regions = StepConditions(self.context), AutocastPlanning(self.context)
        inits = self.sites.calls["initialize"]
        for backward in backward_calls(self.tree.module, nested=True):
            line = self.tree.statement(backward)
            after = [call for call in inits if self.tree.function(call) is self.tree.function(backward)
                     and self.tree.order[id(self.tree.statement(call))] < self.tree.order[id(line)]]
            if not after or self.tree.inside_any(backward, self.sites.scale_loss_statements) or not conditions.warm_up(backward):
                continue
            window = self.draft.window(self.tree.parent[id(line)], line)
            start = regions.slice_start(window, backward.func.value, forward_only=True)
            if start is None:
                continue
            enabled = f", enabled={self.setup.scaler}.is_enabled()" if self.setup.may_be_disabled else ""
            if self.setup.in_block:
                enabled = f", enabled={attribute_set(self.setup.scaler)} and {self.setup.scaler}.is_enabled()"
            statements = window[start:]
            self.draft.replace(statements[0], regions.under_autocast(statements, enabled))
            self.draft.kind(statements[0], INITIALIZE, "a warm-up forward pass of an `amp.initialize`d model ran under apex's casts",
                            "Wrap the forward pass and the loss in `torch.autocast`")
            regions.move_into_region(statements[1:], "a warm-up forward pass of an `amp.initialize`d model ran under apex's casts")

