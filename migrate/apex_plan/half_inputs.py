"""Whether a statement runs a forward pass that mixes float16 and float32, as apex's casts allowed.

A script feeding ``image = batch.half().cuda() / 255`` to its model trained under apex O1, whose
patched functions cast inputs to each op's precision: the float32 weights met float16 inputs
without complaint, in an evaluation too. Outside autocast, natively, the same pass raises
("Input type (c10::Half) and bias type (float) should be the same"): such a pass, in the
training loop or in the loop calling the training function, goes under autocast as the training
region does. Followed in the statement and in the file's functions it calls, name by name: a
name bound from a ``.half()`` (``.to(torch.float16)``, ``.type(torch.HalfTensor)``), or from one
such, handed to a model.

Under O1 the other way round too: a network the file casts to float16 itself (``copy =
copy.half()``, ``net.half()``) and then runs (``copy(x)``, ``torch.jit.trace(copy, x)``,
``torch.onnx.export(copy, ...)``) on float32 inputs, which apex's casts made float16
(``half_runs``; a tensor is never called, so what is run is a network).
"""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.hidden_readers import helpers_reached
from migrate.apex_plan.syntax import read_names
from migrate.apex_plan.tree import FileTree
from migrate.tree_walk import descendants

__all__ = ["fed_half", "half_runs"]

_HALF_DTYPES = frozenset({"torch.float16", "torch.half", "torch.cuda.HalfTensor", "torch.HalfTensor"})
# what runs the network it is given first: a trace or an export runs its forward pass
_RUNNERS = frozenset({"torch.jit.trace", "torch.jit.trace_module", "torch.onnx.export", "jit.trace", "onnx.export"})
# what returns the network it is called on: `net.cuda().half()` casts `net`
_RETURNS_ITSELF = frozenset({"cuda", "cpu", "eval", "train", "to", "float", "half"})


def fed_half(tree: FileTree, statement: cst.CSTNode, models: set[str], amp_calls: frozenset[int],
             every_network: frozenset[str] | None = None) -> bool:
    """Whether ``statement``, or a function of the file it calls, hands one of ``models`` a
    float16 tensor it made (``model(x.half())``, or through the names bound from one); with
    ``every_network`` (O1: apex cast every op), also whether it runs a network it cast to float16
    where apex is on (``_networks_cast``)."""
    return any(half_runs(tree, scope, models, every_network)
               for scope in (statement, *helpers_reached(tree, statement, amp_calls)))


def half_runs(tree: FileTree, scope: cst.CSTNode, models: set[str], every_network: frozenset[str] | None) -> list[cst.Call]:
    """The calls in ``scope``'s own code (not in a function defined in it) that hand one of
    ``models`` a float16 tensor, or (``every_network``) run a network the scope cast to float16."""
    halves = _half_names(scope)
    calls = [node for node in nodes.own_code(scope) if type(node) is cst.Call]
    found = [call for call in calls if _calls_a_model(call, models) and any(_is_half(arg.value, halves) for arg in call.args)]
    if every_network is not None:
        casts = _networks_cast(scope)
        found += [call for call in calls if call not in found and any(
            _runs(call, name) and _where_apex_is(tree, cast, call, every_network) for name, cast in casts)]
    return found


def _networks_cast(scope: cst.CSTNode) -> list[tuple[str, cst.CSTNode]]:
    """What ``scope`` casts to float16 (``copy = copy.half()``, ``net.cuda().half()`` in place),
    each with the statement casting it."""
    cast = []
    for node in nodes.own_code(scope):
        if type(node) is cst.Assign and _is_half(node.value, set()):
            cast += [(name, node) for target in node.targets for name in nodes.bound_texts(target.target)]
        elif type(node) is cst.Expr and _is_half(node.value, set()) and _receiver(node.value):
            cast.append((_receiver(node.value), node))
    return cast


def _where_apex_is(tree: FileTree, cast: cst.CSTNode, run: cst.Call, apex_tests: frozenset[str]) -> bool:
    """Whether ``cast`` happens wherever apex is on before ``run``: each ``if`` holding the cast
    and not the run tests apex's own flag (``apex_tests``). A cast under an option of the file's
    own (``if args.fp16_full_eval:``) suits the inputs it was made for (token ids), natively too."""
    return all(nodes.code(outer.test) in apex_tests for outer in tree.ancestors(cast)
               if type(outer) is cst.If and not tree.inside(run, outer))


def _runs(call: cst.Call, network: str) -> bool:
    """Whether ``call`` runs ``network``'s forward pass: calls it, its ``forward``, or traces or exports it."""
    func = nodes.code(call.func)
    if func in (network, f"{network}.forward"):
        return True
    return func in _RUNNERS and bool(call.args) and nodes.code(call.args[0].value) == network


def _receiver(expression: cst.BaseExpression) -> str:
    """``net`` for ``net.half()`` and ``net.cuda().half()``: what a cast in place casts; else ""."""
    while type(expression) is cst.Call and type(expression.func) is cst.Attribute \
            and expression.func.attr.value in _RETURNS_ITSELF:
        expression = expression.func.value
    return nodes.code(expression) if type(expression) in (cst.Name, cst.Attribute) else ""


def _half_names(scope: cst.CSTNode) -> set[str]:
    """The names ``scope`` binds to float16 tensors or networks (``image = batch.half()``)."""
    assigns = [node for node in nodes.own_code(scope) if type(node) is cst.Assign]
    halves: set[str] = set()
    changed = True
    while changed:  # `image = batch.half()`, then `image = image.unsqueeze(1)`
        changed = False
        for assign in assigns:
            if _is_half(assign.value, halves):
                bound = {name for target in assign.targets for name in nodes.bound_texts(target.target)} - halves
                if bound:
                    halves |= bound
                    changed = True
    return halves


def _calls_a_model(call: cst.Call, models: set[str]) -> bool:
    func = call.func
    return nodes.code(func) in models or (type(func) is cst.Attribute and func.attr.value == "forward"
                                          and nodes.code(func.value) in models)


def _is_half(expression: cst.BaseExpression, halves: set[str]) -> bool:
    """Whether ``expression`` makes a float16 tensor or reads a name bound to one."""
    if read_names(expression) & halves:
        return True
    for node in descendants(expression, nodes.not_a_definition):
        if type(node) is not cst.Call or type(node.func) is not cst.Attribute:
            continue
        name = node.func.attr.value
        if name == "half" or (name in ("to", "type") and any(nodes.code(arg.value) in _HALF_DTYPES for arg in node.args)):
            return True
    return False
