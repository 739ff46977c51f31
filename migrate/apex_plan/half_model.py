"""A model the file casts to float16 itself, where no option asks for it (``model.half()``)."""
from __future__ import annotations

import re

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.step_model.vocabulary import dtype_of, model_like
from migrate.tree_walk import children

__all__ = ["model_made_half"]


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
