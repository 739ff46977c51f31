"""Statements that read gradients, and the scale-aware form of a gradient clip.

apex unscaled the gradients when ``scale_loss`` exited, so a clip or a norm taken after it saw
true gradients. Natively they stay multiplied by the scale until ``scaler.unscale_(optimizer)``,
which may run once per step. Where the step may not follow the read (a clip at every
micro-batch, the step every fourth), ``unscale_`` cannot go there; a clip can still be exact on
the scaled gradients: their norm is the true norm times the scale, so clipping them at
``max_norm * scale`` multiplies them by the same factor as clipping the true ones at ``max_norm``
(and the scale, a power of two, divides back exactly). ``clip_grad_value_`` likewise; and a
function of the project returning the gradients' norm (``migrate.grad_norms``) is exact divided
by the scale.
"""
from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.flow.bindings import bindings, bound_value
from migrate.tree_walk import descendants

# Words in a call's name that say "grad" of something other than the gradients' values: the flag
# (`set_requires_grad(nets, False)`, `toggle_grad(model, True)`), autograd's mode, the clearing.
_NOT_GRADIENT_VALUES = ("requires_grad", "toggle_grad", "no_grad", "enable_grad", "grad_enabled", "zero_grad")
# name -> the position and keyword of the threshold, and whether the call returns the norm
_CLIPS = {
    "clip_grad_norm_": (1, "max_norm", True),
    "clip_grad_norm": (1, "max_norm", True),
    "clip_grad_value_": (1, "clip_value", False),
}
# Where a value may stand as ``a / b`` without parentheses.
_LOOSE_PARENTS = (cst.Arg, cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Return, cst.Element, cst.DictElement)


def reads_grads(statement: cst.CSTNode, own_tensors: frozenset[str] = frozenset(), judged_apart: frozenset[int] = frozenset()) -> bool:
    """Clipping, gradient norms, ``p.grad``: anything that would see scaled gradients natively.
    The ``.grad`` of one of ``own_tensors`` (``own_leaf_tensors``) is no such read; nor is a call
    in ``judged_apart`` (a helper of the file, judged by its body rather than its name)."""
    return any(id(call) not in judged_apart for call in _grad_calls(statement)) or any(
        not (type(node.value) is cst.Name and node.value.value in own_tensors) for node in _grad_attributes(statement))


def own_leaf_tensors(function: cst.CSTNode) -> frozenset[str]:
    """The names ``function`` binds only to tensors it makes itself and asks gradients of, that no
    optimizer is given: an input perturbation (``delta = torch.zeros_like(x, requires_grad=True)``;
    ``delta = torch.zeros_like(x)`` then ``delta.requires_grad_()``; ``delta = (delta + step *
    grad).detach()``). apex unscaled only the optimizer's parameters' gradients as ``scale_loss``
    exited: their ``.grad`` stayed scaled, as it stays natively."""
    names = {target.target.value for node in descendants(function) if type(node) is cst.Assign and _made_here(node.value)
             for target in node.targets if type(target.target) is cst.Name}
    asked = {nodes.code(node.func.value) for node in descendants(function) if type(node) is cst.Call
             and type(node.func) is cst.Attribute and _asks_grad(node)}
    own = set()
    for name in names:
        values = [bound_value(binding, name) for binding in bindings(function, name)]
        if all(_made_here(value) for value in values) and (name in asked or any(_asks_grad(value) for value in values)) \
                and not _given_to_an_optimizer(function, name):
            own.add(name)
    return frozenset(own)


# Functions of torch that make a new tensor, and methods that give one apart from the graph.
_FACTORIES = frozenset({"zeros", "zeros_like", "ones", "ones_like", "empty", "empty_like", "rand", "rand_like", "randn",
                        "randn_like", "full", "full_like", "tensor", "clamp"})
_APART = frozenset({"detach", "requires_grad_", "clone", "uniform_", "normal_", "new_zeros", "new_empty", "new_ones"})
_MOVES = frozenset({"cuda", "to", "float", "half"})  # the same tensor on another device or in another dtype
# torch.autograd.grad's keywords: gradients computed afresh from ``grad_outputs``, which no loss scale touches
_FRESH_GRADIENT_KEYWORDS = frozenset({"outputs", "inputs", "grad_outputs", "only_inputs", "allow_unused", "create_graph"})


