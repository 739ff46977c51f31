"""A model the file casts to float16 itself, where no option asks for it (``model.half()``)."""
from __future__ import annotations

import re
from collections.abc import Mapping

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.vocabulary import Unplannable
from migrate.step_model.vocabulary import dtype_of, model_like
from migrate.tree_walk import children, descendants

__all__ = ["cast_to_half", "model_made_half"]


def cast_to_half(module: cst.Module, helpers: Mapping[str, str]) -> Unplannable | None:
    """Why the file cannot be migrated where it casts its model to float16: itself (``model.half()``,
    see ``model_made_half``), or by handing it to a function of another file that casts modules
    (``model.apply(set_bn_eval)``, ``migrate.half_helpers``); None where it does neither."""
    half = model_made_half(module)
    if half is not None:  # a float16 model fed float32 outside autocast raises: not even an unsafe rewrite
        return Unplannable(half, f"`{nodes.code(half)}` casts a model to float16: after `amp.initialize` apex's casts "
                                 "let it take float32 inputs in any forward pass (an evaluation pass too); native "
                                 "autocast covers only the forward passes a rewrite puts under it")
    for node in descendants(module) if helpers else ():
        if type(node) is cst.Call and (name := _handed_to(node, helpers)) is not None:
            return Unplannable(node, f"`{nodes.code(node)}` casts modules to float16 (`{name}` at {helpers[name]}): "
                                     "their gradients are float16, which apex O1 stepped and `GradScaler.unscale_` refuses")
    return None


def _handed_to(call: cst.Call, helpers: Mapping[str, str]) -> str | None:
    """``model.apply(set_bn_eval)`` or ``set_bn_eval(model)``: the helper's name."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "apply" and call.args:
        handed = call.args[0].value
        return handed.value if isinstance(handed, cst.Name) and handed.value in helpers else None
    return func.value if isinstance(func, cst.Name) and func.value in helpers and call.args else None


def model_made_half(module: cst.Module) -> cst.Call | None:
    """The first ``model.half()`` (or ``net.to(torch.float16)``) of the file that no option asks
    for: a float16 model that apex's O1 casts fed float32 inputs wherever it ran (an evaluation
    pass too). One under an ``if`` on a float16 option (``if args.fp16_full_eval:``) is the
    option's own choice, made for inputs it suits."""
    return next(_half_casts(module, optioned=False), None)


_PRECISION_OPTION = re.compile(r"fp16|half|float16|bf16", re.IGNORECASE)


def _half_casts(node: cst.CSTNode, optioned: bool):
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and not optioned:
        name, receiver = node.func.attr.value, node.func.value
        to_half = name == "half" or (name == "to" and any(dtype_of(arg.value) == "float16" for arg in node.args))
        if to_half and isinstance(receiver, (cst.Name, cst.Attribute)) and model_like(nodes.code(receiver), set()):
            yield node
    if isinstance(node, cst.If) and _PRECISION_OPTION.search(nodes.code(node.test)):
        yield from _half_casts(node.body, True)
        if node.orelse is not None:
            yield from _half_casts(node.orelse, optioned)
        return
    for child in children(node):
        yield from _half_casts(child, optioned)
