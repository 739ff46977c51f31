"""Plain backward passes after the scaled step: a second loss stepped by another optimizer
(``stop_loss.backward(); stop_optimizer.step()`` after ``optimizer.step()``). Apex left their
gradients as they were, and so does the scaler, as long as none of them is still there when it
unscales: every way from the plain pass to a scaled optimizer's step, within the iteration and
round the loop into the next one, passes a ``zero_grad()`` that clears them first."""
from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.syntax import calls
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import ScaleLossSite
from migrate.flow.control import Graph

if TYPE_CHECKING:
    from migrate.apex_plan.steps import StepPlanning


def uncleared_plain_backward(steps: StepPlanning, scale: ScaleLossSite, found: list[tuple]) -> str | None:
    """Why the rewrite of ``scale`` may train differently because of a plain backward pass that
    can run in the same pass (``StepPlanning.plain_backwards``) and whose gradients may reach
    the scaled optimizers' steps ``found``; None where there is none."""
    stepped = [line for line, *_ in found]
    for plain in steps.plain_backwards(beside=scale.statement):
        if not cleared_before_the_next_step(steps.tree, plain, scale.statement, stepped, steps.conditions.clearers()):
            # named by its code too: a marker carrying this reason sits in the rewritten file, whose lines moved
            return (f"the plain backward pass `{nodes.code(plain)}` (line {steps.tree.line(plain)}) adds gradients "
                    "that apex kept as they were and `scaler.step` would divide by the scale")
    return None


def cleared_before_the_next_step(tree: FileTree, plain: cst.Call, scaled: cst.CSTNode,
                                 steps: list[cst.CSTNode], clearers: frozenset[str]) -> bool:
    """Whether the gradients of ``plain``, a backward pass outside ``amp.scale_loss`` in the
    function of the scaled backward ``scaled``, never reach one of ``steps`` (the scaled
    optimizers' steps): each way there passes a ``zero_grad()`` of one of ``clearers`` (the
    scaled optimizers, the models ``initialize`` was given)."""
    graph = tree.control_flow(plain, exceptions=True)
    line = tree.statement(plain)
    if not steps or not all(graph.holds(node) for node in (line, scaled, *steps)):
        return False
    clears = [tree.statement(call) for call in calls(graph.root, lambda name: name == "zero_grad", nested=True)
              if nodes.receiver(call) in clearers]
    clears = [clear for clear in clears if graph.holds(clear)]
    iteration = graph.shared_loop(line, scaled)
    if any(graph.shared_loop(step, scaled) is not iteration for step in steps):
        return False
    if _reaches_uncleared(graph, line, steps, clears, iteration):
        return False
    if graph.way_out(line, clears, iteration) is None:
        return True  # cleared before the iteration ends, on every way
    # round the loop (or into the function's next call): from the start of an iteration
    return not _reaches_uncleared(graph, iteration, steps, clears, iteration)


def _reaches_uncleared(graph: Graph, source: cst.CSTNode | None, steps: list[cst.CSTNode],
                       clears: list[cst.CSTNode], iteration: cst.CSTNode | None) -> bool:
    """Whether some way from ``source`` (None: the function's start) runs one of ``steps``
    before one of ``clears``, within one iteration of ``iteration``."""
    wanted = {id(step) for step in steps}
    if source is None:
        entry = graph.entry
        if not isinstance(entry, cst.CSTNode) or any(entry is clear for clear in clears):
            return False
        if id(entry) in wanted:
            return True
        source = entry
    return any(id(node) in wanted for node in graph.reached(source, clears, iteration))
