"""What a file says of the trainer frameworks that scale the loss themselves (Accelerate, Fabric,
Lightning), for the rules that judge a step run through one (AMP101, AMP109): the precision it
makes one with, the reads that see its gradients while still scaled, the optimizers it hands
one, the LightningModules that step by hand.

Each answer comes from the file's bindings (``flow.bindings``), read where the code spells the
value out; where it does not (``Accelerator(mixed_precision=args.precision)``), nothing is known.
"""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.flow.bindings import bindings, bound_value
from migrate.step_model import Backward, Event, Kind, Steps
from migrate.step_model import vocabulary as words
from migrate.tree_walk import descendants

# The precisions in which the framework scales the loss: Accelerate's `mixed_precision="fp16"`,
# Fabric's and Lightning's `precision="16-mixed"` (or the older `16`).
_SCALED_PRECISIONS = frozenset({"fp16", "16-mixed", "16"})
_PRECISION_KEYWORDS = ("mixed_precision", "precision")
# The calls that hand a model and its optimizer to a framework, which returns them wrapped.
_PREPARING = frozenset({"prepare", "prepare_optimizer", "setup", "setup_optimizers"})


def precision_without_scaler(module: cst.Module, runner: str) -> bool:
    """Whether every binding of ``runner`` (``accelerator``, ``self.fabric``) in the file makes it
    with a literal precision that scales nothing (``Accelerator(mixed_precision="bf16")``,
    ``Fabric(precision="bf16-mixed")``); False where any binding leaves it open."""
    values = [bound_value(binding, runner) for root in _scopes(module) for binding in bindings(root, runner, methods=True)]
    if not values:
        return False
    for value in values:
        given = [nodes.argument(value, None, key) for key in _PRECISION_KEYWORDS] if type(value) is cst.Call else []
        precision = next((argument for argument in given if argument is not None), None)
        literal = None if precision is None else _literal(_constant_value(module, precision.value))
        if literal is None or literal in _SCALED_PRECISIONS:
            return False
    return True


def scaled_by_a_framework(module: cst.Module, steps: Steps, read: Event) -> Event | None:
    """The backward pass of Accelerate, Fabric or Lightning (``accelerator.backward(loss)``,
    ``self.manual_backward(loss)``) whose gradients ``read`` sees before the optimizer steps,
    unless the read is the framework's own (``accelerator.clip_grad_norm_``, which unscales
    first) or the file makes the framework with a precision that scales nothing."""
    backwards = steps.before(read, (Kind.BACKWARD,))
    if not backwards or backwards[-1].how is not Backward.MANAGED:
        return None
    backward = backwards[-1]
    runner = backward.detail.get("runner")
    if not runner or words.scaling_framework(runner) is None:
        return None
    if runner == "self" and nodes.call_name(backward.node) != "manual_backward":
        return None  # `self.backward(scaler.scale(loss))` of a trainer class: its own, not Lightning's
    if any(steps.index(backward) < steps.index(other) < steps.index(read)
           for other in steps.before(read, (Kind.STEP, Kind.UNSCALE, Kind.SCALER_STEP))):
        return None  # read after a step or an `unscale_`: the gradients are unscaled
    call = read.node
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and (
            nodes.code(call.func.value) == runner or nodes.call_name(call) == "clip_gradients"):
        return None  # `accelerator.clip_grad_norm_(...)`, `self.clip_gradients(opt, ...)`: unscales first
    if precision_without_scaler(module, runner):
        return None
    return backward


def prepared_optimizers(module: cst.Module) -> dict[str, str]:
    """The names the file binds to what a framework returns for an optimizer, each with what
    prepared it: ``model, optimizer = accelerator.prepare(model, optimizer)`` gives
    ``{"optimizer": "accelerator"}``; ``opt = fabric.setup_optimizers(opt)`` gives
    ``{"opt": "fabric"}``. Only a framework's own receiver counts (``accelerator``, ``fabric``)."""
    found: dict[str, str] = {}
    for node in descendants(module):
        if type(node) is not cst.Assign or type(node.value) is not cst.Call or len(node.targets) != 1:
            continue
        call, target = node.value, node.targets[0].target
        if nodes.call_name(call) not in _PREPARING or type(call.func) is not cst.Attribute:
            continue
        runner = nodes.code(call.func.value)
        if runner == "self" or words.scaling_framework(runner) is None:
            continue
        given = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        targets = [e.value for e in target.elements] if type(target) in (cst.Tuple, cst.List) else [target]
        for bound, argument in zip(targets, given if len(given) == len(targets) else [None] * len(targets)):
            text = nodes.code(bound)
            if words.optimizer_like(text) or (argument is not None and words.optimizer_like(nodes.code(argument))):
                found[text] = runner
    return found


def steps_by_hand(module: cst.Module) -> set[int]:
    """The classes (by id) that switch Lightning's automatic optimisation off
    (``self.automatic_optimization = False``): their steps are written by hand."""
    return {id(klass) for klass in descendants(module) if type(klass) is cst.ClassDef
            for binding in bindings(klass, "self.automatic_optimization", methods=True)
            if nodes.code(bound_value(binding, "self.automatic_optimization")) == "False"}


def _scopes(module: cst.Module) -> list[cst.CSTNode]:
    """The module and each class: ``bindings`` enters the functions of one, not its classes."""
    return [module, *(node for node in descendants(module) if type(node) is cst.ClassDef)]


def _constant_value(module: cst.Module, value: cst.BaseExpression) -> cst.BaseExpression:
    """What a module constant (``PRECISION = "bf16-mixed"``) named by ``value`` is bound to, where
    the module binds it once and nothing in the file binds it again; else ``value``."""
    if type(value) is not cst.Name:
        return value
    at_top = bindings(module, value.value)  # `bindings` at the module enters no function: its top level
    anywhere = [node for node in descendants(module) if type(node) in (cst.Global, cst.Nonlocal)
                and any(name.name.value == value.value for name in node.names)]
    if len(at_top) != 1 or anywhere:
        return value
    return bound_value(at_top[0], value.value)


def _literal(node: cst.BaseExpression) -> str | None:
    if type(node) is cst.Integer:
        return node.value
    return nodes.literal_string(node)
