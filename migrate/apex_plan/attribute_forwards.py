"""A forward pass in another method whose output the loss reads through ``self``.

A GAN model's ``optimize_parameters()`` calls ``forward()`` (``self.fake_B = self.netG(self.real_A)``),
then ``backward_G()``, which computes the loss from ``self.fake_B`` and scales it. apex O1 cast that
forward pass too; the region at the scaled backward does not reach it, and whether to wrap another
method (``forward()`` runs at evaluation too) is a person's call: the rewrite is unsafe and says so.
Where a function scaling a loss calls that method, the region planned there may cover it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.loss_slice import calls_model, function_slice
from migrate.apex_plan.syntax import assigned_names, read_names
from migrate.apex_plan.vocabulary import ScaleLossSite
from migrate.tree_walk import descendants

if TYPE_CHECKING:
    from migrate.apex_plan.context import Step


def forward_in_another_method(step: Step, scale: ScaleLossSite) -> str | None:
    """Why the region at ``scale`` leaves a forward pass apex cast outside autocast: the loss is
    computed from ``self.x``, which another method of the class (or of a base in the file), one
    no function scaling a loss calls, sets from a model's call. None where none is."""
    tree = step.tree
    function = tree.function(scale.statement)
    owner = tree.owner_class(function)
    if owner is None:
        return None
    wanted = read_names(scale.loss)
    for line in function_slice(function, wanted):
        wanted |= read_names(line)
    calls = [node for node in descendants(function.body, nodes.not_a_definition) if type(node) is cst.Call]
    called = {nodes.code(call.func) for call in calls}
    models = tree.models_seen_from(scale.statement, step.setup.model_codes)
    # a model handed to the loss (`self.loss(data, self.model)`) is no output of one
    attributes = {name for name in wanted if name.startswith("self.") and name.count(".") == 1} - assigned_names(function.body) - called - models
    if not attributes:
        return None
    scaling = {id(found): found for call in step.sites.calls["scale_loss"] if (found := tree.function(call)) is not None}
    # what a function scaling a loss calls may be in its region
    covered = {nodes.code(node.func) for found in scaling.values() for node in descendants(found.body, nodes.not_a_definition)
               if type(node) is cst.Call}
    for cls in tree.lineage(owner):
        for method in cls.body.body:
            if type(method) is not cst.FunctionDef or id(method) in scaling or f"self.{method.name.value}" in covered:
                continue
            for node in descendants(method.body, nodes.not_a_definition):
                if type(node) is not cst.Assign or not calls_model(node.value, models):
                    continue
                target = next((nodes.code(t.target) for t in node.targets if nodes.code(t.target) in attributes), None)
                if target is not None:
                    return (f"the loss is computed from `{target}`, which `{method.name.value}()` computes by a forward pass "
                            f"outside autocast (line {tree.line(node)}; apex cast it too): put it under `torch.autocast` by hand")
    return None

