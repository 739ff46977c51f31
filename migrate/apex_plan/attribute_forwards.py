"""A forward pass in another method whose output the loss reads through ``self``.

A GAN model's ``optimize_parameters()`` calls ``forward()`` (``self.fake_B = self.netG(self.real_A)``),
then ``backward_G()``, which computes the loss from ``self.fake_B`` and scales it. apex O1 cast that
forward pass too, wherever ``forward()`` ran (at evaluation as well: its casts were global), so the
statements of ``forward()`` from its first model call to the last one the loss reads go under an
autocast of their own, enabled as the region at the scaled backward. Where they cannot (a base
class's method, a forward pass inside an ``if``, the scaler not reachable there), the rewrite is
unsafe and says so. Where a function scaling a loss calls that method, the region planned there
may cover it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.autocast import AutocastPlanning
from migrate.apex_plan.earlier_regions import in_a_region
from migrate.apex_plan.loss_slice import calls_model, function_slice
from migrate.apex_plan.syntax import SUSPENDS, assigned_names, contains, defines, read_names
from migrate.apex_plan.vocabulary import ScaleLossSite
from migrate.tree_walk import descendants

if TYPE_CHECKING:
    from migrate.apex_plan.context import Step


@dataclass(frozen=True)
class AttributeForward:
    """``method`` sets the loss's ``attribute`` by a forward pass at ``assignment``."""

    method: cst.FunctionDef
    in_owner: bool  # the method is the scaling class's own, not a base's
    attribute: str
    assignment: cst.Assign
    line: int

    @property
    def reason(self) -> str:
        return (f"the loss is computed from `{self.attribute}`, which `{self.method.name.value}()` computes by a forward pass "
                f"outside autocast (line {self.line}; apex cast it too): put it under `torch.autocast` by hand")


def forwards_in_other_methods(step: Step, scale: ScaleLossSite) -> list[AttributeForward]:
    """The forward passes the region at ``scale`` leaves outside autocast, which apex cast: the
    loss is computed from ``self.x``, which another method of the class (or of a base in the
    file), one no function scaling a loss calls, sets from a model's call."""
    tree = step.tree
    function = tree.function(scale.statement)
    owner = tree.owner_class(function)
    if owner is None:
        return []
    wanted = read_names(scale.loss)
    for line in function_slice(function, wanted):
        wanted |= read_names(line)
    calls = [node for node in descendants(function.body, nodes.not_a_definition) if type(node) is cst.Call]
    called = {nodes.code(call.func) for call in calls}
    models = tree.models_seen_from(scale.statement, step.setup.model_codes)
    # a model handed to the loss (`self.loss(data, self.model)`) is no output of one
    attributes = {name for name in wanted if name.startswith("self.") and name.count(".") == 1} - assigned_names(function.body) - called - models
    if not attributes:
        return []
    scaling = {id(found): found for call in step.sites.calls["scale_loss"] if (found := tree.function(call)) is not None}
    found = []
    for cls in tree.lineage(owner):
        for method in cls.body.body:
            if type(method) is not cst.FunctionDef or id(method) in scaling:
                continue
            for node in descendants(method.body, nodes.not_a_definition):
                if type(node) is not cst.Assign or not _runs_a_model(step, node.value, models):
                    continue
                target = next((nodes.code(t.target) for t in node.targets if nodes.code(t.target) in attributes), None)
                if target is not None:
                    found.append(AttributeForward(method, cls is owner, target, node, tree.line(node)))
    return found


def _runs_a_model(step: Step, value: cst.BaseExpression, models: set[str]) -> bool:
    """A model's own call in ``value``, or a call of the file's function or method that makes one
    (``run(self.real)`` after ``def run(t): return self.gen(t)``)."""
    return calls_model(value, models) or any(
        type(node) is cst.Call and (helper := step.tree.helper(node)) is not None and calls_model(helper.body, models)
        for node in descendants(value, nodes.not_a_definition))


def forward_statements(step: Step, forwards: list[AttributeForward]) -> list[cst.BaseStatement] | None:
    """The statements of one method's body from its first model call to its last: what goes under
    autocast there (every loss reading any of them plans the same region). None where the method
    is not the owner class's own, a forward pass of ``forwards`` sits in a block of the body (an
    ``if``, a loop), or a statement between defines something, suspends, or has a fix of its own."""
    method = forwards[0].method
    if not all(f.in_owner for f in forwards) or not isinstance(method.body, cst.IndentedBlock):
        return None
    body = list(method.body.body)
    holding = {id(step.tree.statement(f.assignment)) for f in forwards}
    if not holding <= {id(statement) for statement in body if type(statement) is cst.SimpleStatementLine}:
        return None
    models = step.tree.models_seen_from(body[0], step.setup.model_codes)
    running = [i for i, statement in enumerate(body) if step.tree.calls_model(statement, models, step.sites.ids)]
    if not running:
        return None
    region = body[running[0]:running[-1] + 1]
    if any(step.draft.touched(s) or contains(s, SUSPENDS) or defines(s) for s in region):
        return None
    return region


class AttributeForwardPlanning(AutocastPlanning):
    """After every scaled backward's region is planned: it reads them, the ``FileTree`` and the
    classified sites, and writes to the ``Draft``."""

    def plan_attribute_forwards(self, scales: list[ScaleLossSite]) -> None:
        """An autocast of its own around each other method's forward passes a loss reads
        (``self.fake_B`` set by ``forward()``), unless every call of that method is already in a
        region (``backward_G()`` calling ``self.forward()`` before its loss); unsafe where one
        cannot go there."""
        by_method: dict[int, tuple[ScaleLossSite, list[AttributeForward]]] = {}
        for scale in scales:
            for found in forwards_in_other_methods(self, scale):
                forwards = by_method.setdefault(id(found.method), (scale, []))[1]
                if all(f.assignment is not found.assignment for f in forwards):
                    forwards.append(found)  # a GAN's D and G losses read the same `self.fake`
        for scale, forwards in by_method.values():
            calls = self.tree.calls_of(forwards[0].method)
            if calls and all(in_a_region(self.tree, self.draft.regions, self.tree.statement(call)) for call in calls):
                continue
            region = forward_statements(self, forwards)
            if region is None or not self._scaler_visible_at(region):
                self.draft.unsafe.append(forwards[0].reason)
            elif self._made_before_every_method():
                self._wrap(region, scale, forwards[-1].attribute)
            else:  # `forward()` runs at test time too, where `if self.isTrain:` made no scaler
                asking = AttributeForwardPlanning(self.context._replace(setup=replace(self.setup, in_block=True)))
                asking._wrap(region, scale, forwards[-1].attribute)

    def _made_before_every_method(self) -> bool:
        """Whether the scaler exists whenever another method of the class may run: one not kept on
        ``self``, a disabled one made first, one its users already ask for, or one made in
        ``__init__``'s own lines (where ``initialize`` or the ``if`` holding it was), not in a
        block of them (``if self.isTrain:``)."""
        if not self.setup.scaler.startswith("self.") or self.setup.stand_in is not None or self.setup.in_block:
            return True
        for call in self.sites.calls["initialize"]:
            where = self.setup.guard if self.setup.guard is not None else self.tree.statement(call)
            function = self.tree.function(where)
            if function is None or function.name.value != "__init__" or self.tree.parent.get(id(where)) is not function.body:
                return False
        return True