def _made_here(value: cst.CSTNode) -> bool:
    """A tensor made here: a factory's (``torch.zeros_like(x)``), a ``Variable`` (a leaf of its
    own), or one taken apart from the graph (``(delta + step).detach()``, ``.requires_grad_()``);
    also moved (``Variable(noise, requires_grad=True).cuda()``)."""
    if type(value) is not cst.Call:
        return False
    name = nodes.call_name(value)
    if name in _MOVES and type(value.func) is cst.Attribute:
        return _made_here(value.func.value)
    return name in _APART or name == "Variable" or (
        name in _FACTORIES and type(value.func) is cst.Attribute and nodes.code(value.func.value) == "torch")


def _asks_grad(call: cst.Call) -> bool:
    """``x.requires_grad_()`` (not ``(False)``), or a factory given ``requires_grad=True`` (then moved)."""
    if nodes.call_name(call) in _MOVES and type(call.func) is cst.Attribute and type(call.func.value) is cst.Call:
        return _asks_grad(call.func.value)
    if nodes.call_name(call) == "requires_grad_":
        return not any(nodes.code(arg.value) == "False" for arg in call.args)
    flag = nodes.argument(call, None, "requires_grad")
    return flag is not None and nodes.code(flag.value) == "True"


def _given_to_an_optimizer(function: cst.CSTNode, name: str) -> bool:
    """Whether ``name`` is handed to an optimizer (``SGD([delta])``, ``add_param_group``): then apex
    unscaled its gradient with the others'."""
    for call in descendants(function):
        if type(call) is not cst.Call:
            continue
        callee = nodes.code(call.func)
        if not ("optim" in callee.lower() or "param_group" in callee or callee.rsplit(".", 1)[-1][:1].isupper()):
            continue
        if any(type(node) is cst.Name and node.value == name for arg in call.args for node in descendants(arg)):
            return True
    return False


def scale_aware_clips(statement: cst.CSTNode, reads: Callable[[cst.CSTNode], bool] | None = None,
                      norms: frozenset[str] = frozenset()) -> list[cst.Call] | None:
    """The clip calls of ``statement``, and its calls of ``norms`` (functions returning the
    gradients' norm), when those are all it reads gradients with; else None.

    ``reads``, if given, also says which of a compound statement's lines read gradients out of
    sight (``if clip: clip_grad_norm_(...)`` / ``else: norm = total_norm(amp.master_params(opt))``,
    a helper of the file reading ``p.grad``): a clip aware of the scale does not cover such a line.
    """
    if reads is not None and not isinstance(statement, cst.SimpleStatementLine) and any(
            reads(line) and not scale_aware_clips(line, norms=norms) for line in descendants(statement)
            if isinstance(line, cst.SimpleStatementLine)):
        return None
    clips = [call for call in _grad_calls(statement) if nodes.call_name(call) in _CLIPS]
    if any(nodes.argument(call, _CLIPS[nodes.call_name(call)][0], _CLIPS[nodes.call_name(call)][1]) is None
           or nodes.has_star(call) for call in clips):
        return None
    clips += [call for call in _outside_definitions(statement, cst.Call) if _norm_call(call, norms)]
    if not clips:
        return None
    inside = {id(node) for call in clips for node in _subtree(call)}
    others = [node for node in (*_grad_calls(statement), *_grad_attributes(statement)) if id(node) not in inside]
    return None if others else clips


def _norm_call(call: cst.Call, norms: frozenset[str]) -> bool:
    """A call of a gradient norm (``get_grad_norm(params)``, ``get_grad_norm(params, 2)``): the
    parameters first, and only positive numbers (or ``inf``) beside them, as a norm's order."""
    if type(call.func) is not cst.Name or call.func.value not in norms or not call.args or call.args[0].keyword is not None:
        return False
    return not nodes.has_star(call) and all(_positive_order(arg.value) for arg in call.args[1:])


