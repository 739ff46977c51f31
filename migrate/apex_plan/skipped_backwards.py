"""Whether a backward pass surely runs between an optimizer's ``zero_grad()`` and its step.

Where ``amp.scale_loss`` is not next to the step it feeds (``self.backward_D(); self.optimizer_D.step()``),
the step goes through the scaler. ``GradScaler.step`` raises where nothing was scaled for the
optimizer since the last ``update()`` ("No inf checks were recorded for this optimizer"), while
apex's step stepped whatever the optimizer held, or nothing. So the step keeps apex's plain path
where a backward pass may have been skipped: under a threshold test (``if loss_D >= threshold:``),
or in a helper whose body returns early. A ``for`` loop is taken to run at least once.

Answered on each function's control-flow graph: a way from the start of the step's function,
or from a ``zero_grad()`` in it, to the step that runs no backward pass, nor a call of the file's
own function that always runs one, skips it. Where that way starts at the function's start, the
function's callers are asked the same of their call; a function the file never calls is taken to
be called after a backward pass, as an engine's ``step()`` is. Any backward counts, whichever optimizer
it feeds: the question is only whether the step needs a test at run time, which asks for the
gradients themselves.
"""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.tree import FileTree

__all__ = ["backward_runs_before"]

_DEPTH = 4  # calls followed from the step to a function running the backward, and from callers


def backward_runs_before(tree: FileTree, line: cst.CSTNode) -> bool:
    """Whether every way to ``line`` (a step) runs a backward pass after the last ``zero_grad()``
    on it and after the start of the training it belongs to."""
    return _runs_before(tree, tree.statement(line), 0)


def _runs_before(tree: FileTree, statement: cst.CSTNode, depth: int) -> bool:
    graph = tree.control_flow(statement, exceptions=False)
    if not graph.holds(statement) or depth > _DEPTH:
        return False
    function = tree.function(tree.parent.get(id(statement)))
    scope = function or tree.module
    targets = _running_backward(tree, graph, scope, depth)
    zero_grads = [call for call in _own_calls(scope) if nodes.call_name(call) == "zero_grad"]
    clears = [tree.statement(call) for call in zero_grads if not tree.inside(call, statement)]
    if any(_reaches_around(graph, source, statement, targets) for source in clears if graph.holds(source)):
        return False
    if isinstance(statement, cst.For) and len(clears) < len(zero_grads) and _back_around(graph, statement, targets):
        return False  # `for o in optimizers: o.step(); o.zero_grad()`, and round the training loop to it
    if not _reaches_around(graph, graph.entry, statement, targets):
        return True
    if function is None:
        return False
    # a method no code of the file calls (an engine's `step()`) is called, as designed, after the
    # caller's backward pass: only a skip seen inside the file counts
    return all(_runs_before(tree, tree.statement(call), depth + 1) for call in tree.calls_of(function))


def _always_runs_backward(tree: FileTree, function: cst.FunctionDef, depth: int) -> bool:
    """Whether every way through ``function`` runs a backward pass (a raise is no way through)."""
    if depth > _DEPTH or not isinstance(function.body, cst.IndentedBlock):
        return False
    graph = tree.control_flow(function.body, exceptions=False)
    targets = _running_backward(tree, graph, function, depth)
    entry = graph.entry
    return isinstance(entry, cst.CSTNode) and (any(entry is target for target in targets) or graph.always_reaches(entry, targets))


def _running_backward(tree: FileTree, graph, scope: cst.CSTNode, depth: int) -> list[cst.CSTNode]:
    """The statements of ``scope`` that run a backward pass: one of their own, a call of the
    file's own function that always does, or a ``for`` loop whose every iteration does (taken
    to run at least once: micro-batches, ``for i in range(accumulate_every):``)."""
    held = []
    for call in _own_calls(scope):
        helper = tree.helper(call)  # a trainer's own `self.backward(loss)` is asked, not taken for a tensor's
        own = helper is None and nodes.call_name(call) == "backward" and isinstance(call.func, cst.Attribute)
        if own or (helper is not None and helper is not scope and _always_runs_backward(tree, helper, depth + 1)):
            statement = tree.statement(call)
            if graph.holds(statement):
                held.append(statement)
    loops = [node for node in nodes.own_code(scope) if type(node) is cst.For and graph.holds(node)]
    for loop in sorted(loops, key=lambda node: -len(graph.loops_around(node))):  # inner loops first
        first = loop.body.body[0] if isinstance(loop.body, cst.IndentedBlock) else None
        if first is not None and graph.holds(first) and (any(first is target for target in held) or not any(
                not _returns(last) for last, _ in graph.ways_out(first, held, within=loop))):
            held.append(loop)
    return held


def _own_calls(scope: cst.CSTNode) -> list[cst.Call]:
    return [node for node in nodes.own_code(scope) if type(node) is cst.Call]


def _reaches_around(graph, source, statement: cst.CSTNode, targets: list[cst.CSTNode]) -> bool:
    """Whether some way from ``source`` (itself run) reaches ``statement`` before any of ``targets``."""
    if not isinstance(source, cst.CSTNode) or any(source is target for target in targets):
        return False
    return source is statement or any(node is statement for node in graph.reached(source, targets))


def _back_around(graph, loop: cst.For, targets: list[cst.CSTNode]) -> bool:
    """Whether a way out of ``loop`` (the step's own loop, clearing each optimizer it steps) comes
    back to it, round a loop around it, before any of ``targets``."""
    body = list(loop.body.body) if isinstance(loop.body, cst.IndentedBlock) else []
    return any(node is loop for node in graph.reached(loop, [*targets, *body[:1]]))


def _returns(line) -> bool:
    """Whether the way ends at ``line`` by returning: it leaves the function, and no step follows it there."""
    return isinstance(line, cst.SimpleStatementLine) and any(isinstance(small, cst.Return) for small in line.body)
