"""Where a handed-on value is read: ``f(amp=amp)`` to ``def f(..., amp=None)`` in the same file
(or to ``def f(path, **objects)``, through ``objects["amp"]`` and its loops over ``objects.items()``),
``self.amp = amp`` to every ``self.amp`` of its class, followed through further hand-ons.

``receivers(...)`` answers with every read, classified by what it does with the value (calls a
method, tests it against ``None`` or for truth, hands it on again), or with ``None`` where the
value escapes what the file shows: a callee defined elsewhere or more than once, a receiving
parameter rebound, the value stored in a container or returned. A rewrite that puts another
object in the value's place is exact when every method the reads call exists on that object.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.tree_walk import descendants

DEPTH = 3  # hand-ons followed through this many functions or attributes


class Read(NamedTuple):
    node: cst.CSTNode  # the Name or Attribute that reads the value
    method: str | None  # the method called on it (``amp.load_state_dict(...)``), None for a test


def receivers(
    module: cst.Module,
    parent: Mapping[int, cst.CSTNode],
    value: cst.CSTNode,
    *,
    depth: int = DEPTH,
) -> list[Read] | None:
    """Every read of what ``value`` (an argument's or an assignment's value) hands on; None where
    the file does not show them all."""
    up = parent.get
    holder = up(id(value))
    if isinstance(holder, cst.IfExp) and _is_none(holder.orelse if holder.body is value else holder.body):
        value, holder = holder, up(id(holder))  # `amp if fp16 else None`: None still means "off"
    if depth == 0:
        return None
    if isinstance(holder, cst.Arg) and holder.value is value:
        taken = parameter_taking(module, parent, holder)
        if taken is None:
            uses = _taken_by_keywords(module, parent, holder)
            return None if uses is None else _classified(module, parent, uses, depth, lambda node: False)
        function, name = taken
        return _classified(module, parent, _name_uses(parent, function.body, name), depth, lambda node: False)
    if isinstance(holder, cst.Assign) and holder.value is value and len(holder.targets) == 1:
        target = holder.targets[0].target
        if not (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self"):
            return None
        klass = _enclosing(parent, holder, cst.ClassDef)
        if klass is None:
            return None
        attribute = target.attr.value
        uses = [node for node in descendants(klass) if type(node) is cst.Attribute and node.attr.value == attribute
                and isinstance(node.value, cst.Name) and node.value.value == "self" and node is not target]
        return _classified(module, parent, uses, depth, lambda node: _gets_none(parent, node))
    return None


def parameter_taking(module: cst.Module, parent: Mapping[int, cst.CSTNode], arg: cst.Arg) -> tuple[cst.FunctionDef, str] | None:
    """The same-file function a call hands ``arg`` to, and the parameter that takes it (by
    keyword, or by position: ``self.f(x)`` skips ``self``); None where the file does not say."""
    call = parent.get(id(arg))
    function = _callee(module, parent, call) if isinstance(call, cst.Call) else None
    if function is None or arg.star:
        return None
    params = function.params
    if arg.keyword is not None:
        name = arg.keyword.value
        return (function, name) if any(p.name.value == name for p in (*params.params, *params.kwonly_params)) else None
    before = call.args[: call.args.index(arg)]
    if any(other.keyword is not None or other.star for other in before):
        return None
    positional = [*params.posonly_params, *params.params]
    if isinstance(call.func, cst.Attribute):  # `obj.f(x)`: a method, whose first parameter is `self`
        positional = positional[1:]
    return (function, positional[len(before)].name.value) if len(before) < len(positional) else None


def _taken_by_keywords(module: cst.Module, parent: Mapping[int, cst.CSTNode], arg: cst.Arg) -> list[cst.CSTNode] | None:
    """Where ``f(..., amp=amp)`` reaches ``def f(path, **objects)``: what stands for the value in
    ``f`` (``objects["amp"]``, ``objects.get("amp")``, the item of ``for key, obj in
    objects.items()`` or ``for obj in objects.values()``, which every keyword's value passes
    through); None where ``objects`` is read any other way (handed on, stored, indexed by a variable)."""
    call = parent.get(id(arg))
    function = _callee(module, parent, call) if isinstance(call, cst.Call) else None
    if function is None or arg.keyword is None or arg.star or not isinstance(function.params.star_kwarg, cst.Param):
        return None
    if any(p.name.value == arg.keyword.value for p in (*function.params.params, *function.params.kwonly_params)):
        return None
    key = arg.keyword.value
    found: list[cst.CSTNode] = []
    for use in _name_uses(parent, function.body, function.params.star_kwarg.name.value):
        outer = parent.get(id(use))
        method = outer.attr.value if isinstance(outer, cst.Attribute) and outer.value is use else None
        call = parent.get(id(outer))
        if isinstance(outer, cst.Subscript) and len(outer.slice) == 1 and isinstance(outer.slice[0].slice, cst.Index):
            if nodes.literal_string(outer.slice[0].slice.value) == key:
                found.append(outer)
            elif nodes.literal_string(outer.slice[0].slice.value) is None:
                return None
        elif method == "get" and isinstance(call, cst.Call) and call.args:
            if nodes.literal_string(call.args[0].value) == key:
                found.append(call)
            elif nodes.literal_string(call.args[0].value) is None:
                return None
        elif method in ("items", "values") and isinstance(call, cst.Call) and not call.args:
            loop = parent.get(id(call))
            if not (isinstance(loop, cst.For) and loop.iter is call):
                return None
            target = loop.target
            if method == "items":
                if not (isinstance(target, cst.Tuple) and len(target.elements) == 2):
                    return None
                target = target.elements[1].value
            if not isinstance(target, cst.Name):
                return None
            found += _name_uses(parent, loop.body, target.value)
        elif not (isinstance(outer, cst.Comparison) and any(isinstance(c.operator, (cst.In, cst.NotIn)) for c in outer.comparisons)):
            return None  # `"amp" in objects` only asks what was given
    return found


def _name_uses(parent, body: cst.CSTNode, name: str) -> list[cst.Name]:
    """The names ``name`` in ``body`` that stand for a variable (not ``x.name``, nor ``f(name=...)``)."""
    uses = []
    for node in descendants(body):
        if type(node) is cst.Name and node.value == name:
            outer = parent.get(id(node))
            if not (isinstance(outer, cst.Attribute) and outer.attr is node or isinstance(outer, cst.Arg) and outer.keyword is node):
                uses.append(node)
    return uses


def _classified(module, parent, uses, depth, may_be_assigned: Callable[[cst.CSTNode], bool]) -> list[Read] | None:
    up = parent.get
    reads: list[Read] = []
    for use in uses:
        outer = up(id(use))
        if isinstance(outer, cst.Attribute) and outer.value is use:
            call = up(id(outer))
            if not (isinstance(call, cst.Call) and call.func is outer):
                return None
            reads.append(Read(use, outer.attr.value))
        elif _tested(parent, use):
            reads.append(Read(use, None))
        elif isinstance(outer, cst.Arg) and outer.value is use:
            further = receivers(module, parent, use, depth=depth - 1)
            if further is None:
                return None
            reads += further
        elif isinstance(outer, cst.IfExp) and outer.body is use and _is_none(outer.orelse):
            further = receivers(module, parent, use, depth=depth - 1)
            if further is None:
                return None
            reads += further
        elif isinstance(outer, (cst.AssignTarget, cst.Param)) or (isinstance(outer, cst.Assign) and may_be_assigned(use)):
            if not may_be_assigned(use):
                return None  # the receiving name is given something else
        else:
            return None
    return reads


def _tested(parent, node: cst.CSTNode) -> bool:
    """``x is None``, ``x is not None``, ``if x:``, ``not x``, ``x and ...``, ``a if x else b``."""
    outer = parent.get(id(node))
    if isinstance(outer, cst.Comparison) and outer.left is node and len(outer.comparisons) == 1:
        target = outer.comparisons[0]
        return isinstance(target.operator, (cst.Is, cst.IsNot)) and _is_none(target.comparator)
    if isinstance(outer, (cst.If, cst.While)) and outer.test is node:
        return True
    if isinstance(outer, cst.IfExp) and outer.test is node:
        return True
    if isinstance(outer, cst.UnaryOperation) and isinstance(outer.operator, cst.Not):
        return True
    return isinstance(outer, cst.BooleanOperation) and _tested_boolean(parent, outer)


def _tested_boolean(parent, operation: cst.BooleanOperation) -> bool:
    outer = parent.get(id(operation))
    if isinstance(outer, cst.BooleanOperation):
        return _tested_boolean(parent, outer)
    return isinstance(outer, (cst.If, cst.While, cst.IfExp)) and outer.test is operation or (
        isinstance(outer, cst.UnaryOperation) and isinstance(outer.operator, cst.Not))


def _gets_none(parent, target: cst.CSTNode) -> bool:
    """Whether ``target`` is assigned ``None`` (the value switched off)."""
    assign_target = parent.get(id(target))
    assign = parent.get(id(assign_target))
    return isinstance(assign_target, cst.AssignTarget) and isinstance(assign, cst.Assign) and _is_none(assign.value)


def _callee(module: cst.Module, parent, call: cst.Call) -> cst.FunctionDef | None:
    """The function ``call`` calls: ``f(...)``, a module-level ``def f``; ``obj.f(...)``, the one
    method ``f`` of the file's classes (``self.f``, or a trainer the file made). None where the
    file has none, or several."""
    func = call.func
    if isinstance(func, cst.Name):
        found = _definitions(module, func.value)
        return found[0] if len(found) == 1 and not _enclosing(parent, found[0], cst.ClassDef) else None
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
        found = _definitions(module, func.attr.value)
        return found[0] if len(found) == 1 and _enclosing(parent, found[0], cst.ClassDef) else None
    return None


def _definitions(module: cst.Module, name: str) -> list[cst.FunctionDef]:
    return [node for node in descendants(module) if type(node) is cst.FunctionDef and node.name.value == name]


def _enclosing(parent, node: cst.CSTNode, kind: type) -> cst.CSTNode | None:
    node = parent.get(id(node))
    while node is not None and not isinstance(node, kind):
        node = parent.get(id(node))
    return node


def _is_none(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"
