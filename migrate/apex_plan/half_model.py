"""A model the file casts to float16 itself, where no option asks for it (``model.half()``)."""
from __future__ import annotations

import re
from collections.abc import Mapping

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.vocabulary import Unplannable
from migrate.step_model.vocabulary import dtype_of, model_like
from migrate.tree_walk import children, descendants

__all__ = ["cast_to_half", "half_tensor_optimized", "model_made_half"]


def cast_to_half(module: cst.Module, helpers: Mapping[str, str]) -> Unplannable | None:
    """Why the file cannot be migrated where it casts its model to float16: itself (``model.half()``,
    see ``model_made_half``), or by handing it to a function of another file that casts modules
    (``model.apply(set_bn_eval)``, ``migrate.half_helpers``); None where it does neither."""
    half = model_made_half(module)
    if half is not None:  # a float16 model fed float32 outside autocast raises: not even an unsafe rewrite
        if not model_like(nodes.code(half.func.value), set()):  # `param.data = param.data.half()`
            return Unplannable(half, f"`{nodes.code(half)}` makes a parameter float16: its gradients are float16, which "
                                     "apex stepped and `GradScaler.unscale_` refuses (\"Attempting to unscale FP16 gradients\")")
        return Unplannable(half, f"`{nodes.code(half)}` casts a model to float16: after `amp.initialize` apex's casts "
                                 "let it take float32 inputs in any forward pass (an evaluation pass too); native "
                                 "autocast covers only the forward passes a rewrite puts under it")
    for node in descendants(module) if helpers else ():
        if type(node) is cst.Call and (name := _handed_to(node, helpers)) is not None:
            return Unplannable(node, f"`{nodes.code(node)}` casts modules to float16 (`{name}` at {helpers[name]}): "
                                     "their gradients are float16, which apex O1 stepped and `GradScaler.unscale_` refuses")
    found = half_tensor_optimized(module)
    if found is not None:
        optimizer, name, made = found
        return Unplannable(optimizer, f"the optimizer steps `{name}`, made as `{nodes.code(made)}`, which may be float16: "
                                      "apex O1 stepped float16 tensors, `GradScaler.unscale_` refuses their gradients "
                                      "(\"Attempting to unscale FP16 gradients\")")
    return None


def half_tensor_optimized(module: cst.Module) -> tuple[cst.Call, str, cst.CSTNode] | None:
    """An optimizer made over a list of the file's own tensors (``optim.Adam([inputs], lr=...)``),
    one of them made in a precision that may be float16 (``torch.randn(..., dtype=data_type)``,
    ``.half()``, ``.to(torch.float16)``): the optimizer's call, the tensor's name and what made
    it. A ``dtype=`` known to be float32 (``torch.float``) makes no such tensor."""
    made = {}
    for node in descendants(module):
        if type(node) is cst.Assign and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            cast = next((call for call in descendants(node.value) if type(call) is cst.Call and _maybe_half(call)), None)
            if cast is not None:
                made[node.targets[0].target.value] = cast
    for node in descendants(module) if made else ():
        if type(node) is cst.Call and node.args and type(node.args[0].value) is cst.List and _names_a_class(node.func):
            for element in node.args[0].value.elements:
                if isinstance(element.value, cst.Name) and element.value.value in made:
                    return node, element.value.value, made[element.value.value]
    return None


_NAMED_DTYPE = re.compile(r"torch\.\w+|[\"']\w+[\"']|float|int|bool")  # a dtype spelled out, not read from a variable


def _maybe_half(call: cst.Call) -> bool:
    """A call that may make a float16 tensor: ``dtype=`` float16 or read from a variable
    (``dtype=data_type``), ``.half()``, ``.to(torch.float16)``."""
    if any(arg.keyword is not None and arg.keyword.value == "dtype"
           and (dtype_of(arg.value) == "float16" or not _NAMED_DTYPE.fullmatch(nodes.code(arg.value)))
           for arg in call.args):
        return True
    if isinstance(call.func, cst.Attribute):
        name = call.func.attr.value
        return name == "half" or (name in ("to", "type") and any(dtype_of(arg.value) == "float16" for arg in call.args))
    return False


def _names_a_class(func: cst.BaseExpression) -> bool:
    """``optim.Adam``, ``torch.optim.SGD``, ``Adam``: a class, as optimizers are named."""
    name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
    return name[:1].isupper()


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
    if isinstance(node, cst.Call) and not optioned and _to_half(node):
        receiver = node.func.value
        if isinstance(receiver, (cst.Name, cst.Attribute)) and model_like(nodes.code(receiver), set()):
            yield node
    if isinstance(node, cst.Assign) and not optioned and isinstance(node.value, cst.Call) and _to_half(node.value) and any(
            isinstance(target.target, cst.Attribute) and target.target.attr.value == "data" for target in node.targets):
        yield node.value  # a parameter's data made float16 (`param.data = param.data.to(torch.float16)`)
    if isinstance(node, cst.If) and _PRECISION_OPTION.search(nodes.code(node.test)):
        yield from _half_casts(node.body, True)
        if node.orelse is not None:
            yield from _half_casts(node.orelse, optioned)
        return
    for child in children(node):
        yield from _half_casts(child, optioned)


def _to_half(call: cst.Call) -> bool:
    """``x.half()``, ``x.to(torch.float16)``, ``x.to(dtype=torch.half)``, ``x.type(torch.cuda.HalfTensor)``."""
    if not isinstance(call.func, cst.Attribute):
        return False
    name = call.func.attr.value
    if name == "half":
        return True
    if name == "to":
        return any(dtype_of(arg.value) == "float16" for arg in call.args)
    return name == "type" and any(nodes.code(arg.value).endswith("HalfTensor") for arg in call.args)