def _positive_order(value: cst.BaseExpression) -> bool:
    if isinstance(value, (cst.Integer, cst.Float)):
        return float(value.value.replace("_", "")) > 0
    return nodes.code(value) in ("inf", "math.inf", "float('inf')", 'float("inf")', "torch.inf", "np.inf")


def is_clip(call: cst.Call) -> bool:
    """Whether ``call`` clips (``scale_aware`` scales its threshold) rather than takes a norm."""
    return nodes.call_name(call) in _CLIPS


def scale_aware(call: cst.Call, scale: str, parent: cst.CSTNode | None, params: cst.BaseExpression | None,
                module: cst.Module) -> cst.BaseExpression:
    """``call`` clipping scaled gradients at its threshold times ``scale`` (an expression), its
    returned norm divided by ``scale`` where it is read; or, for a gradient norm (not a clip),
    that norm divided by ``scale``. ``params``, if given, replaces the parameters argument."""
    position, keyword, returns_norm = _CLIPS.get(nodes.call_name(call), (None, None, True))
    threshold = nodes.argument(call, position, keyword) if position is not None else None
    if threshold is not None:
        limit = nodes.code(threshold.value)
        if not isinstance(threshold.value, (cst.Name, cst.Attribute, cst.Subscript, cst.Call, cst.Integer, cst.Float)):
            limit = f"({limit})"
    args = []
    for arg in call.args:
        if threshold is not None and arg is threshold:
            arg = arg.with_changes(value=nodes.parse_expression(f"{limit} * {scale}", module))
        elif params is not None and arg is call.args[0]:
            arg = arg.with_changes(value=params)
        args.append(arg)
    new = call.with_changes(args=args)
    if not returns_norm or isinstance(parent, cst.Expr):
        return new
    divided = f"{nodes.code(new)} / {scale}"
    return nodes.parse_expression(divided if isinstance(parent, _LOOSE_PARENTS) else f"({divided})", module)


def names_a_gradient_flag(name: str) -> bool:
    """Whether a call so named says "grad" only of the ``requires_grad`` flag, autograd's mode or
    the clearing (``set_requires_grad``, ``toggle_grad``, ``no_grad``), never of the values."""
    name = name.lower()
    for words in _NOT_GRADIENT_VALUES:
        name = name.replace(words, "")
    return "grad" not in name and "clip" not in name


def _grad_calls(statement: cst.CSTNode) -> list[cst.Call]:
    def reads(name: str) -> bool:
        name = name.lower()
        return ("clip" in name or "grad" in name) and not names_a_gradient_flag(name)

    def fresh(call: cst.Call) -> bool:
        """``torch.autograd.grad(...)`` (or ``autograd.grad``, or an alias given its keywords)."""
        return nodes.code(call.func) in ("torch.autograd.grad", "autograd.grad") or bool(nodes.keyword_names(call) & _FRESH_GRADIENT_KEYWORDS)

    def clipper(call: cst.Call) -> bool:
        """A method of something named a clipper: ``grad_clipper.step(params)``."""
        receiver = call.func.value if type(call.func) is cst.Attribute else None
        while type(receiver) is cst.Attribute:
            receiver = receiver.attr
        return type(receiver) is cst.Name and "clip" in receiver.value.lower()

    return [call for call in _outside_definitions(statement, cst.Call) if (reads(nodes.call_name(call)) and not fresh(call)) or clipper(call)]


def _grad_attributes(statement: cst.CSTNode) -> list[cst.Attribute]:
    """``p.grad``; not a function so named, called (``torch.autograd.grad(...)``)."""
    called = {id(call.func) for call in _outside_definitions(statement, cst.Call)}
    return [node for node in _outside_definitions(statement, cst.Attribute) if node.attr.value == "grad" and id(node) not in called]


def _outside_definitions(statement: cst.CSTNode, kind: type) -> list:
    return [node for node in nodes.own_code(statement) if isinstance(node, kind)]


def _subtree(node: cst.CSTNode) -> list[cst.CSTNode]:
    return list(descendants(node))
