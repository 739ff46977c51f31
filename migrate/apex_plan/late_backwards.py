"""Plain backward passes after the scaled step: a second loss stepped by another optimizer
(``stop_loss.backward(); stop_optimizer.step()`` after ``optimizer.step()``). Apex left their
gradients as they were, and so does the scaler, as long as none of them is still there when it
unscales: every way from the plain pass to a scaled optimizer's step, within the iteration and
round the loop into the next one, passes a ``zero_grad()`` that clears them first; or they never
land there: its loss comes from a network built apart from the models (a discriminator) and
from their outputs only detached."""
from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.syntax import assigned_names, calls, read_names
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import ScaleLossSite
from migrate.flow.control import Graph
from migrate.names import qualified_names
from migrate.tree_walk import descendants

if TYPE_CHECKING:
    from migrate.apex_plan.steps import StepPlanning


def uncleared_plain_backward(steps: StepPlanning, scale: ScaleLossSite, found: list[tuple]) -> str | None:
    """Why the rewrite of ``scale`` may train differently because of a plain backward pass that
    can run in the same pass (``StepPlanning.plain_backwards``) and whose gradients may reach
    the scaled optimizers' steps ``found``; None where there is none."""
    stepped = [line for line, *_ in found]
    for plain in steps.plain_backwards(beside=scale.statement):
        if gradients_land_apart(steps.tree, plain, steps.conditions.clearers()):
            continue
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


def gradients_land_apart(tree: FileTree, plain: cst.Call, clearers: frozenset[str]) -> bool:
    """Whether the plain pass ``plain`` (``critic_loss.backward()``) gives gradients only to networks
    apart from ``clearers`` (the scaled optimizers, the models ``initialize`` was given): the lines
    just before it that compute its loss read nothing but what they bind, imported names, networks
    the file builds from none of the models (``critic = nn.Sequential(...)``) and, detached, anything
    (``fake = model(x).detach()``)."""
    receiver = plain.func.value if isinstance(plain.func, cst.Attribute) else None
    statement = tree.statement(plain)
    block = tree.parent.get(id(statement))
    if type(receiver) is not cst.Name or not isinstance(block, cst.IndentedBlock):
        return False
    index = next(at for at, line in enumerate(block.body) if line is statement)
    wanted, lines = {receiver.value}, []
    for line in reversed(block.body[:index]):
        if assigned_names(line) & wanted:
            if type(line) is not cst.SimpleStatementLine:
                return False  # bound in an arm or a loop: left to the clearing test
            lines.append(line)
            wanted |= {node.value for node in _gradient_reads(tree, line)}
    bound = {name for line in lines for name in assigned_names(line)} | _loop_targets(tree, statement)
    return bool(lines) and all(
        qualified_names(tree.provider, node) or (text := _reference_text(tree, node)) in bound
        or _built_apart(tree, text, clearers) for line in lines for node in _gradient_reads(tree, line))


def _loop_targets(tree: FileTree, statement: cst.CSTNode) -> set[str]:
    """The names the ``for`` loops around ``statement`` bind: a batch, which carries no graph."""
    found, node = set(), statement
    while (node := tree.parent.get(id(node))) is not None and not isinstance(node, cst.FunctionDef):
        if type(node) is cst.For:
            found.update(nodes.bound_texts(node.target))
    return found


def _gradient_reads(tree: FileTree, line: cst.CSTNode) -> list[cst.Name]:
    """The names ``line`` reads that a gradient may go back through: not detached first."""
    return [node for node in descendants(line, nodes.not_a_definition)
            if type(node) is cst.Name and _is_a_reference(tree, node) and not _detached(tree, node)]


def _is_a_reference(tree: FileTree, name: cst.Name) -> bool:
    """Not an attribute's name (``nn.Linear``'s ``Linear``), a keyword or an assignment's target."""
    parent = tree.parent.get(id(name))
    if isinstance(parent, cst.Attribute) and parent.attr is name:
        return False
    if isinstance(parent, cst.Arg) and parent.keyword is name:
        return False
    return not (isinstance(parent, cst.AssignTarget) and parent.target is name)


def _reference_text(tree: FileTree, name: cst.Name) -> str:
    """The name with the attributes read off it (``self.critic`` for ``self``)."""
    node = name
    while isinstance(parent := tree.parent.get(id(node)), cst.Attribute) and parent.value is node \
            and not isinstance(tree.parent.get(id(parent)), cst.Call):
        node = parent
    return nodes.code(node)


def _detached(tree: FileTree, node: cst.CSTNode) -> bool:
    """Whether ``node`` is read inside the receiver of a ``.detach()`` (no gradient goes back through it)."""
    while (parent := tree.parent.get(id(node))) is not None and not isinstance(parent, cst.BaseStatement):
        if type(parent) is cst.Attribute and parent.value is node and parent.attr.value == "detach" \
                and type(tree.parent.get(id(parent))) is cst.Call:
            return True
        node = parent
    return False


def _built_apart(tree: FileTree, network: str, clearers: frozenset[str]) -> bool:
    """Whether ``network`` is a network the file makes only by calls reading no other network
    (``critic = nn.Sequential(...).cuda()``, ``critic = critic.to(device)``): its parameters are
    its own, none of the models'."""
    if network not in tree.networks or network in clearers:
        return False
    others = (tree.networks | clearers) - {network}
    made = [node.value for node in descendants(tree.module) if type(node) is cst.Assign
            and any(nodes.code(target.target) == network for target in node.targets)]
    return bool(made) and all(type(value) is cst.Call and not read_names(value) & others for value in made)
